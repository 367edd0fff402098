package fsm

import (
	"iter"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
)

// SessionView describes one session for readers.
type SessionView struct {
	ID    uint64
	Owner string
	TTLMs int64
	// Held and Waiting name locks, by name (see SessionsAfter);
	// HeldCount and WaitingCount count them all.
	Held         []string
	Waiting      []string
	HeldCount    int
	WaitingCount int
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
	// Lock is the lock the register is bound to ("" none).
	Lock string
}

// DelayView is a lock held back by a lock-delay.
type DelayView struct {
	Name       string
	DelayMs    int64
	Generation uint64
}

// Sessions lists every session by id.
func (s *State) Sessions() []SessionView {
	out := make([]SessionView, 0, len(s.sessions))
	for v := range s.SessionsAfter(0, -1) {
		out = append(out, v)
	}
	return out
}

// SessionsAfter yields the sessions with ids above after, by id, each
// with at most maxNames (-1: all) of the locks it holds and of those it
// waits for, the first by name; HeldCount and WaitingCount count them all.
// Finding the first costs O(log n), each session O(k log k) for its k
// locks. It must be consumed under the state's lock.
func (s *State) SessionsAfter(after uint64, maxNames int) iter.Seq[SessionView] {
	return func(yield func(SessionView) bool) {
		if after == math.MaxUint64 {
			return
		}
		s.sessionOrder.AscendGreaterOrEqual(&session{id: after + 1}, func(ss *session) bool {
			v := SessionView{ID: ss.id, Owner: ss.owner, TTLMs: s.ttlOf(ss), Held: firstKeys(ss.held, maxNames), Waiting: firstKeys(ss.waits, maxNames), HeldCount: len(ss.held), WaitingCount: len(ss.waits)}
			return yield(v)
		})
	}
}

// firstKeys returns m's first n keys (-1: all), in order.
func firstKeys[V any](m map[string]V, n int) []string {
	keys := slices.Sorted(maps.Keys(m))
	if n >= 0 && len(keys) > n {
		keys = keys[:n:n]
	}
	return keys
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
	return s.ttlOf(ss), true
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

// LockSummary is a lock in a listing.
type LockSummary struct {
	Name    string
	Kind    string // KindMutex, KindSemaphore, KindRWLock or KindElection
	Permits int
	Holders int
	Waiters int
	Delayed bool
	// DelayMs is the lock-delay holding the lock back (0: none).
	DelayMs int64
}

func (l *lock) summary() LockSummary {
	return LockSummary{Name: l.name, Kind: l.kind(), Permits: l.permits, Holders: len(l.holders), Waiters: l.nwait, Delayed: l.delayed, DelayMs: l.delayMs}
}

// LockSummary describes the named lock in brief; an unknown lock is free.
func (s *State) LockSummary(name string) LockSummary {
	if l := s.locks[name]; l != nil {
		return l.summary()
	}
	return LockSummary{Name: name, Kind: KindMutex, Permits: 1}
}

// Locks yields the locks whose names start with prefix and come after the
// name after, by name. Finding the first costs O(log n), each next one
// O(1). It must be consumed under the state's lock.
func (s *State) Locks(prefix, after string) iter.Seq[LockSummary] {
	return func(yield func(LockSummary) bool) {
		from := max(prefix, after+"\x00") // the first name after "after"
		if after == "" {
			from = prefix
		}
		s.lockOrder.AscendGreaterOrEqual(&lock{name: from}, func(l *lock) bool {
			return strings.HasPrefix(l.name, prefix) && yield(l.summary())
		})
	}
}

// LockHolders yields the named lock's holders whose tokens are above
// after, in grant order (which is token order). Finding the first costs
// O(log n). It must be consumed under the state's lock.
func (s *State) LockHolders(name string, after uint64) iter.Seq[HolderView] {
	return func(yield func(HolderView) bool) {
		l := s.locks[name]
		if l == nil {
			return
		}
		i := sort.Search(len(l.holders), func(i int) bool { return l.holders[i].token > after })
		for _, g := range l.holders[i:] {
			if !yield(HolderView{Owner: g.sess.owner, Session: g.sess.id, Token: g.token, AcquireRevision: g.acqRev, Shared: g.shared, Value: append([]byte(nil), g.value...)}) {
				return
			}
		}
	}
}

// LockWaiters yields the named lock's waiters queued after the revision
// after, in grant order (which is the order of their queued revisions).
// Finding the first walks the line from its head: O(waiters ahead of it),
// bounded by the waiters a lock may have. It must be consumed under the
// state's lock.
func (s *State) LockWaiters(name string, after uint64) iter.Seq[WaiterView] {
	return func(yield func(WaiterView) bool) {
		l := s.locks[name]
		if l == nil {
			return
		}
		w := l.head
		for w != nil && w.acqRev <= after {
			w = w.next
		}
		for ; w != nil; w = w.next {
			if !yield(WaiterView{Owner: w.sess.owner, Session: w.sess.id, AcquireRevision: w.acqRev, Shared: w.shared}) {
				return
			}
		}
	}
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
	return RegisterView{Value: append([]byte(nil), r.value...), Token: r.token, ModRevision: r.modRev, Found: true, Lock: r.lock}
}

// Delays lists the locks held back by a lock-delay, by name.
func (s *State) Delays() []DelayView {
	var out []DelayView
	s.lockOrder.Ascend(func(l *lock) bool {
		if l.delayed {
			out = append(out, DelayView{Name: l.name, DelayMs: l.delayMs, Generation: l.delayGen})
		}
		return true
	})
	return out
}
