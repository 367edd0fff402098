package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tenure-io/tenure/internal/lessor"
)

// Confirming keepalives. A keepalive confirmed by a node that is no longer
// the only leader would let its client count on a deadline the new leader
// does not keep (docs/architecture.md, safety argument 2). So a leader
// confirms keepalives only within keepAliveLease of the start of a round
// that committed an entry of its current term (a raft barrier, created
// after the round began). Every voter of the majority that stored it had
// not voted in a later term when it did (it would have refused the entry),
// and any later leader is elected by a majority that includes one of
// them: so it is elected, and promotes its sessions, after the round
// began. Its promotion gives every session TTL + promoteAllowance, more
// than keepAliveLease, so every keepalive this node confirms, sent before
// it confirmed it, falls within the new leader's deadline. This holds
// whatever raft's timeouts, and however long this node was paused.
//
// raft's VerifyLeader would not do: the replies that confirm it may answer
// heartbeats or appends sent before it was called (replication.go
// notifyAll), which on a node resuming from a pause can be replies from
// before the pause, waiting in its sockets.
const (
	// keepAliveLease is how long one confirmation of leadership lets the
	// leader confirm keepalives. A round costs one small log entry, so a
	// leader that confirms keepalives all the time adds two a second.
	keepAliveLease = 500 * time.Millisecond
	// promoteAllowance is added to every session's TTL when a node becomes
	// leader: at least keepAliveLease, twice that for clock-rate drift.
	promoteAllowance = 2 * keepAliveLease
	// leaseRounds bounds the rounds one keepalive waits for (each round
	// that ended too late to be of use starts another).
	leaseRounds = 3
)

// leaderLease runs the rounds that confirm leadership; what they
// confirm is published in the node's Leadership (LeaseUntil).
type leaderLease struct {
	// mu guards round.
	mu    sync.Mutex
	round *leaseRound // the confirmation under way, or nil
}

type leaseRound struct {
	done chan struct{}
	err  error // set before done is closed
}

// confirm returns nil once leadership is confirmed now (see KeepAlive). A
// caller that finds no round under way runs one itself; the others wait
// for it.
func (l *leaderLease) confirm(ctx context.Context, n *Node) error {
	for range leaseRounds {
		l.mu.Lock()
		if n.LeadershipConfirmed() {
			l.mu.Unlock()
			return nil
		}
		r := l.round
		if r == nil {
			r = &leaseRound{done: make(chan struct{})}
			l.round = r
			l.mu.Unlock()
			term, began := n.Leadership().Term, n.cfg.Clock.Now()
			r.err = mapReadErr(n.await(context.Background(), func() raft.Future { return n.raft.Barrier(n.cfg.ApplyTimeout) }))
			if r.err == nil {
				n.leaseConfirmed(term, began)
			}
			l.mu.Lock()
			l.round = nil
			l.mu.Unlock()
			close(r.done)
		} else {
			l.mu.Unlock()
			select {
			case <-r.done:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if r.err != nil {
			return r.err
		}
	}
	return fmt.Errorf("%w: leadership could not be confirmed in time", ErrNotLeader)
}

// KeepAlive extends a session on the leader and returns its TTL;
// keepalives never enter the log. It confirms a keepalive only while this
// node's leadership is confirmed (see keepAliveLease): when its last
// confirmation is older, it first commits a barrier, which ctx may cut
// short. It fails with ErrNotLeader on a node that is not the leader, or
// no longer is, and fsm.ErrSessionNotFound for a session that is unknown
// or being expired.
func (n *Node) KeepAlive(ctx context.Context, id uint64) (time.Duration, error) {
	if !n.Serving() {
		return 0, ErrNotLeader
	}
	if err := n.lease.confirm(ctx, n); err != nil {
		return 0, err
	}
	ttl, err := n.lessor.KeepAlive(id)
	if errors.Is(err, lessor.ErrNotLeader) {
		return 0, ErrNotLeader
	}
	return ttl, err
}
