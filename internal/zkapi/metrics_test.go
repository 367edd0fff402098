package zkapi_test

import (
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/testutil"
)

// gauge is the value of the gauge name (with label kind, when given) d's
// registry exposes; -1 when it exposes none.
func gauge(t *testing.T, d *daemon.Daemon, name, kind string) float64 {
	t.Helper()
	var pairs []string
	if kind != "" {
		pairs = []string{"kind", kind}
	}
	if v, ok := metricValue(t, d, name, pairs...); ok {
		return v
	}
	return -1
}

// TestFrontMetrics: the ZooKeeper front's gauges follow its znodes,
// ephemerals, connections and watches, and return to nothing when the
// client is gone.
func TestFrontMetrics(t *testing.T) {
	d, addr := startNode(t, nil)
	// The root, /zookeeper, /zookeeper/quota and /zookeeper/config.
	for _, g := range []struct {
		name string
		want float64
	}{{"tenure_zk_znodes", 4}, {"tenure_zk_ephemerals", 0}, {"tenure_zk_watches", 0}, {"tenure_zk_watch_bytes", 0}} {
		if got := gauge(t, d, g.name, ""); got != g.want {
			t.Errorf("%s = %v before any client, want %v", g.name, got, g.want)
		}
	}
	emptyBytes := gauge(t, d, "tenure_zk_znode_bytes", "")
	c, _ := connect(t, []string{addr}, 5*time.Second)
	acl := zk.WorldACL(zk.PermAll)
	if _, err := c.Create("/p", []byte("data"), 0, acl); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create("/p/e", nil, zk.FlagEphemeral, acl); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := c.GetW("/p"); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := c.ChildrenW("/p"); err != nil {
		t.Fatal(err)
	}
	for _, g := range []struct {
		name, kind string
		want       float64
	}{
		{"tenure_zk_znodes", "", 6},
		{"tenure_zk_ephemerals", "", 1},
		{"tenure_zk_connections", "client", 1},
		{"tenure_zk_connections", "relayed", 0},
		{"tenure_zk_watches", "", 2},
	} {
		if got := gauge(t, d, g.name, g.kind); got != g.want {
			t.Errorf("%s{%s} = %v, want %v", g.name, g.kind, got, g.want)
		}
	}
	// "/p" + "data" + "/p/e", and an ACL each.
	if got := gauge(t, d, "tenure_zk_znode_bytes", ""); got <= emptyBytes+9 {
		t.Errorf("tenure_zk_znode_bytes = %v with two znodes, %v without", got, emptyBytes)
	}
	if got := gauge(t, d, "tenure_zk_watch_bytes", ""); got <= 0 {
		t.Errorf("tenure_zk_watch_bytes = %v with two watches", got)
	}
	c.Close()
	testutil.WaitFor(t, "the gauges to drop the closed client's session, connection and watches", 10*time.Second, func() bool {
		return gauge(t, d, "tenure_zk_ephemerals", "") == 0 && gauge(t, d, "tenure_zk_znodes", "") == 5 &&
			gauge(t, d, "tenure_zk_connections", "client") == 0 && gauge(t, d, "tenure_zk_watches", "") == 0 &&
			gauge(t, d, "tenure_zk_watch_bytes", "") == 0 && gauge(t, d, "tenure_zk_queued_bytes", "") == 0
	})
}

// TestFrontMetricsRelayed: a client of a follower counts as a client
// connection there and as a relayed one on the leader, where its
// watches are not (the follower serves them).
func TestFrontMetricsRelayed(t *testing.T) {
	testutil.Slow(t)
	cl := startZkCluster(t, func(id string, cfg *daemon.Config) { cfg.ZkListen = "127.0.0.1:0" })
	follower, leader := cl.daemons[cl.followers[0]], cl.daemons[cl.leader]
	c, _ := connect(t, []string{follower.ZkAddr()}, 5*time.Second)
	if _, _, _, err := c.ExistsW("/nothing"); err != nil {
		t.Fatal(err)
	}
	for _, g := range []struct {
		d          *daemon.Daemon
		who        string
		name, kind string
		want       float64
	}{
		{follower, "follower", "tenure_zk_connections", "client", 1},
		{follower, "follower", "tenure_zk_watches", "", 1},
		{leader, "leader", "tenure_zk_connections", "relayed", 1},
		{leader, "leader", "tenure_zk_connections", "client", 0},
		{leader, "leader", "tenure_zk_watches", "", 0},
	} {
		if got := gauge(t, g.d, g.name, g.kind); got != g.want {
			t.Errorf("%s on the %s = %v, want %v", g.name, g.who, got, g.want)
		}
	}
	c.Close()
	testutil.WaitFor(t, "the relay closed on the leader", 10*time.Second, func() bool {
		return gauge(t, leader, "tenure_zk_connections", "relayed") == 0
	})
}
