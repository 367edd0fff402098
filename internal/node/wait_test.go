package node_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/node"
	"github.com/tenure-io/tenure/internal/testutil"
)

// waiting counts the goroutines whose stack is in node's code that waits
// for raft's futures (futures.go: start's goroutine, pending.wait).
func waiting() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "tenure/internal/node.(*Node).start") || strings.Contains(g, "tenure/internal/node.(*pending).wait") || strings.Contains(g, "tenure/internal/node.(*Node).await") {
			n++
		}
	}
	return n
}

// TestCloseLeavesNoWaitingGoroutine: raft leaves a future that was on its
// way to the state machine unanswered when it shuts down; Close must
// still leave no goroutine behind waiting for it, however many proposals
// and reads were in flight.
func TestCloseLeavesNoWaitingGoroutine(t *testing.T) {
	testutil.Slow(t)
	for round := 0; round < 20; round++ {
		n := open(t, t.TempDir(), "wal")
		const workers = 32
		started := make(chan struct{}, workers)
		done := make(chan struct{}, workers)
		for w := 0; w < workers; w++ {
			go func() {
				defer func() { done <- struct{}{} }()
				for i := 1; ; i++ {
					var err error
					if w%4 == 0 {
						err = n.LinearizableRead(context.Background())
					} else {
						_, err = n.Propose(context.Background(), &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: fmt.Sprint("k", w)}}})
					}
					if i == 1 {
						started <- struct{}{}
					}
					if err != nil {
						return
					}
				}
			}()
		}
		for w := 0; w < workers; w++ {
			<-started
		}
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
		deadline := time.After(20 * time.Second)
		for w := 0; w < workers; w++ {
			select {
			case <-done:
			case <-deadline:
				t.Fatalf("round %d: %d proposals or reads never returned after Close", round, workers-w)
			}
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for waiting() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // a poller: goroutines that are ending
	}
	if k := waiting(); k > 0 {
		t.Fatalf("%d goroutines still wait for raft futures after Close", k)
	}
}

// TestLinearizableReadRefusesExpiredContext: a read whose context has
// already ended is refused with the context's error; it never becomes a
// barrier without a bound (raft takes a timeout of 0 for none).
func TestLinearizableReadRefusesExpiredContext(t *testing.T) {
	n := openConfig(t, node.Config{DataDir: t.TempDir()})
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if err := n.LinearizableRead(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read with an expired context: %v, want DeadlineExceeded", err)
	}
	if err := n.LinearizableRead(context.Background()); err != nil {
		t.Fatalf("read: %v", err)
	}
}
