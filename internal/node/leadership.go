package node

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// Leadership is this node's one answer to "who leads, and may I act as
// the leader?". The node publishes a new value, atomically, on every
// change: raft's state or known leader changed (published from raft's own
// goroutine as it changes them), raft's term moved on (seen by the next
// read), this node as leader applied its term's barrier and promoted its
// lessor, or confirmed its leadership again for keepalives. Every
// leadership predicate of the node (IsLeader, Serving, CaughtUpLeader,
// LeadershipConfirmed, Leader, Term), of its lessor, of the server, the
// etcd front and health is a function of one value: no two of them can
// disagree about the same value, and none lags behind another.
//
// A value is immutable. What it says may stop being true the moment after
// it is read (a leader can be deposed at any time): safety never rests on
// it alone. Writes are safe because raft commits them only under a
// quorum; linearizable reads confirm leadership with a quorum round; and a
// keepalive is confirmed only before LeaseUntil, whose argument is in
// lease.go.
type Leadership struct {
	// Seq numbers the values this node published: the first is 1 and
	// each one after is one more.
	Seq uint64
	// Term is raft's current term.
	Term uint64
	// Leader is the id of the leader this node knows of in Term ("" when
	// it knows none): this node's own id exactly when Leading.
	Leader string
	// Leading: raft has this node as the leader of Term.
	Leading bool
	// BarrierApplied is the last term in which this node, as leader,
	// committed an entry of its own term, applied every entry before it
	// and promoted its lessor for the term (0 none). When it is Term the
	// node serves (see Serving).
	BarrierApplied uint64
	// LeaseUntil: while Leading, keepalives may be confirmed before it
	// (see keepAliveLease); zero until leadership is confirmed in Term.
	LeaseUntil time.Time
}

// Serving reports whether the value says this node serves as the leader:
// it leads Term and has applied everything committed before Term (its
// barrier) with its lessor timing the term's sessions. Only then is its
// state authoritative about which sessions exist and its ACLs at least as
// new as any a client has seen acknowledged.
func (l Leadership) Serving() bool { return l.Leading && l.BarrierApplied == l.Term }

// Confirmed reports whether the value lets this node confirm a keepalive
// at now without a round of raft first (see keepAliveLease).
func (l Leadership) Confirmed(now time.Time) bool { return l.Leading && now.Before(l.LeaseUntil) }

// leadership holds the published value.
//
// Lock order: a caller may hold the lessor's lock or the leader lease's
// when it takes mu (a read that finds the term moved publishes); nothing
// is taken while mu is held but raft's own atomics and leader lock, so
// raft's goroutine may publish at any time.
type leadership struct {
	// cur is the value published last; never nil once the node is open.
	cur atomic.Pointer[Leadership]

	// mu orders the publications and guards watchers.
	mu       sync.Mutex
	watchers []func(Leadership)
}

// Leadership returns the value published last; if raft's term has moved
// on since, it first publishes the value for the new term.
func (n *Node) Leadership() Leadership { return *n.leadership() }

// leadership is Leadership without the copy: the value is immutable.
func (n *Node) leadership() *Leadership {
	if v := n.lead.cur.Load(); v.Term == n.raft.CurrentTerm() {
		return v
	}
	return n.publish(nil)
}

// OnLeadership registers fn to be called with every value published from
// now on, in order, while no other is published: fn must be quick and
// must not block, nor call back into the node.
func (n *Node) OnLeadership(fn func(Leadership)) {
	n.lead.mu.Lock()
	defer n.lead.mu.Unlock()
	n.lead.watchers = append(n.lead.watchers, fn)
}

// publish reads raft's state, term and known leader, applies change (if
// not nil) to the value built from them, and publishes the result if it
// differs from the last value; it returns the value in force.
func (n *Node) publish(change func(*Leadership)) *Leadership {
	l := &n.lead
	l.mu.Lock()
	defer l.mu.Unlock()
	old := l.cur.Load()
	next := *old
	next.Term = n.raft.CurrentTerm()
	next.Leading = n.raft.State() == raft.Leader
	_, id := n.raft.LeaderWithID()
	next.Leader = string(id)
	switch {
	case next.Leading:
		// raft names itself leader a moment after it takes the state.
		next.Leader = n.cfg.NodeID
	case next.Leader == n.cfg.NodeID:
		// and forgets itself a moment after it steps down.
		next.Leader = ""
	}
	if !next.Leading || next.Term != old.Term {
		next.LeaseUntil = time.Time{}
	}
	if change != nil {
		change(&next)
	}
	next.Seq = old.Seq
	if next == *old {
		return old
	}
	next.Seq++
	l.cur.Store(&next)
	for _, fn := range l.watchers {
		fn(next)
	}
	return &next
}

// promoted publishes that this node, leading term, applied the term's
// barrier, promoted its lessor and confirmed its leadership as of began
// (the barrier is a confirmation too: see keepAliveLease). Nothing changes
// if the node no longer leads term.
func (n *Node) promoted(term uint64, began time.Time) {
	n.publish(func(v *Leadership) {
		if v.Leading && v.Term == term {
			v.BarrierApplied = term
			extendLease(v, began)
		}
	})
}

// leaseConfirmed publishes that an entry of term, created after began,
// was committed (see keepAliveLease). Nothing changes if the node no
// longer leads term.
func (n *Node) leaseConfirmed(term uint64, began time.Time) {
	n.publish(func(v *Leadership) {
		if v.Leading && v.Term == term {
			extendLease(v, began)
		}
	})
}

// extendLease moves v's lease to began + keepAliveLease if that is later.
func extendLease(v *Leadership, began time.Time) {
	if until := began.Add(keepAliveLease); until.After(v.LeaseUntil) {
		v.LeaseUntil = until
	}
}

// servingTerm is the term in which this node serves now (0 none): the
// lessor acts only for it.
func (n *Node) servingTerm() uint64 {
	if v := n.leadership(); v.Serving() {
		return v.Term
	}
	return 0
}

// IsLeader reports whether this node leads (Leadership.Leading): raft has
// it as leader, although it may not serve yet (see Serving).
func (n *Node) IsLeader() bool { return n.leadership().Leading }

// Serving reports whether this node serves as leader
// (Leadership.Serving): it leads, and its state holds everything committed
// before its term (its barrier was applied). Only then is its state
// authoritative about which sessions exist.
func (n *Node) Serving() bool { return n.leadership().Serving() }

// CaughtUpLeader is Serving by the name the ACL checks use: this node is
// the leader and has applied every entry committed before its term, so its
// ACLs are at least as new as any a client has seen acknowledged. A
// follower's may lag.
func (n *Node) CaughtUpLeader() bool { return n.Serving() }

// LeadershipConfirmed reports whether KeepAlive would answer now without
// committing a barrier first (Leadership.Confirmed).
func (n *Node) LeadershipConfirmed() bool {
	return n.leadership().Confirmed(n.cfg.Clock.Now())
}

// Term is raft's current term (Leadership.Term).
func (n *Node) Term() uint64 { return n.leadership().Term }

// Leader is the id of the leader this node knows of ("" none;
// Leadership.Leader).
func (n *Node) Leader() string { return n.leadership().Leader }
