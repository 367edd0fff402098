package node_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/node"
	"github.com/tenure-io/tenure/internal/testutil"
)

// readCounter reads key as the decimal number a put stored in it (0 when
// absent).
func readCounter(t *testing.T, n *node.Node, key string) int64 {
	t.Helper()
	var v int64
	n.Read(func(s *fsm.State) {
		if kv, ok := s.KVGet(key); ok {
			var err error
			if v, err = strconv.ParseInt(string(kv.Value), 10, 64); err != nil {
				t.Errorf("value %q: %v", kv.Value, err)
			}
		}
	})
	return v
}

// TestLinearizableReadSeesEveryAcknowledgedWrite: on a single voter, which
// answers reads without a round of raft's leader loop, a read started
// after a write was acknowledged sees that write (or a later one), with
// writes and reads running concurrently. Each writer counts up its own
// key, so a key below the count acknowledged before the read began is a
// stale read.
func TestLinearizableReadSeesEveryAcknowledgedWrite(t *testing.T) {
	n := openConfig(t, node.Config{DataDir: t.TempDir()})
	readsSeeAcknowledgedWrites(t, n, 3*time.Second)
}

// TestClusterReadSeesEveryAcknowledgedWrite is the same on the leader of
// three voters, whose reads share read rounds (readindex.go): a read
// that joined a round begun before it, or a round that answered before a
// majority confirmed it, could miss a write acknowledged before it began.
func TestClusterReadSeesEveryAcknowledgedWrite(t *testing.T) {
	testutil.Slow(t)
	addrA, addrB, addrC := freeAddr(t), freeAddr(t), freeAddr(t)
	a := openConfig(t, node.Config{NodeID: "a", DataDir: t.TempDir(), PeerAddr: addrA})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	joining(t, "b", addrB)
	joining(t, "c", addrC)
	for _, m := range []struct{ id, addr string }{{"b", addrB}, {"c", addrC}} {
		if err := a.AddVoter(ctx, m.id, m.addr, 0); err != nil {
			t.Fatalf("adding %s: %v", m.id, err)
		}
	}
	readsSeeAcknowledgedWrites(t, a, 3*time.Second)
}

// readsSeeAcknowledgedWrites runs writers and linearizable readers on n
// for d and fails on a read that misses a write acknowledged before it
// began.
func readsSeeAcknowledgedWrites(t *testing.T, n *node.Node, d time.Duration) {
	t.Helper()
	const writers = 4
	var acked [writers]atomic.Int64
	ctx := context.Background()
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "k" + strconv.Itoa(w)
			for i := int64(1); time.Now().Before(end); i++ {
				if _, err := n.Propose(ctx, &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: key, Value: []byte(strconv.FormatInt(i, 10))}}}); err != nil {
					t.Errorf("put: %v", err)
					return
				}
				acked[w].Store(i)
			}
		}()
	}
	var reads atomic.Int64
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				var want [writers]int64
				for w := range writers {
					want[w] = acked[w].Load()
				}
				if err := n.LinearizableRead(ctx); err != nil {
					t.Errorf("read: %v", err)
					return
				}
				for w := range writers {
					if got := readCounter(t, n, "k"+strconv.Itoa(w)); got < want[w] {
						t.Errorf("writer %d: a read begun after %d was acknowledged saw %d", w, want[w], got)
					}
				}
				reads.Add(1)
			}
		}()
	}
	wg.Wait()
	if reads.Load() == 0 || acked[0].Load() == 0 {
		t.Fatalf("%d reads, %d writes acknowledged", reads.Load(), acked[0].Load())
	}
}

// freeAddr is a loopback address nothing listens on.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// joining opens a node that waits to be added to a cluster, and returns
// it with a function that stops it (also run at the end of the test).
func joining(t testing.TB, id, addr string) (*node.Node, func()) {
	t.Helper()
	n, err := node.Open(node.Config{NodeID: id, DataDir: t.TempDir(), PeerAddr: addr, Join: true, LogOutput: io.Discard}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(ctx); close(done) }()
	closeN := sync.OnceFunc(func() { stop(); <-done; n.Close() })
	t.Cleanup(closeN)
	return n, closeN
}

// TestReadNeedsQuorumOnceAVoterIsAdded: a node that is the only voter
// answers reads from its own state; once a second voter is added it must
// confirm its leadership with that voter, so with the second voter gone
// (its majority lost) it answers no read, although it was the sole voter
// a moment before. Once a voter is removed again, the remaining sole
// voter answers reads without it.
func TestReadNeedsQuorumOnceAVoterIsAdded(t *testing.T) {
	testutil.Slow(t)
	addrA, addrB, addrC := freeAddr(t), freeAddr(t), freeAddr(t)
	a := openConfig(t, node.Config{NodeID: "a", DataDir: t.TempDir(), PeerAddr: addrA})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := a.LinearizableRead(ctx); err != nil {
		t.Fatalf("read on the sole voter: %v", err)
	}

	_, closeB := joining(t, "b", addrB)
	if err := a.AddVoter(ctx, "b", addrB, 0); err != nil {
		t.Fatalf("adding b: %v", err)
	}
	propose(t, a, &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: "k", Value: []byte("1")}}})
	if err := a.LinearizableRead(ctx); err != nil {
		t.Fatalf("read with both voters up: %v", err)
	}
	if err := a.RemoveServer(ctx, "b", 0); err != nil {
		t.Fatalf("removing b: %v", err)
	}
	closeB()
	if err := a.LinearizableRead(ctx); err != nil {
		t.Fatalf("read on the sole voter after b was removed: %v", err)
	}
	if got := readCounter(t, a, "k"); got != 1 {
		t.Fatalf("k = %d, want 1", got)
	}

	_, closeC := joining(t, "c", addrC)
	if err := a.AddVoter(ctx, "c", addrC, 0); err != nil {
		t.Fatalf("adding c: %v", err)
	}
	closeC()
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	defer rcancel()
	err := a.LinearizableRead(rctx)
	if err == nil {
		t.Fatal("a leader that lost its only other voter answered a read")
	}
	if !errors.Is(err, node.ErrNotLeader) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read without a majority: %v, want not the leader", err)
	}
}
