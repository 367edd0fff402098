//go:build tenurefault

package server_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/clock"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/node"
)

// gate holds the callers of a fault hook for one node while it is shut:
// reached is signalled (once per shutting) when the first of them arrives.
type gate struct {
	target  atomic.Pointer[string]
	mu      sync.Mutex
	open    chan struct{}
	reached chan struct{}
}

// shut makes the hook hold node id's callers until release; the channel
// it returns is closed when the first of them arrives.
func (g *gate) shut(id string) <-chan struct{} {
	g.mu.Lock()
	g.open, g.reached = make(chan struct{}), make(chan struct{})
	reached := g.reached
	g.mu.Unlock()
	g.target.Store(&id)
	return reached
}

// release lets every held caller go on (idempotent).
func (g *gate) release() {
	g.target.Store(nil)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.open != nil {
		close(g.open)
		g.open = nil
	}
}

// hook is the fault hook.
func (g *gate) hook(id string) {
	if t := g.target.Load(); t == nil || *t != id {
		return
	}
	g.mu.Lock()
	open, reached := g.open, g.reached
	if reached != nil {
		close(reached)
		g.reached = nil
	}
	g.mu.Unlock()
	if open != nil {
		<-open
	}
}

func putKV(ctx context.Context, n *node.Node, key, value string) error {
	_, err := n.Propose(ctx, &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: key, Value: []byte(value)}}})
	return err
}

func getKV(n *node.Node, key string) string {
	var v string
	n.Read(func(s *fsm.State) {
		if kv, ok := s.KVGet(key); ok {
			v = string(kv.Value)
		}
	})
	return v
}

// TestDeposedLeaderServesNoStaleRead: a linearizable read that began on
// the leader, and was held (as a paused leader is) after the leader read
// its term and commit index, does not answer from the old state once the
// leader is cut off and a new leader has acknowledged a write: its read
// round finds no majority in its term, and the read fails with
// ErrNotLeader. A read path that trusted the leadership it saw when the
// read began (or a lease that outlived the pause) would answer "1".
func TestDeposedLeaderServesNoStaleRead(t *testing.T) {
	var g gate
	lc := startLinkedMembersFaults(t, 3, clock.Real, node.Faults{BeforeReadRound: g.hook})
	t.Cleanup(g.release) // before the members stop
	li := lc.leader(t)
	old := lc.ms[li].d.Node
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := putKV(ctx, old, "k", "1"); err != nil {
		t.Fatal(err)
	}

	reached := g.shut(lc.ms[li].id)
	type result struct {
		err   error
		value string
	}
	done := make(chan result, 1)
	go func() {
		err := old.LinearizableRead(ctx)
		done <- result{err, getKV(old, "k")}
	}()
	select {
	case <-reached:
	case r := <-done:
		t.Fatalf("the read ended (%v) without a read round", r.err)
	case <-time.After(20 * time.Second):
		t.Fatal("the read never reached its read round")
	}

	lc.cut(li, false)
	deadline := time.Now().Add(30 * time.Second)
	for acked := false; !acked; {
		for i, m := range lc.ms {
			if i == li {
				continue
			}
			pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
			err := putKV(pctx, m.d.Node, "k", "2")
			pcancel()
			if err == nil {
				acked = true
				break
			}
		}
		if !acked && time.Now().After(deadline) {
			t.Fatal("no new leader acknowledged the write")
		}
	}

	g.release()
	r := <-done
	if r.err == nil {
		t.Fatalf("a leader cut off before a new leader acknowledged k=2 answered a linearizable read with k=%q", r.value)
	}
	if !errors.Is(r.err, node.ErrNotLeader) {
		t.Fatalf("read on the deposed leader: %v, want ErrNotLeader", r.err)
	}
}

// TestReadDoesNotQueueBehindLeaderAppend: with the leader's log append
// stalled (raft's leader loop is stuck in it, as it is in a slow fsync),
// a linearizable read on the leader still answers, from the state before
// the stalled write, which is not acknowledged; once the append goes on
// and the write is acknowledged, a read sees it. A read confirmed through
// raft's leader loop (VerifyLeader) waits for the append.
func TestReadDoesNotQueueBehindLeaderAppend(t *testing.T) {
	var g gate
	lc := startLinkedMembersFaults(t, 3, clock.Real, node.Faults{BeforeAppend: g.hook})
	t.Cleanup(g.release)
	li := lc.leader(t)
	leader := lc.ms[li].d.Node
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := putKV(ctx, leader, "k", "1"); err != nil {
		t.Fatal(err)
	}

	reached := g.shut(lc.ms[li].id)
	put := make(chan error, 1)
	go func() { put <- putKV(ctx, leader, "k", "2") }()
	select {
	case <-reached:
	case err := <-put:
		t.Fatalf("the write ended (%v) without appending", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the write never reached the leader's log append")
	}

	read := make(chan error, 1)
	go func() { read <- leader.LinearizableRead(ctx) }()
	select {
	case err := <-read:
		if err != nil {
			t.Fatalf("read while the append is stalled: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a linearizable read waited for the leader's stalled log append")
	}
	if v := getKV(leader, "k"); v != "1" {
		t.Fatalf("k = %q before the write was acknowledged, want 1", v)
	}

	g.release()
	if err := <-put; err != nil {
		t.Fatalf("the write after the stall: %v", err)
	}
	if err := leader.LinearizableRead(ctx); err != nil {
		t.Fatal(err)
	}
	if v := getKV(leader, "k"); v != "2" {
		t.Fatalf("k = %q after the write was acknowledged, want 2", v)
	}
}
