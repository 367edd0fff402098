package zkapi_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestFollowersServeAndKeepSessions: in a 3-node cluster a client of a
// follower writes (relayed to the leader), reads its writes there, and
// gets its watch events from the follower's applied state; when the
// leader stops, the client reconnects to a member with its session,
// which keeps its ephemeral node.
func TestFollowersServeAndKeepSessions(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster")
	}
	root := t.TempDir()
	ids := []string{"n1", "n2", "n3"}
	peers := map[string]string{}
	for _, id := range ids {
		peers[id] = testutil.FreeAddr(t, 61000, 65000)
	}
	daemons := map[string]*daemon.Daemon{}
	stops := map[string]func(){}
	for _, id := range ids {
		d, err := daemon.Start(daemon.Config{NodeID: id, DataDir: filepath.Join(root, id), Listen: "127.0.0.1:0", ZkListen: "127.0.0.1:0",
			ZkMinSessionTimeout: time.Second, ZkMaxSessionTimeout: 30 * time.Second,
			PeerListen: peers[id], BootstrapPeers: peers, LogOutput: testutil.LogWriter(t, id)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		stopped := false
		stops[id] = func() {
			if !stopped {
				stopped = true
				cancel()
				<-done
			}
		}
		t.Cleanup(stops[id])
		daemons[id] = d
	}
	leaderOf := func() string {
		for id, d := range daemons {
			if d.Node.IsLeader() {
				return id
			}
		}
		return ""
	}
	testutil.WaitFor(t, "a leader", 30*time.Second, func() bool { return leaderOf() != "" })
	leader := leaderOf()
	var followers []string
	for _, id := range ids {
		if id != leader {
			followers = append(followers, id)
		}
	}
	// Every member knows the leader's ZooKeeper address.
	testutil.WaitFor(t, "the leader's ZooKeeper address", 30*time.Second, func() bool {
		for _, id := range followers {
			var addr string
			daemons[id].Node.Read(func(st *fsm.State) { addr = st.ZkAddr(leader) })
			if addr != daemons[leader].ZkAddr() {
				return false
			}
		}
		return true
	})
	f1, f2 := daemons[followers[0]].ZkAddr(), daemons[followers[1]].ZkAddr()
	c, _ := connect(t, []string{f1}, 10*time.Second)
	acl := zk.WorldACL(zk.PermAll)
	if _, err := c.Create("/c", []byte("v"), 0, acl); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create("/c/e", nil, zk.FlagEphemeral, acl); err != nil {
		t.Fatal(err)
	}
	// Reads on the follower see the session's own writes at once.
	if _, st, err := c.Get("/c/e"); err != nil || st.EphemeralOwner != c.SessionID() {
		t.Fatalf("get /c/e on the follower: %+v %v", st, err)
	}
	other, _ := connect(t, []string{f2}, 10*time.Second)
	_, _, ch, err := other.GetW("/c")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Set("/c", []byte("w"), 0); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-ch:
		if e.Type != zk.EventNodeDataChanged {
			t.Fatalf("event %+v", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no watch event on the other follower")
	}
	if _, err := other.Sync("/c"); err != nil {
		t.Fatal(err)
	}
	if data, _, err := other.Get("/c"); err != nil || string(data) != "w" {
		t.Fatalf("after sync: %q %v", data, err)
	}

	// The leader stops: the client reconnects with its session.
	id := c.SessionID()
	stops[leader]()
	delete(daemons, leader)
	testutil.WaitFor(t, "a new leader", 30*time.Second, func() bool { return leaderOf() != "" })
	testutil.WaitFor(t, "the write after the election", 30*time.Second, func() bool {
		_, err := c.Set("/c", []byte("after"), -1)
		return err == nil
	})
	if c.SessionID() != id {
		t.Fatalf("the session changed from %d to %d", id, c.SessionID())
	}
	if _, st, err := c.Get("/c/e"); err != nil || st.EphemeralOwner != id {
		t.Fatalf("the ephemeral after the leader change: %+v %v", st, err)
	}
}
