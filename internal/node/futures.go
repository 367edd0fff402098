package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// Waiting for raft. Every raft call whose answer this node waits for
// (Apply, Barrier, VerifyLeader, Snapshot, membership changes) goes through
// start and pending.wait: there is no other way to wait on a future here.
//
// raft's futures offer only a blocking Error. raft does not answer every
// future when it shuts down: those still queued for its leader loop or its
// state machine are never answered (hashicorp/raft#498), and a goroutine
// blocked in their Error would wait forever. So:
//
//   - start counts each future (futureSet) before making the raft call,
//     and one goroutine per future waits for raft's answer; the waiter
//     itself selects on that answer, the node's quit and its context;
//   - Close first stops new raft calls (futureSet.close) and closes quit,
//     which answers every waiter at once, then lets raft, still running,
//     answer what is in flight (it answers every future while it runs: a
//     follower refuses, a leader commits or steps down), and only then shuts
//     raft down. No goroutine is left waiting for raft after Close, which
//     TestCloseLeavesNoWaitingGoroutine checks under load.
//
// raft's public API offers no way to wait without a goroutine: Error is
// the only way to learn the answer. A raft that answers nothing for
// closeDrain (a stalled disk) is shut down anyway; the goroutines that
// wait for its queued futures (and drain's own) are then the only ones
// that outlive Close, and Close logs it.
const closeDrain = 5 * time.Second

// errShutDown is the answer to a wait that the node's Close ended, or that
// Close refused to start: the command may or may not have been committed.
// A call refused at Close was not made; it is answered the same way,
// which is what reads and proposals got from raft after its shutdown.
var errShutDown = fmt.Errorf("%w: node shut down before the outcome was known", ErrUnknownOutcome)

// futureSet counts the raft futures this node waits for, so that Close can
// let raft answer them before it shuts raft down.
type futureSet struct {
	// mu guards closed, and orders add against close: once close has
	// returned, no add succeeds and wg only goes down.
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// add counts one more future; false once close was called.
func (s *futureSet) add() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

// close refuses every later add.
func (s *futureSet) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
}

// drain waits until every counted future was answered, or d passes; it
// reports whether they all were.
func (s *futureSet) drain(d time.Duration) bool {
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// pending is a raft future being waited for.
type pending struct {
	n      *Node
	answer chan error // raft's answer, once it came
}

// start makes the raft call call, which returns that call's future, and
// waits for its answer in the background; nil once Close has begun (the
// call is not made then).
func (n *Node) start(call func() raft.Future) *pending {
	if !n.futures.add() {
		return nil
	}
	f := call()
	p := &pending{n: n, answer: make(chan error, 1)}
	go func() {
		defer n.futures.wg.Done()
		p.answer <- f.Error()
	}()
	return p
}

// wait returns the future's error once raft answers; errShutDown if the
// node closes first (the outcome is then unknown); ctx's error if ctx ends
// first. A nil p (start refused) is errShutDown.
func (p *pending) wait(ctx context.Context) error {
	if p == nil {
		return errShutDown
	}
	select {
	case err := <-p.answer:
		return p.n.shutDown(err)
	case <-ctx.Done():
		return ctx.Err()
	case <-p.n.quit:
		select {
		case err := <-p.answer:
			return p.n.shutDown(err)
		default:
			return errShutDown
		}
	}
}

// shutDown is err, or errShutDown for raft's own shutdown while the node
// closes.
func (n *Node) shutDown(err error) error {
	if errors.Is(err, raft.ErrRaftShutdown) && n.closing() {
		return errShutDown
	}
	return err
}

// await makes the raft call call and waits for its future (see start and
// pending.wait).
func (n *Node) await(ctx context.Context, call func() raft.Future) error {
	return n.start(call).wait(ctx)
}

func (n *Node) closing() bool {
	select {
	case <-n.quit:
		return true
	default:
		return false
	}
}

// mapRaftErr maps raft's errors to the node's: ErrNotLeader, ErrClosed,
// or ErrUnknownOutcome for everything that may have been committed.
func mapRaftErr(err error) error {
	switch {
	case errors.Is(err, ErrUnknownOutcome):
		return err
	case errors.Is(err, raft.ErrNotLeader):
		return ErrNotLeader
	case errors.Is(err, raft.ErrRaftShutdown):
		return ErrClosed
	case errors.Is(err, raft.ErrEnqueueTimeout):
		return fmt.Errorf("%w: %v", ErrUnknownOutcome, err)
	case errors.Is(err, raft.ErrLeadershipLost):
		return fmt.Errorf("%w: %v", ErrUnknownOutcome, err)
	}
	return fmt.Errorf("%w: %v", ErrUnknownOutcome, err)
}

// mapReadErr is mapRaftErr for a read's leadership check: a read changes
// nothing, so losing leadership meanwhile leaves no outcome unknown; the
// reader should just ask the leader.
func mapReadErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost):
		return ErrNotLeader
	}
	return mapRaftErr(err)
}
