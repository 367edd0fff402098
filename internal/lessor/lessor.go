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
// leadership it gives every session a fresh, full TTL counted from that
// moment, so time that passed under an earlier leader (or while no leader
// existed) is never charged to a client. A client counts its own safe
// deadline from when it *sent* its last confirmed keepalive, which is no
// later than when the leader received it; so the client's deadline always
// falls before the server's, by at least its drift margin.
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
	gen uint64
	at  time.Time
}

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
	delays   map[string]delayEntry
	queue    queueTimers // visibility leases of queue deliveries (queue.go)
}

// New returns a lessor; it does nothing until Run is called and the node is
// promoted.
func New(clk clock.Clock, propose Proposer, read StateReader) *Lessor {
	return &Lessor{
		clk: clk, propose: propose, read: read,
		wake:     make(chan struct{}, 1),
		sessions: make(map[uint64]*sessionEntry),
		delays:   make(map[string]delayEntry),
	}
}

func (l *Lessor) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Promote is called when this node has become leader and has applied every
// committed entry. Every session gets a fresh full TTL and every lock-delay
// starts again in full: nothing expires early because leadership moved.
func (l *Lessor) Promote() {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clk.Now()
	l.leader = true
	l.sessions = make(map[uint64]*sessionEntry)
	l.delays = make(map[string]delayEntry)
	l.read(func(s *fsm.State) {
		for _, sv := range s.Sessions() {
			ttl := time.Duration(sv.TTLMs) * time.Millisecond
			l.sessions[sv.ID] = &sessionEntry{ttl: ttl, deadline: now.Add(ttl)}
		}
		for _, d := range s.Delays() {
			l.delays[d.Name] = delayEntry{gen: d.Generation, at: now.Add(time.Duration(d.DelayMs) * time.Millisecond)}
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
	l.delays = make(map[string]delayEntry)
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
		l.poke()
	case fsm.EventSessionEnded:
		delete(l.sessions, e.Session)
	case fsm.EventDelayStarted:
		l.delays[e.Name] = delayEntry{gen: e.Generation, at: now.Add(time.Duration(e.DelayMs) * time.Millisecond)}
		l.poke()
	case fsm.EventQueueLeased, fsm.EventQueueSettled:
		l.observeQueue(now, e)
	}
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
	e, ok := l.sessions[id]
	if !ok || e.expiring {
		return 0, fsm.ErrSessionNotFound
	}
	e.deadline = l.clk.Now().Add(e.ttl)
	return e.ttl, nil
}

// due collects what must be proposed now and when to look again.
func (l *Lessor) due() (expire []uint64, ends []*fsmpb.EndLockDelay, next time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	next = time.Hour
	if !l.leader {
		return nil, nil, next
	}
	now := l.clk.Now()
	for id, e := range l.sessions {
		if e.expiring {
			continue
		}
		if left := e.deadline.Sub(now); left > 0 {
			next = min(next, left)
			continue
		}
		e.expiring = true
		expire = append(expire, id)
	}
	for name, d := range l.delays {
		if left := d.at.Sub(now); left > 0 {
			next = min(next, left)
			continue
		}
		delete(l.delays, name)
		ends = append(ends, &fsmpb.EndLockDelay{Name: name, Generation: d.gen})
	}
	return expire, ends, next
}

// Run proposes expiries until ctx ends.
func (l *Lessor) Run(ctx context.Context) error {
	for {
		expire, ends, next := l.due()
		qdue, qnext := l.dueQueue()
		next = min(next, qnext)
		for _, id := range expire {
			_, err := l.propose(ctx, &fsmpb.Command{Op: &fsmpb.Command_ExpireSession{ExpireSession: &fsmpb.ExpireSession{Session: id}}})
			if err != nil && !errors.Is(err, fsm.ErrSessionNotFound) {
				l.retryExpiry(id)
			}
		}
		for _, end := range ends {
			_, _ = l.propose(ctx, &fsmpb.Command{Op: &fsmpb.Command_EndLockDelay{EndLockDelay: end}})
		}
		l.expireQueue(ctx, qdue)
		if len(expire)+len(ends)+len(qdue) > 0 {
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

// retryBackoff is how long the lessor waits before proposing an expiry
// again after a failed proposal.
const retryBackoff = 100 * time.Millisecond

// retryExpiry re-arms a session whose expiry could not be proposed (for
// example a timeout); if leadership was lost, Demote has cleared it anyway.
func (l *Lessor) retryExpiry(id uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.sessions[id]; ok {
		e.expiring = false
		e.deadline = l.clk.Now().Add(retryBackoff)
	}
}
