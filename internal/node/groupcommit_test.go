package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

func openForGroupCommit(t *testing.T, wait time.Duration) *Node {
	t.Helper()
	return openRunning(t, Config{DataDir: t.TempDir(), GroupCommitWait: wait})
}

// commitWaits records the batcher's group-commit waits (an Observer).
type commitWaits struct {
	waits chan bool // gained, per wait
}

func (w *commitWaits) LogAppend(time.Duration) {}
func (w *commitWaits) Batch(int)               {}
func (w *commitWaits) LeaderChanged(string)    {}
func (w *commitWaits) GroupCommitWait(gained bool) {
	select {
	case w.waits <- gained:
	default:
	}
}

// openRunning opens a node with cfg (its log discarded), runs it until the
// test ends and waits until it serves.
func openRunning(t testing.TB, cfg Config) *Node {
	t.Helper()
	cfg.LogOutput = io.Discard
	n, err := Open(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; n.Close() })
	select {
	case <-n.Ready():
	case <-time.After(20 * time.Second):
		t.Fatal("node not ready")
	}
	return n
}

// put is a command that is valid in any state (a fenced put's token must
// have been issued).
func put(key string) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: key}}}
}

// TestGroupCommitWaitsForTheReturningProposer: after a batch of two, a
// lone proposal waits for a second one, and both share one log entry
// (one write), which is what halves a lock hand-off.
func TestGroupCommitWaitsForTheReturningProposer(t *testing.T) {
	w := &commitWaits{waits: make(chan bool, 1)}
	n := openRunning(t, Config{DataDir: t.TempDir(), GroupCommitWait: time.Minute, Observer: w}) // the partner always comes in time
	n.lastBatch.Store(2)
	before := n.raft.LastIndex()

	first := make(chan error, 1)
	n.ProposeAsync(put("a"), func(_ fsm.Result, err error) { first <- err })
	// "a" is taken by the batcher, alone: it waits for company.
	deadline := time.Now().Add(10 * time.Second)
	for len(n.proposals) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the batcher did not take the lone proposal")
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := n.Propose(context.Background(), put("b")); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if got := n.raft.LastIndex() - before; got != 1 {
		t.Fatalf("two proposals took %d log entries, want 1", got)
	}
	select {
	case gained := <-w.waits:
		if !gained {
			t.Fatal("the wait for company was reported as missed")
		}
	default: // "b" came before the batcher had finished draining: no wait was needed
	}
}

// TestGroupCommitWaitIsBounded: a lone proposal whose partner never comes
// is written once the wait ends; with the wait disabled, it never waits.
func TestGroupCommitWaitIsBounded(t *testing.T) {
	for _, tc := range []struct {
		name   string
		wait   time.Duration
		linger bool
	}{{"bounded", 20 * time.Millisecond, true}, {"disabled", -1, false}} {
		t.Run(tc.name, func(t *testing.T) {
			w := &commitWaits{waits: make(chan bool, 1)}
			n := openRunning(t, Config{DataDir: t.TempDir(), GroupCommitWait: tc.wait, Observer: w})
			n.lastBatch.Store(2)
			if _, err := n.Propose(context.Background(), put("a")); err != nil {
				t.Fatal(err)
			}
			var waited, gained bool
			select { // reported by the batcher before it wrote the entry
			case gained = <-w.waits:
				waited = true
			default:
			}
			if waited != tc.linger || gained {
				t.Fatalf("waited for company: %v (gained %v), want %v (and nothing gained)", waited, gained, tc.linger)
			}
		})
	}
}

// TestProposeAsyncAnswersEveryCommandInOrder: every asynchronous proposal
// gets exactly one answer, and commands proposed one after another are
// committed in that order.
func TestProposeAsyncAnswersEveryCommandInOrder(t *testing.T) {
	n := openForGroupCommit(t, 0)
	const count = 200
	type answer struct {
		i   int
		rev uint64
		err error
	}
	answers := make(chan answer, count)
	for i := range count {
		n.ProposeAsync(put(fmt.Sprintf("k%d", i)), func(res fsm.Result, err error) { answers <- answer{i, res.Revision, err} })
	}
	var last uint64
	seen := make(map[int]bool)
	for k := range count {
		a := <-answers
		if a.i != k {
			t.Fatalf("answer %d is for proposal %d: not in the order proposed", k, a.i)
		}
		if a.err != nil || seen[a.i] {
			t.Fatalf("proposal %d: err %v, answered before: %v", a.i, a.err, seen[a.i])
		}
		seen[a.i] = true
		if a.rev <= last {
			t.Fatalf("proposal %d committed at revision %d, after %d", a.i, a.rev, last)
		}
		last = a.rev
	}
	n.Close()
	closed := make(chan error, 1)
	n.ProposeAsync(put("late"), func(_ fsm.Result, err error) { closed <- err })
	if err := <-closed; !errors.Is(err, ErrClosed) {
		t.Fatalf("a proposal after close: %v, want ErrClosed", err)
	}
}
