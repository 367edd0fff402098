// Package lessor owns time for the lock authority. It runs on every node but
// acts only on the leader: it keeps each session's deadline on the leader's
// monotonic clock, extends it on keepalives (which never touch the log), and
// when deadlines pass it proposes one ExpireSessions entry for all the
// sessions that fell due together. It does the same for lock-delays,
// proposing EndLockDelay, and for the visibility leases of queue
// deliveries, proposing QueueExpire (queue.go). Deadlines are kept in
// heaps (deadlines.go), so a wake-up costs nothing for the sessions that
// are not due.
//
// # Why a session never expires early
//
// A deadline exists only on the node that is leader now. When a node gains
// leadership it gives every session a fresh TTL, plus an allowance the
// caller chooses, counted from that moment, so time that passed under an
// earlier leader (or while no leader existed) is never charged to a
// client. A client counts its own safe deadline from when it *sent* its
// last confirmed keepalive, which is no later than when the leader
// received it; so the client's deadline always falls before the server's,
// by at least its drift margin. (Which keepalives a leader may confirm at
// all is the node's concern: see node.KeepAlive.)
//
// Nor is a client charged for time in which the leader itself did not run.
// While it leads, the lessor's loop wakes at least every stallTick; when it
// (or a keepalive) finds that more than StallGap passed since the lessor
// last ran, the process was stopped, starved or its clock jumped, and
// keepalives that arrived meanwhile may still wait, unread, in its
// sockets. Every deadline then moves later by that gap before anything is
// found due, so those keepalives are read with as much time left as they
// would have had without the stall.
//
// Moving every deadline costs O(1): the lessor keeps its deadlines on its
// own clock, the leader's monotonic clock minus the sum of the stalls seen
// since the promotion (Lessor.stalled), and a stall only adds to that sum.
// Every deadline, heap key and visibility lease the lessor stores, and every
// "now" it compares them with, is on that clock.
package lessor

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/tenure-io/tenure/internal/clock"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// ErrNotLeader is returned by KeepAlive on a node that is not the leader.
var ErrNotLeader = errors.New("lessor: not the leader")

// ServingTerm reports the term in which the node serves as leader now, 0
// when it does not: the node's published leadership, which the lessor
// acts on and never keeps a copy of.
type ServingTerm func() uint64

// Proposer commits a command to the replicated log.
type Proposer func(ctx context.Context, cmd *fsmpb.Command) (fsm.Result, error)

// StateReader reads the replicated state.
type StateReader func(fn func(*fsm.State))

// sessionEntry is one session's deadline: 32 bytes (the flags beside the
// slot's four), as a million sessions keep a million of them.
type sessionEntry struct {
	slot          // in Lessor.sessionQ unless expiring, keyed no later than deadline
	expiring bool // its expiry has been proposed
	// allowance: its deadline includes a promotion's allowance, so a
	// keepalive may bring it forward.
	allowance bool
	id        uint64
	ttl       time.Duration
	deadline  tick
}

type delayEntry struct {
	slot   // in Lessor.delayQ, keyed by when it ends, unless ending
	name   string
	gen    uint64
	ending bool // an EndLockDelay has been proposed
}

// StallGap is the longest the lessor may go without running, while it
// leads, before it takes the gap for a stall of its process and charges no
// deadline for it (see the package doc). Its loop wakes every stallTick, so
// a gap this long is far beyond scheduling delays.
const StallGap = 250 * time.Millisecond

// stallTick is how often the loop wakes, at least, while leading.
const stallTick = 100 * time.Millisecond

// maxDelayEnds bounds the lock-delay ends proposed in one round. (Session
// expiries go in one command of at most fsm.MaxExpiryBatch.)
const maxDelayEnds = 1024

// Lessor tracks deadlines. It is safe for concurrent use.
//
// It acts (confirms keepalives, proposes expiries, reports times left)
// only while the node serves in the term its deadlines were promoted for:
// the node's leadership, read through ServingTerm on every decision, is
// the only answer to whether it leads. A step-down stops it at once, before
// Demote has cleared its deadlines.
type Lessor struct {
	clk     clock.Clock
	epoch   time.Time // the lessor's clock counts from here (see tick)
	propose Proposer
	read    StateReader
	serving ServingTerm
	wake    chan struct{}

	// mu guards the fields below. It may be held while serving is
	// called.
	mu sync.Mutex
	// term is the term the deadlines were promoted for (0: none, not
	// promoted since the last Demote). Events are recorded while it is
	// set; the lessor acts only while serving reports it (actingLocked).
	term     uint64
	sessions map[uint64]*sessionEntry
	sessionQ deadlineHeap[*sessionEntry] // the sessions not being expired
	delays   map[string]*delayEntry
	delayQ   deadlineHeap[*delayEntry] // the delays not being ended
	queue    queueTimers               // visibility leases of queue deliveries (queue.go)
	// seen is when the lessor last ran while leading (its loop or a
	// keepalive), on the leader's clock; see beatLocked.
	seen time.Time
	// stalled is the sum of the stalls seen since the promotion. The
	// lessor's clock, on which it keeps every deadline, is the leader's
	// clock minus stalled (see nowLocked): a stall moves every
	// deadline later at once by adding to it.
	stalled time.Duration
}

// New returns a lessor; it does nothing until Run is called and the node is
// promoted and serves.
func New(clk clock.Clock, propose Proposer, read StateReader, serving ServingTerm) *Lessor {
	return &Lessor{
		clk: clk, epoch: clk.Now(), propose: propose, read: read, serving: serving,
		wake:     make(chan struct{}, 1),
		sessions: make(map[uint64]*sessionEntry),
		delays:   make(map[string]*delayEntry),
	}
}

func (l *Lessor) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Wake makes the lessor look at its deadlines now: the node calls it once
// it serves in the term the lessor was promoted for.
func (l *Lessor) Wake() { l.poke() }

// actingLocked reports whether the lessor acts now: it was promoted for
// the term in which the node serves.
func (l *Lessor) actingLocked() bool { return l.term != 0 && l.serving() == l.term }

// Promote is called when this node has become leader of term and has
// applied every committed entry; the lessor acts once the node serves in
// term. Every session gets a fresh TTL plus allowance, and every
// lock-delay starts again in full: nothing expires early because leadership
// moved. The allowance covers keepalives that an earlier leader may have
// confirmed up to the moment this one took over (see node.KeepAlive).
func (l *Lessor) Promote(term uint64, allowance time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.term = term
	l.seen = l.clk.Now()
	l.resetLocked()
	now := l.nowLocked()
	l.read(func(s *fsm.State) {
		for _, sv := range s.Sessions() {
			ttl := time.Duration(sv.TTLMs) * time.Millisecond
			l.addSessionLocked(sv.ID, ttl, now.add(ttl+allowance)).allowance = allowance > 0
		}
		for _, d := range s.Delays() {
			l.addDelayLocked(d.Name, d.Generation, now.add(time.Duration(d.DelayMs)*time.Millisecond))
		}
		l.promoteQueues(now, s)
	})
	l.poke()
}

// resetLocked forgets every deadline, and the stalls they were moved by.
func (l *Lessor) resetLocked() {
	l.stalled = 0
	l.sessions = make(map[uint64]*sessionEntry)
	l.sessionQ = deadlineHeap[*sessionEntry]{}
	l.delays = make(map[string]*delayEntry)
	l.delayQ = deadlineHeap[*delayEntry]{}
	l.queue.reset()
}

// nowLocked is the time now on the lessor's clock, the one its
// deadlines are kept on: the leader's clock minus the stalls seen since
// the promotion.
func (l *Lessor) nowLocked() tick { return l.tickOf(l.clk.Now()) }

// tickOf is the leader's time t on the lessor's clock.
func (l *Lessor) tickOf(t time.Time) tick { return tick(t.Sub(l.epoch) - l.stalled) }

// addSessionLocked times session id, due at deadline (on the lessor's
// clock).
func (l *Lessor) addSessionLocked(id uint64, ttl time.Duration, deadline tick) *sessionEntry {
	if old := l.sessions[id]; old != nil {
		l.sessionQ.remove(old)
	}
	e := &sessionEntry{id: id, ttl: ttl, deadline: deadline}
	l.sessions[id] = e
	l.sessionQ.push(e, deadline)
	return e
}

// addDelayLocked times the lock-delay of name with generation gen, ending
// at at (on the lessor's clock); it replaces an older delay of the lock.
func (l *Lessor) addDelayLocked(name string, gen uint64, at tick) {
	if old := l.delays[name]; old != nil {
		l.delayQ.remove(old)
	}
	d := &delayEntry{name: name, gen: gen}
	l.delays[name] = d
	l.delayQ.push(d, at)
}

// Demote is called when this node stops being leader: it forgets every
// deadline (it stopped acting when the node stopped serving).
func (l *Lessor) Demote() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.term = 0
	l.resetLocked()
}

// Term reports the term the lessor acts for now: the one it was promoted
// for, while the node serves in it; 0 when it does not act.
func (l *Lessor) Term() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.actingLocked() {
		return l.term
	}
	return 0
}

// Observe feeds one state-machine event to the lessor. Events are applied
// in log order after the state change they describe, so a Promote that read
// the state before an event sees the event applied afterwards, and one that
// read after it already reflects it.
func (l *Lessor) Observe(e fsm.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.term == 0 {
		return
	}
	now := l.nowLocked()
	switch e.Kind {
	case fsm.EventSessionCreated:
		ttl := time.Duration(e.TTLMs) * time.Millisecond
		l.addSessionLocked(e.Session, ttl, now.add(ttl))
		l.poke()
	case fsm.EventSessionTTL:
		// Every keepalive from now on extends the session by its new
		// TTL. The deadline it has moves only later: to one new TTL from
		// now, as ZooKeeper's touch with the renegotiated timeout, if
		// that is later; a shorter TTL first takes effect at the next
		// keepalive (the one the ZooKeeper front makes as it answers the
		// client the new TTL), so that no deadline a keepalive confirmed
		// is cut short. (Only later: the heap's key, never later than the
		// deadline, stays valid.)
		if se := l.sessions[e.Session]; se != nil {
			se.ttl = time.Duration(e.TTLMs) * time.Millisecond
			if d := now.add(se.ttl); d > se.deadline && !se.expiring {
				se.deadline = d
			}
		}
	case fsm.EventSessionEnded:
		if se := l.sessions[e.Session]; se != nil {
			l.sessionQ.remove(se)
			delete(l.sessions, e.Session)
		}
	case fsm.EventDelayStarted:
		l.addDelayLocked(e.Name, e.Generation, now.add(time.Duration(e.DelayMs)*time.Millisecond))
		l.poke()
	case fsm.EventQueueLeased, fsm.EventQueueSettled:
		l.observeQueue(now, e)
	}
}

// beatLocked notes that the lessor runs now, while leading, and returns
// the time on the lessor's clock. A gap of more than StallGap since it last
// ran is a stall of the process (see the package doc): every deadline
// moves later by the gap, which costs one addition to l.stalled.
func (l *Lessor) beatLocked() tick {
	now := l.clk.Now()
	if gap := now.Sub(l.seen); gap > StallGap {
		l.stalled += gap
	}
	if now.After(l.seen) {
		l.seen = now
	}
	return l.tickOf(now)
}

// KeepAlive sets a session's deadline to now + its TTL (the one it was
// created with, or the last SetSessionTTL's) and returns the TTL.
// It fails with ErrNotLeader on a follower and fsm.ErrSessionNotFound for a
// session that is unknown or already being expired.
func (l *Lessor) KeepAlive(id uint64) (time.Duration, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.actingLocked() {
		return 0, ErrNotLeader
	}
	now := l.beatLocked() // a stall first: this keepalive may be one it held up
	e, ok := l.sessions[id]
	if !ok || e.expiring {
		return 0, fsm.ErrSessionNotFound
	}
	e.deadline = now.add(e.ttl)
	e.allowance = false
	if e.deadline < l.sessionQ.at(e) {
		// Earlier than its heap key (a promotion's allowance, or a TTL
		// that SetSessionTTL shortened had it): the heap must bring it
		// up by then.
		l.sessionQ.move(e, e.deadline)
	}
	return e.ttl, nil
}

// due takes what must be proposed now out of the heaps, and says when to
// look again.
func (l *Lessor) due() (expire []uint64, ends []*fsmpb.EndLockDelay, next time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.actingLocked() {
		return nil, nil, time.Hour // Wake or Promote wakes it
	}
	now := l.beatLocked()
	next = time.Hour
	for {
		e, at, ok := l.sessionQ.min()
		if !ok {
			break
		}
		if at > now {
			next = min(next, at.sub(now))
			break
		}
		if e.deadline > now { // kept alive since it was placed
			l.sessionQ.move(e, e.deadline)
			continue
		}
		if len(expire) == fsm.MaxExpiryBatch {
			next = 0 // the rest in the next round
			break
		}
		l.sessionQ.popMin()
		e.expiring = true
		expire = append(expire, e.id)
	}
	for {
		d, at, ok := l.delayQ.min()
		if !ok {
			break
		}
		if at > now {
			next = min(next, at.sub(now))
			break
		}
		if len(ends) == maxDelayEnds {
			next = 0
			break
		}
		l.delayQ.popMin()
		d.ending = true
		ends = append(ends, &fsmpb.EndLockDelay{Name: d.name, Generation: d.gen})
	}
	return expire, ends, min(stallTick, next)
}

// Run proposes expiries until ctx ends.
func (l *Lessor) Run(ctx context.Context) error {
	for {
		expire, ends, next := l.due()
		qdue, qnext := l.dueQueue()
		next = min(next, qnext)
		if len(expire)+len(ends)+len(qdue) > 0 {
			l.proposeDue(ctx, expire, ends, qdue)
			continue
		}
		t := l.clk.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-l.wake:
			t.Stop()
		case <-t.C():
		}
	}
}

// proposeDue proposes what is due, all at once: the session expiries as
// one ExpireSessions, the lock-delay ends and queue expiries one command
// each (the node batches those into few log entries). It re-arms, after a
// short backoff, those whose proposal failed.
func (l *Lessor) proposeDue(ctx context.Context, expire []uint64, ends []*fsmpb.EndLockDelay, qdue []qtimer) {
	var wg sync.WaitGroup
	if len(expire) > 0 {
		wg.Go(func() {
			// Sessions that ended meanwhile are skipped by the state machine.
			_, err := l.propose(ctx, &fsmpb.Command{Op: &fsmpb.Command_ExpireSessions{ExpireSessions: &fsmpb.ExpireSessions{Sessions: expire}}})
			if err != nil {
				l.retryExpiries(expire)
			}
		})
	}
	for _, end := range ends {
		wg.Go(func() {
			// The state machine ignores an EndLockDelay of another
			// generation, so a repeated one is harmless.
			_, err := l.propose(ctx, &fsmpb.Command{Op: &fsmpb.Command_EndLockDelay{EndLockDelay: end}})
			l.delayEnded(end, err)
		})
	}
	for _, e := range qdue {
		wg.Go(func() { l.expireDelivery(ctx, e) })
	}
	wg.Wait()
}

// retryBackoff is how long the lessor waits before proposing an expiry
// again after a failed proposal.
const retryBackoff = 100 * time.Millisecond

// retryExpiries re-arms the sessions whose expiry could not be proposed
// (for example a timeout). Only the entries the expiry was proposed for:
// if leadership was lost, Demote has cleared them, and a Promote since has
// given the sessions a fresh TTL that a late failure must not cut short.
func (l *Lessor) retryExpiries(ids []uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	at := l.nowLocked().add(retryBackoff)
	for _, id := range ids {
		if e, ok := l.sessions[id]; ok && e.expiring {
			e.expiring = false
			e.deadline = at
			l.sessionQ.push(e, at)
		}
	}
	l.poke()
}

// delayEnded settles the lock-delay entry of a proposed EndLockDelay: it
// is done with once the proposal committed; after a failure (the outcome
// may be unknown) it is proposed again after a short backoff. An entry of
// a newer delay of the lock, or one a Promote since restarted in full, is
// left alone.
func (l *Lessor) delayEnded(end *fsmpb.EndLockDelay, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d, ok := l.delays[end.GetName()]
	if !ok || d.gen != end.GetGeneration() {
		return
	}
	if err == nil {
		l.delayQ.remove(d)
		delete(l.delays, end.GetName())
		return
	}
	if !d.ending {
		return
	}
	d.ending = false
	l.delayQ.push(d, l.nowLocked().add(retryBackoff))
	l.poke()
}
