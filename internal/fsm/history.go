package fsm

// RemovedHistoryLimit is how many grant records of removed locks the state
// keeps, over all names: a lock that nothing holds, waits for or delays is
// removed, and its records move here, so that `tenure lock history NAME`
// still explains a late write after the name fell out of use. The oldest
// records are dropped first.
const RemovedHistoryLimit = 10_000

// pastRec is a grant record of a removed lock.
type pastRec struct {
	name string
	histRec
}

// pastHistory is a ring of the most recent grant records of removed
// locks, with a count per name so that a read of a name that has none
// costs nothing.
type pastHistory struct {
	recs  []pastRec // ring; recs[next] is the oldest once full
	next  int
	count map[string]int
}

// add appends the records of the removed lock name, oldest first.
func (p *pastHistory) add(name string, recs []histRec) {
	if p.count == nil {
		p.count = make(map[string]int)
	}
	for _, r := range recs {
		rec := pastRec{name: name, histRec: r}
		if len(p.recs) < RemovedHistoryLimit {
			p.recs = append(p.recs, rec)
		} else {
			old := p.recs[p.next].name
			if p.count[old]--; p.count[old] == 0 {
				delete(p.count, old)
			}
			p.recs[p.next] = rec
			p.next = (p.next + 1) % len(p.recs)
		}
		p.count[name]++
	}
}

// each calls fn for every record, oldest first.
func (p *pastHistory) each(fn func(pastRec)) {
	for i := range p.recs {
		fn(p.recs[(p.next+i)%len(p.recs)])
	}
}

// of returns the records of name, oldest first.
func (p *pastHistory) of(name string) []histRec {
	if p.count[name] == 0 {
		return nil
	}
	out := make([]histRec, 0, p.count[name])
	p.each(func(r pastRec) {
		if r.name == name {
			out = append(out, r.histRec)
		}
	})
	return out
}
