package node

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// TestWorkStartsInRun: Open starts none of the node's own goroutines; a
// proposal made before Run is queued, not committed, and is committed
// once Run starts; one still queued when Close comes without Run is
// answered ErrClosed (ProposeAsync's then is called exactly once).
func TestWorkStartsInRun(t *testing.T) {
	n, err := Open(Config{DataDir: t.TempDir(), LogOutput: io.Discard}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); n.raft.State() != raft.Leader; {
		if time.Now().After(deadline) {
			t.Fatal("no leadership")
		}
		time.Sleep(10 * time.Millisecond) // a poller with a deadline
	}
	put := &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: "k"}}}
	answered := make(chan error, 1)
	n.ProposeAsync(put, func(_ fsm.Result, err error) { answered <- err })
	if n.workStarted {
		t.Fatal("Open started the node's goroutines")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(ctx); close(done) }()
	select {
	case err := <-answered:
		if err != nil {
			t.Fatalf("a proposal queued before Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a proposal queued before Run was not committed once Run started")
	}
	cancel()
	<-done
	n.Close()

	n, err = Open(Config{DataDir: t.TempDir(), LogOutput: io.Discard}, nil)
	if err != nil {
		t.Fatal(err)
	}
	n.ProposeAsync(put, func(_ fsm.Result, err error) { answered <- err })
	n.Close()
	select {
	case err := <-answered:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("a proposal queued when Close came without Run: %v, want ErrClosed", err)
		}
	default:
		t.Fatal("a proposal queued when Close came without Run was never answered")
	}
}
