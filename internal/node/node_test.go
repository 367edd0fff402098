package node_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/node"
	"github.com/tenure-io/tenure/internal/testutil"
)

func open(t *testing.T, dir, engine string) *node.Node {
	t.Helper()
	return openConfig(t, node.Config{DataDir: dir, LogStore: engine})
}

func export(n *node.Node) []byte {
	var b []byte
	n.Read(func(s *fsm.State) { b, _ = proto.MarshalOptions{Deterministic: true}.Marshal(s.Export()) })
	return b
}

func propose(t *testing.T, n *node.Node, cmd *fsmpb.Command) fsm.Result {
	t.Helper()
	res, err := n.Propose(context.Background(), cmd)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestRestartKeepsStateAndTokensGrow: after a restart (from the log alone,
// and from a snapshot plus log), the state is identical and the next grant's
// token is larger than every earlier one.
func TestRestartKeepsStateAndTokensGrow(t *testing.T) {
	testutil.Slow(t)
	for _, engine := range []string{"bolt", "wal"} {
		t.Run(engine, func(t *testing.T) {
			dir := t.TempDir()
			n := open(t, dir, engine)
			sess := propose(t, n, &fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: "a", TtlMs: 60_000}}}).Session
			var last uint64
			for i := 0; i < 50; i++ {
				if i == 25 {
					if err := n.Snapshot(); err != nil {
						t.Fatal(err)
					}
				}
				g := propose(t, n, &fsmpb.Command{Op: &fsmpb.Command_Acquire{Acquire: &fsmpb.Acquire{Session: sess, Name: "l"}}})
				if !g.Granted || g.Token <= last {
					t.Fatalf("grant %+v after %d", g, last)
				}
				last = g.Token
				propose(t, n, &fsmpb.Command{Op: &fsmpb.Command_Release{Release: &fsmpb.Release{Session: sess, Name: "l", Token: g.Token}}})
			}
			before := export(n)
			n.Close()

			n2 := open(t, dir, engine)
			if string(export(n2)) != string(before) {
				t.Fatal("state after restart differs")
			}
			g := propose(t, n2, &fsmpb.Command{Op: &fsmpb.Command_Acquire{Acquire: &fsmpb.Acquire{Session: sess, Name: "l"}}})
			if g.Token <= last {
				t.Fatalf("token %d after restart not above %d", g.Token, last)
			}
		})
	}
}

func TestEngineMismatchRefused(t *testing.T) {
	dir := t.TempDir()
	n := open(t, dir, "bolt")
	n.Close()
	if _, err := node.Open(node.Config{DataDir: dir, LogStore: "wal", LogOutput: io.Discard}, nil); err == nil {
		t.Fatal("opening a bolt data dir with wal succeeded")
	}
}

// TestEngineDetected: a directory made with the non-default engine (bolt)
// reopens on it when no engine is named, with its state.
func TestEngineDetected(t *testing.T) {
	dir := t.TempDir()
	n := open(t, dir, "bolt")
	propose(t, n, &fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: "a", TtlMs: 60_000}}})
	before := export(n)
	n.Close()
	n2 := open(t, dir, "") // no engine named: the directory's own is used
	if string(export(n2)) != string(before) {
		t.Fatal("state lost when reopening without naming the engine")
	}
}

// TestCloseAnswersEveryProposal: closing a node under a stream of
// proposals answers every one of them (applied, closed or outcome unknown)
// and Close itself returns; raft alone leaves a future that was already on
// its way to the state machine unanswered at shutdown.
func TestCloseAnswersEveryProposal(t *testing.T) {
	testutil.Slow(t)
	for round := 0; round < 10; round++ {
		n := open(t, t.TempDir(), "wal")
		const workers = 16
		answered := make(chan struct{}, workers)
		started := make(chan struct{}, workers)
		for w := 0; w < workers; w++ {
			go func() {
				defer func() { answered <- struct{}{} }()
				for i := 1; ; i++ {
					cmd := &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: fmt.Sprint("k", w)}}}
					_, err := n.Propose(context.Background(), cmd)
					if i == 1 {
						started <- struct{}{}
					}
					if err != nil {
						return // closed, or outcome unknown
					}
				}
			}()
		}
		for w := 0; w < workers; w++ {
			<-started
		}
		closed := make(chan error, 1)
		go func() { closed <- n.Close() }()
		deadline := time.After(30 * time.Second)
		for w := 0; w < workers; w++ {
			select {
			case <-answered:
			case <-deadline:
				t.Fatalf("round %d: %d proposals never answered after Close", round, workers-w)
			}
		}
		select {
		case <-closed:
		case <-deadline:
			t.Fatalf("round %d: Close did not return", round)
		}
	}
}

func openConfig(t *testing.T, cfg node.Config) *node.Node {
	t.Helper()
	return node.OpenRunning(t, cfg)
}

// TestRetentionConfiguredOnPromotion: a node configured with a retention
// puts it into the replicated state when it becomes leader (before it is
// ready); a later start without the setting keeps the cluster's value;
// out-of-range values are refused at start.
func TestRetentionConfiguredOnPromotion(t *testing.T) {
	testutil.Slow(t)
	dir := t.TempDir()
	retention := func(n *node.Node) (h, m int) {
		n.Read(func(s *fsm.State) { h, m = s.Retention() })
		return
	}
	n := openConfig(t, node.Config{DataDir: dir, LockHistory: 5, RegisterOpMemory: 7})
	if h, m := retention(n); h != 5 || m != 7 {
		t.Fatalf("retention %d/%d, want 5/7", h, m)
	}
	n.Close()
	n = openConfig(t, node.Config{DataDir: dir})
	if h, m := retention(n); h != 5 || m != 7 {
		t.Fatalf("retention after a restart without flags %d/%d, want 5/7", h, m)
	}
	n.Close()
	n = openConfig(t, node.Config{DataDir: dir, LockHistory: 9})
	if h, m := retention(n); h != 9 || m != 7 {
		t.Fatalf("retention %d/%d, want 9/7", h, m)
	}
	n.Close()
	if _, err := node.Open(node.Config{DataDir: t.TempDir(), LockHistory: fsm.MaxHistoryLimit + 1, LogOutput: io.Discard}, nil); !errors.Is(err, fsm.ErrInvalid) {
		t.Fatalf("out-of-range lock history: %v", err)
	}
}

// TestSnapshotByLogSize: once SnapshotBytes of log entries were stored
// since the last snapshot, the node takes one, however few the entries.
func TestSnapshotByLogSize(t *testing.T) {
	dir := t.TempDir()
	n, err := node.Open(node.Config{DataDir: dir, LogOutput: io.Discard, SnapshotBytes: 1 << 20}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(ctx); close(done) }()
	defer func() { cancel(); <-done; n.Close() }()
	<-n.Ready()
	snapshots := func() int {
		entries, _ := os.ReadDir(filepath.Join(dir, "snapshots", "snapshots"))
		return len(entries)
	}
	put := &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: "k", Value: make([]byte, 64<<10)}}}
	for range 8 { // 512 KiB
		if _, err := n.Propose(ctx, put); err != nil {
			t.Fatal(err)
		}
	}
	if s := snapshots(); s != 0 {
		t.Fatalf("%d snapshots after half of SnapshotBytes", s)
	}
	for range 10 {
		if _, err := n.Propose(ctx, put); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for snapshots() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no snapshot after more than SnapshotBytes of log")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
