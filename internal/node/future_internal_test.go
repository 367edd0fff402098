package node

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// heldFuture is a raft future that raft never answers (as raft leaves the
// futures still queued for its leader loop or its state machine when it
// shuts down, hashicorp/raft#498) until the test releases it.
type heldFuture struct{ release chan struct{} }

func (f heldFuture) Error() error { <-f.release; return raft.ErrRaftShutdown }

// TestWaitEndsAtClose: a wait on a future raft has not answered returns
// as soon as the node closes, with an unknown outcome; Close does not shut
// raft down before raft has answered every future it was handed, so no
// goroutine is left waiting for one after Close.
func TestWaitEndsAtClose(t *testing.T) {
	n, err := Open(Config{DataDir: t.TempDir(), LogOutput: io.Discard}, nil)
	if err != nil {
		t.Fatal(err)
	}
	held := heldFuture{release: make(chan struct{})}
	p := n.start(func() raft.Future { return held })
	waited := make(chan error, 1)
	go func() { waited <- p.wait(context.Background()) }()
	closed := make(chan error, 1)
	go func() { closed <- n.Close() }()

	select {
	case err := <-waited:
		if !errors.Is(err, ErrUnknownOutcome) {
			t.Fatalf("wait at Close: %v, want ErrUnknownOutcome", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a wait on an unanswered future did not end at Close")
	}
	// Close waits for raft's answer (up to closeDrain) with raft running:
	// it must neither return nor shut raft down meanwhile. A bounded
	// negative check, not a synchronisation.
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a future it was handed was unanswered", err)
	case <-time.After(300 * time.Millisecond):
	}
	if st := n.raft.State(); st == raft.Shutdown {
		t.Fatal("raft was shut down while a future it was handed was unanswered")
	}
	close(held.release)
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return once every future was answered")
	}
	if !n.futures.drain(5 * time.Second) {
		t.Fatal("a goroutine still waits for a raft future after Close")
	}
}

// TestRaftFuturesEndAtClose: the futures of Barrier and VerifyLeader, the
// waits of every read and keepalive, are answered by raft before Close
// returns, and once Close has begun no raft call is waited for any more
// (start refuses it: the call is not made).
func TestRaftFuturesEndAtClose(t *testing.T) {
	n := openRunning(t, Config{DataDir: t.TempDir()})
	for name, call := range map[string]func() raft.Future{
		"Barrier":      func() raft.Future { return n.raft.Barrier(time.Second) },
		"VerifyLeader": func() raft.Future { return n.raft.VerifyLeader() },
	} {
		if err := n.await(context.Background(), call); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	p1 := n.start(func() raft.Future { return n.raft.Barrier(time.Second) })
	p2 := n.start(func() raft.Future { return n.raft.VerifyLeader() })
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if !n.futures.drain(5 * time.Second) {
		t.Fatal("a goroutine still waits for a raft future after Close")
	}
	for _, p := range []*pending{p1, p2} {
		if err := p.wait(context.Background()); err != nil && !errors.Is(err, ErrUnknownOutcome) {
			t.Errorf("wait after Close: %v, want nil or ErrUnknownOutcome", err)
		}
	}
	called := false
	if p := n.start(func() raft.Future { called = true; return n.raft.Barrier(time.Second) }); p != nil || called {
		t.Fatal("a raft call was started after Close")
	}
	if err := n.await(context.Background(), func() raft.Future { return n.raft.Barrier(time.Second) }); !errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("await after Close: %v, want ErrUnknownOutcome", err)
	}
}
