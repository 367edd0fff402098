// Package lessor owns time for the lock authority. It runs on every node but
// acts only on the leader: it keeps each session's deadline on the leader's
// monotonic clock, extends it on keepalives (which never touch the log), and
// when a deadline passes it proposes an ExpireSession entry. It does the same
// for lock-delays, proposing EndLockDelay, and for the visibility leases of
// queue deliveries, proposing QueueExpire (queue.go).
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

// Proposer commits a command to the replicated log.
type Proposer func(ctx context.Context, cmd *fsmpb.Command) (fsm.Result, error)

// StateReader reads the replicated state.
type StateReader func(fn func(*fsm.State))

type sessionEntry struct {
	ttl      time.Duration
	deadline time.Time
	expiring bool // an ExpireSession has been proposed
}

type delayEntry struct {
	gen    uint64
	at     time.Time
	ending bool // an EndLockDelay has been proposed
}

// StallGap is the longest the lessor may go without running, while it
// leads, before it takes the gap for a stall of its process and charges no
// deadline for it (see the package doc). Its loop wakes every stallTick, so
// a gap this long is far beyond scheduling delays.
const StallGap = 250 * time.Millisecond

// stallTick is how often the loop wakes, at least, while leading.
const stallTick = 100 * time.Millisecond

// maxExpiries bounds the session expiries, and the lock-delay ends,
// proposed in one round.
const maxExpiries = 1024

// Lessor tracks deadlines. It is safe for concurrent use.
type Lessor struct {
	clk     clock.Clock
	propose Proposer
	read    StateReader
	wake    chan struct{}

	// mu guards the fields below.
	mu       sync.Mutex
	leader   bool
	sessions map[uint64]*sessionEntry
	delays   map[string]*delayEntry
	queue    queueTimers // visibility leases of queue deliveries (queue.go)
	// seen is when the lessor last ran while leading (its loop or a
	// keepalive); see beatLocked.
	seen time.Time
	// scanAt: no session or lock-delay deadline passes before it (zero:
	// scan at the next wake-up).
	scanAt time.Time
}

// New returns a lessor; it does nothing until Run is called and the node is
// promoted.
func New(clk clock.Clock, propose Proposer, read StateReader) *Lessor {
	return &Lessor{
		clk: clk, propose: propose, read: read,
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

// Promote is called when this node has become leader and has applied every
// committed entry. Every session gets a fresh TTL plus allowance, and every
// lock-delay starts again in full: nothing expires early because leadership
// moved. The allowance covers keepalives that an earlier leader may have
// confirmed up to the moment this one took over (see node.KeepAlive).
func (l *Lessor) Promote(allowance time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clk.Now()
	l.leader = true
	l.seen, l.scanAt = now, time.Time{}
	l.sessions = make(map[uint64]*sessionEntry)
	l.delays = make(map[string]*delayEntry)
	l.read(func(s *fsm.State) {
		for _, sv := range s.Sessions() {
			ttl := time.Duration(sv.TTLMs) * time.Millisecond
			l.sessions[sv.ID] = &sessionEntry{ttl: ttl, deadline: now.Add(ttl + allowance)}
		}
		for _, d := range s.Delays() {
			l.delays[d.Name] = &delayEntry{gen: d.Generation, at: now.Add(time.Duration(d.DelayMs) * time.Millisecond)}
		}
		l.promoteQueues(now, s)
	})
	l.poke()
}

// Demote is called when this node stops being leader.
func (l *Lessor) Demote() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.leader = false
	l.sessions = make(map[uint64]*sessionEntry)
	l.delays = make(map[string]*delayEntry)
	l.queue.reset()
}

// IsLeader reports whether the lessor is acting as leader.
func (l *Lessor) IsLeader() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leader
}

// Observe feeds one state-machine event to the lessor. Events are applied
// in log order after the state change they describe, so a Promote that read
// the state before an event sees the event applied afterwards, and one that
// read after it already reflects it.
func (l *Lessor) Observe(e fsm.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.leader {
		return
	}
	now := l.clk.Now()
	switch e.Kind {
	case fsm.EventSessionCreated:
		ttl := time.Duration(e.TTLMs) * time.Millisecond
		l.sessions[e.Session] = &sessionEntry{ttl: ttl, deadline: now.Add(ttl)}
		l.armLocked(now.Add(ttl))
	case fsm.EventSessionEnded:
		delete(l.sessions, e.Session)
	case fsm.EventDelayStarted:
		at := now.Add(time.Duration(e.DelayMs) * time.Millisecond)
		l.delays[e.Name] = &delayEntry{gen: e.Generation, at: at}
		l.armLocked(at)
	case fsm.EventQueueLeased, fsm.EventQueueSettled:
		l.observeQueue(now, e)
	}
}

// armLocked makes the loop look at the deadlines again by at.
func (l *Lessor) armLocked(at time.Time) {
	if at.Before(l.scanAt) {
		l.scanAt = at
	}
	l.poke()
}

// beatLocked notes that the lessor runs at now, while leading. A gap of
// more than StallGap since it last ran is a stall of the process (see the
// package doc): every deadline moves later by the gap.
func (l *Lessor) beatLocked(now time.Time) {
	if !l.leader {
		return
	}
	if gap := now.Sub(l.seen); gap > StallGap {
		l.shiftLocked(gap)
	}
	if now.After(l.seen) {
		l.seen = now
	}
}

// shiftLocked moves every deadline d later.
func (l *Lessor) shiftLocked(d time.Duration) {
	for _, e := range l.sessions {
		e.deadline = e.deadline.Add(d)
	}
	for _, e := range l.delays {
		e.at = e.at.Add(d)
	}
	if !l.scanAt.IsZero() {
		l.scanAt = l.scanAt.Add(d)
	}
	l.queue.shift(d)
}

// KeepAlive extends a session's deadline to now + TTL and returns the TTL.
// It fails with ErrNotLeader on a follower and fsm.ErrSessionNotFound for a
// session that is unknown or already being expired.
func (l *Lessor) KeepAlive(id uint64) (time.Duration, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.leader {
		return 0, ErrNotLeader
	}
	now := l.clk.Now()
	l.beatLocked(now) // a stall first: this keepalive may be one it held up
	e, ok := l.sessions[id]
	if !ok || e.expiring {
		return 0, fsm.ErrSessionNotFound
	}
	e.deadline = now.Add(e.ttl)
	return e.ttl, nil
}

// due collects what must be proposed now and when to look again.
func (l *Lessor) due() (expire []uint64, ends []*fsmpb.EndLockDelay, next time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.leader {
		return nil, nil, time.Hour
	}
	now := l.clk.Now()
	l.beatLocked(now)
	if now.Before(l.scanAt) {
		return nil, nil, min(stallTick, l.scanAt.Sub(now))
	}
	earliest := time.Hour
	for id, e := range l.sessions {
		if e.expiring {
			continue
		}
		if left := e.deadline.Sub(now); left > 0 {
			earliest = min(earliest, left)
			continue
		}
		if len(expire) == maxExpiries {
			earliest = 0 // the rest in the next round
			continue
		}
		e.expiring = true
		expire = append(expire, id)
	}
	for name, d := range l.delays {
		if d.ending {
			continue
		}
		if left := d.at.Sub(now); left > 0 {
			earliest = min(earliest, left)
			continue
		}
		if len(ends) == maxExpiries {
			earliest = 0
			continue
		}
		d.ending = true
		ends = append(ends, &fsmpb.EndLockDelay{Name: name, Generation: d.gen})
	}
	l.scanAt = now.Add(earliest)
	return expire, ends, min(stallTick, earliest)
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

// proposeDue proposes the expiries and lock-delay ends that are due, all
// at once (the node batches them into few log entries), and re-arms, after
// a short backoff, those whose proposal failed.
func (l *Lessor) proposeDue(ctx context.Context, expire []uint64, ends []*fsmpb.EndLockDelay, qdue []qtimer) {
	var wg sync.WaitGroup
	for _, id := range expire {
		wg.Go(func() {
			_, err := l.propose(ctx, &fsmpb.Command{Op: &fsmpb.Command_ExpireSession{ExpireSession: &fsmpb.ExpireSession{Session: id}}})
			if err != nil && !errors.Is(err, fsm.ErrSessionNotFound) {
				l.retryExpiry(id)
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

// retryExpiry re-arms a session whose expiry could not be proposed (for
// example a timeout). Only the entry the expiry was proposed for: if
// leadership was lost, Demote has cleared it, and a Promote since has
// given the session a fresh TTL that a late failure must not cut short.
func (l *Lessor) retryExpiry(id uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.sessions[id]; ok && e.expiring {
		e.expiring = false
		e.deadline = l.clk.Now().Add(retryBackoff)
		l.armLocked(e.deadline)
	}
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
		delete(l.delays, end.GetName())
		return
	}
	if !d.ending {
		return
	}
	d.ending = false
	d.at = l.clk.Now().Add(retryBackoff)
	l.armLocked(d.at)
}
