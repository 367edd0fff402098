package fsm

import "errors"

// Statistics for monitoring. They are read, never acted on: nothing here
// changes what Apply does, returns or emits, and none of it is exported in
// a snapshot. The totals (held locks, lock-delays) are kept as Apply
// changes the locks, so that reading them costs O(1) however many locks
// there are; Import recomputes them. Counters count what this State (and,
// through FSM.Restore, the states before it in this process) has applied:
// they are this process's, like a metric, and start from zero in a new
// process, which replays its log from the last snapshot.

// Counters are cumulative counts of what was applied.
type Counters struct {
	// Grants counts every grant (at once or by a hand-off); Handoffs the
	// grants to a waiter.
	Grants, Handoffs uint64
	// SessionsExpired and SessionsClosed count the sessions that ended.
	SessionsExpired, SessionsClosed uint64
	// Fenced writes (puts and deletes) by outcome: accepted, stale, a
	// replayed operation id, or refused as invalid (a token that was
	// never issued, bad arguments).
	FenceAccepted, FenceStale, FenceDuplicate, FenceInvalid uint64
	// Redeliveries counts queue deliveries of items delivered before;
	// DeadLettered the items moved to the dead letters.
	Redeliveries, DeadLettered uint64
}

func (c *Counters) sessionEnded(expired bool) {
	if expired {
		c.SessionsExpired++
	} else {
		c.SessionsClosed++
	}
}

// fenced counts the outcome of a fenced write.
func (c *Counters) fenced(r Result) {
	switch {
	case r.Err != nil:
		if errors.Is(r.Err, ErrInvalid) {
			c.FenceInvalid++
		}
	case r.Duplicate:
		c.FenceDuplicate++
	case r.Put == PutStale:
		c.FenceStale++
	case r.Put == PutAccepted:
		c.FenceAccepted++
	}
}

// Counters returns the counts so far.
func (s *State) Counters() Counters { return s.counters }

// Totals are the state's sizes, each read in O(1).
type Totals struct {
	Sessions int
	// Locks in use; Held of them have a holder, Delayed are held back by
	// a lock-delay; Waiters are the queued acquires on all of them.
	Locks, Held, Delayed, Waiters int
	Keys                          int
	Registers                     int
	Queues                        int
	// Znodes: the ZooKeeper front's znodes (the root and /zookeeper's
	// three included); ZnodeBytes: what they count against MaxZnodeBytes
	// (paths, data and ACLs); Ephemerals: those of them owned by a
	// session.
	Znodes, Ephemerals int
	ZnodeBytes         uint64
}

// Totals returns the state's sizes.
func (s *State) Totals() Totals {
	return Totals{
		Sessions: len(s.sessions),
		Locks:    len(s.locks), Held: s.heldLocks, Delayed: s.delayedLocks, Waiters: int(s.waiting),
		Keys:      s.kv.tree.Len(),
		Registers: len(s.registers),
		Queues:    len(s.queues.byName),
		Znodes:    len(s.zk.nodes), ZnodeBytes: s.zk.bytes, Ephemerals: s.zk.ephemeralCount(),
	}
}

// The kinds of lock (LockSummary.Kind).
const (
	KindMutex     = "mutex"
	KindSemaphore = "semaphore"
	KindRWLock    = "rwlock"
	KindElection  = "election"
)

// LockKind names the kind of lock an acquire asks for: an election, a
// semaphore (more than one permit), a reader of a read-write lock, or
// else a mutex (a writer of a read-write lock asks for what a mutex is).
func LockKind(permits uint32, shared, election bool) string {
	switch {
	case election:
		return KindElection
	case permits > 1:
		return KindSemaphore
	case shared:
		return KindRWLock
	}
	return KindMutex
}

// kind is what l is: an election, a semaphore, a read-write lock (while
// a reader holds or waits for it) or a mutex. The state records no more
// than that of a name: a read-write lock that only a writer holds, with
// no reader in line, is a mutex for as long as that lasts.
func (l *lock) kind() string {
	return LockKind(uint32(l.permits), l.nshared > 0 || l.nwaitShared > 0, l.election)
}

// QueueSizes describes one queue for monitoring.
type QueueSizes struct {
	Name                  string
	Ready, InFlight, Dead int
	// OldestReady is the id (the enqueue's revision) of the oldest ready
	// item; 0 if none is ready.
	OldestReady uint64
}

// EachQueue calls fn for every queue, in no particular order: O(queues).
func (s *State) EachQueue(fn func(QueueSizes)) {
	for name, q := range s.queues.byName {
		v := QueueSizes{Name: name, Ready: q.ready.len(), InFlight: q.inflight.Len(), Dead: q.dead.Len()}
		if it, ok := q.ready.min(); ok {
			v.OldestReady = it.id
		}
		fn(v)
	}
}
