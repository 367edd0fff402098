package node_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/node"
	"github.com/tenure-io/tenure/internal/testutil"
)

// runIdentity opens cfg and runs it; stop (also run at the end of the
// test) ends Run and closes the node; exited is closed when Run has
// returned, with runErr what it returned.
func runIdentity(t *testing.T, cfg node.Config) (n *node.Node, stop func(), exited <-chan struct{}, runErr *error) {
	t.Helper()
	if cfg.LogOutput == nil {
		cfg.LogOutput = io.Discard
	}
	n, err := node.Open(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var ran error
	go func() { ran = n.Run(ctx); close(done) }()
	stop = sync.OnceFunc(func() { cancel(); <-done; n.Close() })
	t.Cleanup(stop)
	return n, stop, done, &ran
}

// clusterOf waits until n's state holds its cluster id (drawn by the first
// leader) and returns it.
func clusterOf(t *testing.T, n *node.Node) []byte {
	t.Helper()
	testutil.WaitFor(t, "the cluster id", 20*time.Second, func() bool { return len(n.Security().ClusterID) > 0 })
	return n.Security().ClusterID
}

// dirState lists every file under dir with its size and modification
// time: what a start that writes nothing leaves unchanged.
func dirState(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if !d.IsDir() {
			fmt.Fprintf(&b, "%s %d %d\n", path, info.Size(), info.ModTime().UnixNano())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestOtherNodeIDRefused: a data directory started with a --node-id other
// than the one it was created for is refused at once, with one line naming
// both, and nothing in it is written. (Before, raft started with a
// configuration that did not name the node and waited forever, "not part
// of a stable configuration".)
func TestOtherNodeIDRefused(t *testing.T) {
	testutil.Slow(t)
	dir := t.TempDir()
	n1, stop, _, _ := runIdentity(t, node.Config{NodeID: "n1", DataDir: dir, PeerAddr: freeAddr(t)})
	<-n1.Ready()
	cluster := clusterOf(t, n1)
	stop()

	before := dirState(t, dir)
	start := time.Now()
	n9, err := node.Open(node.Config{NodeID: "n9", DataDir: dir, PeerAddr: freeAddr(t), LogOutput: io.Discard}, nil)
	if err == nil {
		n9.Close()
		t.Fatal("n1's data directory opened as n9")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("refused after %v", took)
	}
	msg := err.Error()
	if !strings.Contains(msg, "n1") || !strings.Contains(msg, "n9") || !strings.Contains(msg, fsm.ClusterIDString(cluster)) || strings.Contains(msg, "\n") {
		t.Fatalf("refusal does not name both nodes and the cluster in one line: %q", msg)
	}
	if !errors.Is(err, node.ErrOtherNode) {
		t.Fatalf("refusal %v is not ErrOtherNode", err)
	}
	if after := dirState(t, dir); after != before {
		t.Fatalf("the refused start wrote into the directory:\nbefore\n%safter\n%s", before, after)
	}
	// The right id still opens it.
	n1, _, _, _ = runIdentity(t, node.Config{NodeID: "n1", DataDir: dir, PeerAddr: freeAddr(t)})
	<-n1.Ready()
}

// TestPreviousReleaseDirectoryAdopted: a directory written before the
// identity file existed is adopted at its first start (the node id its
// raft configuration names is recorded, and the cluster id once known);
// started with another node id, which its configuration does not name,
// it is refused rather than left waiting forever.
func TestPreviousReleaseDirectoryAdopted(t *testing.T) {
	testutil.Slow(t)
	dir := t.TempDir()
	addr := freeAddr(t)
	n1, stop, _, _ := runIdentity(t, node.Config{NodeID: "n1", DataDir: dir, PeerAddr: addr})
	cluster := clusterOf(t, n1)
	stop()
	// As the previous release left it: no identity file.
	if err := os.Remove(filepath.Join(dir, "identity")); err != nil {
		t.Fatal(err)
	}
	if n9, err := node.Open(node.Config{NodeID: "n9", DataDir: dir, PeerAddr: freeAddr(t), LogOutput: io.Discard}, nil); err == nil {
		n9.Close()
		t.Fatal("a previous release's directory of n1 opened as n9")
	} else if !errors.Is(err, node.ErrOtherNode) || !strings.Contains(err.Error(), "n1") || !strings.Contains(err.Error(), "n9") {
		t.Fatalf("refusal: %v", err)
	}
	n1, stop, _, _ = runIdentity(t, node.Config{NodeID: "n1", DataDir: dir, PeerAddr: addr})
	<-n1.Ready()
	testutil.WaitFor(t, "the identity file recording the cluster", 10*time.Second, func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, "identity"))
		return bytes.Contains(b, []byte(fsm.ClusterIDString(cluster))) && bytes.Contains(b, []byte(`"n1"`))
	})
	stop()
	if n9, err := node.Open(node.Config{NodeID: "n9", DataDir: dir, PeerAddr: freeAddr(t), LogOutput: io.Discard}, nil); err == nil {
		n9.Close()
		t.Fatal("the adopted directory of n1 opened as n9")
	}
}

// TestForeignClusterNeverWritesIntoDirectory: a node started with --join
// on the data directory of another cluster (here a single-voter cluster
// A's), and then added to cluster B, refuses B's leader: the member add
// fails, the node stops with one line naming both clusters, and the
// directory still holds cluster A's state. (Before, raft let B's leader
// overwrite it.)
func TestForeignClusterNeverWritesIntoDirectory(t *testing.T) {
	testutil.Slow(t)
	dirA := t.TempDir()
	a, stopA, _, _ := runIdentity(t, node.Config{NodeID: "n1", DataDir: dirA, PeerAddr: freeAddr(t)})
	<-a.Ready()
	clusterA := clusterOf(t, a)
	if _, err := a.Propose(context.Background(), &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: "a-only"}}}); err != nil {
		t.Fatal(err)
	}
	stopA()

	b, _, _, _ := runIdentity(t, node.Config{NodeID: "b1", DataDir: t.TempDir(), PeerAddr: freeAddr(t)})
	<-b.Ready()
	clusterB := clusterOf(t, b)
	if bytes.Equal(clusterA, clusterB) {
		t.Fatal("two clusters drew one id")
	}

	addr := freeAddr(t)
	_, stopJ, exited, runErr := runIdentity(t, node.Config{NodeID: "n1", DataDir: dirA, PeerAddr: addr, Join: true})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := b.ProbePeer(ctx, "n1", addr); !errors.Is(err, node.ErrOtherCluster) {
		t.Fatalf("probing the node on cluster A's directory from cluster B: %v, want ErrOtherCluster", err)
	}
	if err := b.AddVoter(ctx, "n1", addr, 0); err == nil {
		t.Fatal("cluster B added a member whose directory is cluster A's")
	}
	select {
	case <-exited:
		err := *runErr
		msg := fmt.Sprint(err)
		if !errors.Is(err, node.ErrOtherCluster) || !strings.Contains(msg, fsm.ClusterIDString(clusterA)) || !strings.Contains(msg, fsm.ClusterIDString(clusterB)) || strings.Contains(msg, "\n") {
			t.Fatalf("the joining node stopped with %q, not one line naming both clusters", msg)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the node on cluster A's directory did not stop when cluster B contacted it")
	}
	stopJ()

	// Cluster A's state is intact: its id, and its key.
	a, _, _, _ = runIdentity(t, node.Config{NodeID: "n1", DataDir: dirA, PeerAddr: freeAddr(t)})
	<-a.Ready()
	if got := a.Security().ClusterID; !bytes.Equal(got, clusterA) {
		t.Fatalf("cluster A's directory now holds cluster %s", fsm.ClusterIDString(got))
	}
	var has bool
	a.Read(func(s *fsm.State) { _, has = s.KVGet("a-only") })
	if !has {
		t.Fatal("cluster A's key is gone")
	}
}

// TestJoiningNodeLearnsClusterID: a node that joins with an empty data
// directory records the cluster that added it, and refuses another one
// from then on.
func TestJoiningNodeLearnsClusterID(t *testing.T) {
	testutil.Slow(t)
	b, _, _, _ := runIdentity(t, node.Config{NodeID: "b1", DataDir: t.TempDir(), PeerAddr: freeAddr(t)})
	<-b.Ready()
	clusterB := clusterOf(t, b)
	addr := freeAddr(t)
	dir := t.TempDir()
	j, _, _, _ := runIdentity(t, node.Config{NodeID: "b2", DataDir: dir, PeerAddr: addr, Join: true})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.AddVoter(ctx, "b2", addr, 0); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the joined node's identity", 10*time.Second, func() bool {
		data, _ := os.ReadFile(filepath.Join(dir, "identity"))
		return bytes.Contains(data, []byte(fsm.ClusterIDString(clusterB)))
	})
	testutil.WaitFor(t, "the joined node's state", 10*time.Second, func() bool { return bytes.Equal(j.Security().ClusterID, clusterB) })
}

// TestFailedFirstStartBelongsToNoNode: a first start that fails before
// the directory is bootstrapped (here its peer port is taken) records no
// node: the directory can be started as another.
func TestFailedFirstStartBelongsToNoNode(t *testing.T) {
	dir := t.TempDir()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	if n, err := node.Open(node.Config{NodeID: "typo", DataDir: dir, PeerAddr: taken.Addr().String(), LogOutput: io.Discard}, nil); err == nil {
		n.Close()
		t.Fatal("started on a peer port in use")
	}
	n, _, _, _ := runIdentity(t, node.Config{NodeID: "n1", DataDir: dir, PeerAddr: freeAddr(t)})
	<-n.Ready()
}
