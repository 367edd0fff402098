//go:build tenurefault

package zkapi_test

import (
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/node"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestRelayFallsBackToThePublishedAddress: members that refuse relay
// connections over the peer port as an older release does (raft closes
// them unanswered) are reached at the ZooKeeper address their leader
// published: a client of a follower writes, reads its write, and its
// ephemeral belongs to its session, as before the peer-port relay.
func TestRelayFallsBackToThePublishedAddress(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster")
	}
	cl := startZkCluster(t, func(id string, cfg *daemon.Config) {
		cfg.ZkListen = "127.0.0.1:0"
		cfg.Faults = node.Faults{RefuseZkRelay: true}
	})
	leaderZk := cl.daemons[cl.leader].ZkAddr()
	testutil.WaitFor(t, "the leader's published ZooKeeper address", 30*time.Second, func() bool {
		var addr string
		cl.daemons[cl.followers[0]].Node.Read(func(st *fsm.State) { addr = st.ZkAddr(cl.leader) })
		return addr == leaderZk
	})
	c, _ := connect(t, []string{cl.daemons[cl.followers[0]].ZkAddr()}, 10*time.Second)
	if _, err := c.Create("/old", []byte("v"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatalf("create through a follower whose leader refuses the relay: %v", err)
	}
	if _, err := c.Create("/old/e", nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Set("/old", []byte("w"), 0); err != nil {
		t.Fatal(err)
	}
	if data, _, err := c.Get("/old"); err != nil || string(data) != "w" {
		t.Fatalf("read own write: %q %v", data, err)
	}
	if _, st, err := c.Get("/old/e"); err != nil || st.EphemeralOwner != c.SessionID() {
		t.Fatalf("the ephemeral: %+v %v", st, err)
	}
}
