package fsm

import "sort"

// SessionView describes one session for readers.
type SessionView struct {
	ID      uint64
	Owner   string
	TTLMs   int64
	Held    []string
	Waiting []string
}

// HolderView describes a lock's current grant.
type HolderView struct {
	Owner           string
	Session         uint64
	Token           uint64
	AcquireRevision uint64
	Shared          bool
	Value           []byte
}

// WaiterView describes one queued acquisition.
type WaiterView struct {
	Owner           string
	Session         uint64
	AcquireRevision uint64
	Shared          bool
}

// LockView describes a lock: holders, waiters in grant order, delay.
type LockView struct {
	Name string
	// Holder is the first holder (the only one of a mutex); Holders all.
	Holder  *HolderView
	Holders []HolderView
	Permits int
	Waiters []WaiterView
	Delayed bool
}

// GrantView is one record of a lock's grant history.
type GrantView struct {
	Owner           string
	Session         uint64
	Token           uint64
	GrantedRevision uint64
	Ended           string
	EndedRevision   uint64
}

// RegisterView is a fenced register's content.
type RegisterView struct {
	Value       []byte
	Token       uint64
	ModRevision uint64
	Found       bool
}

// DelayView is a lock held back by a lock-delay.
type DelayView struct {
	Name       string
	DelayMs    int64
	Generation uint64
}

// Sessions lists sessions by id.
func (s *State) Sessions() []SessionView {
	out := make([]SessionView, 0, len(s.sessions))
	for _, ss := range s.sessions {
		v := SessionView{ID: ss.id, Owner: ss.owner, TTLMs: ss.ttlMs, Held: sortedKeys(ss.held), Waiting: sortedKeys(ss.waits)}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// SessionCount is the number of live sessions.
func (s *State) SessionCount() int { return len(s.sessions) }

// WaiterCount is the number of queued acquires of name.
func (s *State) WaiterCount(name string) int {
	if l := s.locks[name]; l != nil {
		return l.nwait
	}
	return 0
}

// Involved reports whether session holds or waits for name.
func (s *State) Involved(session uint64, name string) bool {
	ss := s.sessions[session]
	if ss == nil {
		return false
	}
	_, held := ss.held[name]
	_, waits := ss.waits[name]
	return held || waits
}

// Session returns one session's TTL, if it exists.
func (s *State) Session(id uint64) (ttlMs int64, ok bool) {
	ss, ok := s.sessions[id]
	if !ok {
		return 0, false
	}
	return ss.ttlMs, true
}

// Lock describes the named lock; an unknown lock is free.
func (s *State) Lock(name string) LockView {
	v := LockView{Name: name, Permits: 1}
	l := s.locks[name]
	if l == nil {
		return v
	}
	v.Delayed = l.delayed
	v.Permits = l.permits
	for _, g := range l.holders {
		v.Holders = append(v.Holders, HolderView{Owner: g.sess.owner, Session: g.sess.id, Token: g.token, AcquireRevision: g.acqRev, Shared: g.shared, Value: append([]byte(nil), g.value...)})
	}
	if len(v.Holders) > 0 {
		v.Holder = &v.Holders[0]
	}
	for w := l.head; w != nil; w = w.next {
		v.Waiters = append(v.Waiters, WaiterView{Owner: w.sess.owner, Session: w.sess.id, AcquireRevision: w.acqRev, Shared: w.shared})
	}
	return v
}

// History returns the lock's newest grant records (at most the lock
// history setting), oldest first: those kept of its earlier lives (before
// it was removed once unused), then its own.
func (s *State) History(name string) []GrantView {
	recs := s.past.of(name)
	if l := s.locks[name]; l != nil {
		recs = append(recs, l.history...)
	}
	if len(recs) > s.historyLimit {
		recs = recs[len(recs)-s.historyLimit:]
	}
	if len(recs) == 0 {
		return nil
	}
	out := make([]GrantView, len(recs))
	for i, h := range recs {
		out[i] = GrantView{Owner: h.owner, Session: h.session, Token: h.token, GrantedRevision: h.grantedRev, Ended: h.ended, EndedRevision: h.endedRev}
	}
	return out
}

// LockCount is the number of locks in use (with a holder, a waiter or a
// lock-delay); unused locks are removed.
func (s *State) LockCount() int { return len(s.locks) }

// Register returns a fenced register.
func (s *State) Register(key string) RegisterView {
	r := s.registers[key]
	if r == nil {
		return RegisterView{}
	}
	return RegisterView{Value: append([]byte(nil), r.value...), Token: r.token, ModRevision: r.modRev, Found: true}
}

// Delays lists the locks held back by a lock-delay, by name.
func (s *State) Delays() []DelayView {
	var out []DelayView
	for _, name := range sortedKeys(s.locks) {
		if l := s.locks[name]; l.delayed {
			out = append(out, DelayView{Name: name, DelayMs: l.delayMs, Generation: l.delayGen})
		}
	}
	return out
}
