package server

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/tenure-io/tenure/internal/dashboard"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/version"
)

// The dashboard's view of this node (dashboard.Source): the node's own
// state, read locally (it may lag the leader's by what it has not applied
// yet), dated by the hub's revision clock.

// Dashboard is this server as the dashboard's source.
func (s *Server) Dashboard() dashboard.Source { return dashSource{s} }

type dashSource struct{ s *Server }

// dashWaiters bounds the waiters of one lock the dashboard lists.
const dashWaiters = 100

func (d dashSource) ms(rev uint64, now time.Time) int64 {
	return now.Sub(d.s.hub.clock.when(rev)).Milliseconds()
}

// Cluster implements dashboard.Source.
func (d dashSource) Cluster() dashboard.Cluster {
	st := d.s.node.Status()
	h := d.s.node.Health()
	return dashboard.Cluster{Node: st.Node, Leader: h.Leader, Term: st.Term, CommitIndex: h.CommitIndex, AppliedIndex: h.AppliedIndex,
		Revision: st.Revision, Voters: st.Voters, Ready: h.Ready(), NotReady: h.Reason(), Version: version.String()}
}

// lockLocked describes the lock of summary l; the state's read lock is held.
func (d dashSource) lockLocked(st *fsm.State, l fsm.LockSummary, now time.Time) dashboard.Lock {
	out := dashboard.Lock{Name: l.Name, Kind: l.Kind, Permits: l.Permits, WaiterCount: l.Waiters, DelayMs: l.DelayMs, Holders: []dashboard.Holder{}, Waiters: []dashboard.Waiter{}}
	for h := range st.LockHolders(l.Name, 0) {
		mode := "exclusive"
		switch {
		case h.Shared:
			mode = "shared"
		case l.Permits > 1:
			mode = "permit"
		}
		out.Holders = append(out.Holders, dashboard.Holder{Owner: h.Owner, Session: h.Session, Token: h.Token, Mode: mode, HeldMs: d.ms(h.Token, now)})
		if len(out.Holders) == maxListedHolders {
			break
		}
	}
	for w := range st.LockWaiters(l.Name, 0) {
		out.Waiters = append(out.Waiters, dashboard.Waiter{Owner: w.Owner, Session: w.Session, QueuedRevision: w.AcquireRevision, Shared: w.Shared, WaitMs: d.ms(w.AcquireRevision, now)})
		if len(out.Waiters) == dashWaiters {
			break
		}
	}
	return out
}

// Locks implements dashboard.Source.
func (d dashSource) Locks(prefix string, limit int) (out []dashboard.Lock, more bool) {
	out = []dashboard.Lock{}
	now := time.Now()
	d.s.node.Read(func(st *fsm.State) {
		for l := range st.Locks(prefix, "") {
			if len(out) == limit {
				more = true
				break
			}
			out = append(out, d.lockLocked(st, l, now))
		}
	})
	return out, more
}

// Lock implements dashboard.Source.
func (d dashSource) Lock(name string) (l dashboard.Lock, grants []dashboard.Grant) {
	now := time.Now()
	var hist []fsm.GrantView
	d.s.node.Read(func(st *fsm.State) {
		l = d.lockLocked(st, st.LockSummary(name), now)
		hist = st.History(name)
	})
	grants = []dashboard.Grant{}
	for _, g := range hist {
		gr := dashboard.Grant{Owner: g.Owner, Session: g.Session, Token: g.Token, GrantedRevision: g.GrantedRevision, Ended: g.Ended, EndedRevision: g.EndedRevision,
			At: d.s.hub.clock.when(g.GrantedRevision).UnixMilli()}
		if g.Ended != "held" {
			gr.EndedAt = d.s.hub.clock.when(g.EndedRevision).UnixMilli()
		}
		grants = append(grants, gr)
	}
	return l, grants
}

// Sessions implements dashboard.Source.
func (d dashSource) Sessions(limit int) (out []dashboard.Session, more bool) {
	out = []dashboard.Session{}
	d.s.node.Read(func(st *fsm.State) {
		for v := range st.SessionsAfter(0, 20) {
			if len(out) == limit {
				more = true
				break
			}
			out = append(out, dashboard.Session{ID: v.ID, Owner: v.Owner, TTLMs: v.TTLMs, TimeLeftMs: -1, Held: v.Held, Waiting: v.Waiting, HeldCount: v.HeldCount, WaitCount: v.WaitingCount})
		}
	})
	ids := make([]uint64, len(out))
	for i, v := range out {
		ids[i] = v.ID
	}
	if left, ok := d.s.node.SessionsTimeLeft(ids); ok {
		for i, l := range left {
			if l >= 0 {
				out[i].TimeLeftMs = l.Milliseconds()
			}
		}
	}
	return out, more
}

// Queues implements dashboard.Source.
func (d dashSource) Queues(limit int) ([]dashboard.Queue, bool) {
	var sizes []fsm.QueueSizes
	d.s.node.Read(func(st *fsm.State) { st.EachQueue(func(q fsm.QueueSizes) { sizes = append(sizes, q) }) })
	sort.Slice(sizes, func(i, j int) bool { return sizes[i].Name < sizes[j].Name })
	out := []dashboard.Queue{}
	now := time.Now()
	for _, q := range sizes {
		if len(out) == limit {
			return out, true
		}
		age := int64(-1)
		if q.OldestReady != 0 {
			age = d.ms(q.OldestReady, now)
		}
		out = append(out, dashboard.Queue{Name: q.Name, Ready: q.Ready, InFlight: q.InFlight, Dead: q.Dead, OldestReadyMs: age})
	}
	return out, false
}

// previewBytes bounds a dead letter's payload shown.
const previewBytes = 120

// DeadLetters implements dashboard.Source.
func (d dashSource) DeadLetters(queue string, limit int) (out []dashboard.DeadLetter, more bool) {
	out = []dashboard.DeadLetter{}
	d.s.node.Read(func(st *fsm.State) {
		for it := range st.DeadLetters(queue, 0) {
			if len(out) == limit {
				more = true
				break
			}
			p := it.Payload[:min(len(it.Payload), previewBytes)]
			preview := string(p)
			if !utf8.Valid(p) {
				preview = "(binary)"
			}
			out = append(out, dashboard.DeadLetter{ID: it.ID, Attempts: it.Attempts, Size: len(it.Payload), Preview: preview})
		}
	})
	return out, more
}

// Requeue implements dashboard.Source: a requeue proposed as the API's
// QueueDeadRequeue does.
func (d dashSource) Requeue(ctx context.Context, queue string, ids []uint64) (int, error) {
	if err := fsm.ValidateQueueName(queue); err != nil {
		return 0, err
	}
	if len(ids) > fsm.MaxRequeueBatch {
		ids = ids[:fsm.MaxRequeueBatch]
	}
	res, err := d.s.node.Propose(ctx, &fsmpb.Command{Op: &fsmpb.Command_QueueRequeueDead{QueueRequeueDead: &fsmpb.QueueRequeueDead{Queue: queue, Ids: ids}}})
	if err != nil {
		return 0, err
	}
	return res.Queue.Requeued, nil
}

// dashScan bounds the locks the elections page looks through.
const dashScan = 100_000

// Elections implements dashboard.Source.
func (d dashSource) Elections(limit int) (out []dashboard.Election, more bool) {
	out = []dashboard.Election{}
	d.s.node.Read(func(st *fsm.State) {
		scanned := 0
		for l := range st.Locks("", "") {
			if scanned++; scanned > dashScan {
				more = true
				break
			}
			if l.Kind != fsm.KindElection {
				continue
			}
			if len(out) == limit {
				more = true
				break
			}
			e := dashboard.Election{Name: l.Name}
			for h := range st.LockHolders(l.Name, 0) {
				e.Leader, e.Session, e.Epoch, e.Value = h.Owner, h.Session, h.Token, string(h.Value)
				break
			}
			out = append(out, e)
		}
	})
	return out, more
}

// Changes implements dashboard.Source.
func (d dashSource) Changes() (<-chan uint64, func()) { return d.s.hub.changes.subscribe() }

// changeFeed tells subscribers the state's revision after each applied
// batch, coalesced: each has a buffer of one holding the latest. Safe for
// concurrent use; with no subscriber a batch costs one atomic load.
type changeFeed struct {
	n atomic.Int32 // subscribers
	// mu guards subs.
	mu   sync.Mutex
	subs map[chan uint64]struct{}
}

func (f *changeFeed) subscribe() (<-chan uint64, func()) {
	ch := make(chan uint64, 1)
	f.mu.Lock()
	if f.subs == nil {
		f.subs = make(map[chan uint64]struct{})
	}
	f.subs[ch] = struct{}{}
	f.n.Add(1)
	f.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			f.mu.Lock()
			delete(f.subs, ch)
			f.n.Add(-1)
			f.mu.Unlock()
		})
	}
}

// publish tells every subscriber the state is at rev; it never blocks.
func (f *changeFeed) publish(rev uint64) {
	if f.n.Load() == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for ch := range f.subs {
		select {
		case <-ch: // replace what it has not read with the latest
		default:
		}
		select {
		case ch <- rev:
		default:
		}
	}
}
