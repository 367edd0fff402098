package zkapi_test

import (
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/testutil"
)

// sessionTTLOf is session id's TTL in a member's applied state (0: none).
func sessionTTLOf(d *daemon.Daemon, id int64) int64 {
	var ttl int64
	d.Node.Read(func(st *fsm.State) { ttl, _ = st.Session(uint64(id)) })
	return ttl
}

func waitClusterVersion3(t *testing.T, d *daemon.Daemon) {
	t.Helper()
	testutil.WaitFor(t, "cluster version 3", 30*time.Second, func() bool {
		var v uint32
		d.Node.Read(func(st *fsm.State) { v = st.ClusterVersion() })
		return v >= 3
	})
}

// TestResumeRenegotiatesTimeout: a client that resumes its session asking
// another timeout is answered that timeout, clamped to the flags' bounds
// (1s..20s here), as ZooKeeper answers it; the session's TTL in the
// replicated state becomes it, and the leader expires the session by it.
func TestResumeRenegotiatesTimeout(t *testing.T) {
	d, addr := startNode(t, nil)
	waitClusterVersion3(t, d)
	created := raw(t, addr).connectAsking(t, 10_000, 0, nil)
	if created.sessionID == 0 || created.timeout != 10_000 {
		t.Fatalf("new session: %+v, want timeout 10000", created)
	}
	for _, c := range []struct{ ask, want int32 }{
		{4_000, 4_000},   // another timeout within the bounds
		{60_000, 20_000}, // above the maximum: clamped
		{500, 1_000},     // below the minimum: clamped
		{1_000, 1_000},   // the same again
		{20_000, 20_000}, // back up
	} {
		got := raw(t, addr).connectAsking(t, c.ask, created.sessionID, created.passwd)
		if got.sessionID != created.sessionID || got.timeout != c.want {
			t.Fatalf("resume asking %dms: session %d timeout %d, want session %d timeout %d", c.ask, got.sessionID, got.timeout, created.sessionID, c.want)
		}
		if ttl := sessionTTLOf(d, created.sessionID); ttl != int64(c.want) {
			t.Fatalf("resume asking %dms: the session's TTL is %dms, want %d", c.ask, ttl, c.want)
		}
	}

	// Renegotiated to 1s, the session ends about 1s after its client
	// goes, far before the 20s it had.
	r := raw(t, addr)
	if got := r.connectAsking(t, 1_000, created.sessionID, created.passwd); got.timeout != 1_000 {
		t.Fatalf("resume asking 1000ms: timeout %d", got.timeout)
	}
	r.nc.Close()
	testutil.WaitFor(t, "the session's expiry by its renegotiated TTL", 12*time.Second, func() bool {
		return sessionTTLOf(d, created.sessionID) == 0
	})
	// And a resume now is refused as ZooKeeper refuses an expired session.
	if got := raw(t, addr).connectAsking(t, 10_000, created.sessionID, created.passwd); got.sessionID != 0 || got.timeout != 0 {
		t.Fatalf("resume after expiry: %+v, want a refusal", got)
	}
}

// TestFollowerResumeRenegotiatesTimeout: a client resuming its session on
// a follower, asking another timeout, gets the leader's answer: the
// renegotiated timeout, which every member's state then holds.
func TestFollowerResumeRenegotiatesTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster")
	}
	cl := startZkCluster(t, func(_ string, cfg *daemon.Config) { cfg.ZkListen = "127.0.0.1:0" })
	daemons, leader, follower := cl.daemons, cl.leader, cl.followers[0]
	testutil.WaitFor(t, "the leader's ZooKeeper address on the follower", 30*time.Second, func() bool {
		var addr string
		daemons[follower].Node.Read(func(st *fsm.State) { addr = st.ZkAddr(leader) })
		return addr == daemons[leader].ZkAddr()
	})

	created := raw(t, daemons[leader].ZkAddr()).connectAsking(t, 10_000, 0, nil)
	if created.sessionID == 0 || created.timeout != 10_000 {
		t.Fatalf("new session: %+v, want timeout 10000", created)
	}
	for _, c := range []struct{ ask, want int32 }{{4_000, 4_000}, {90_000, 30_000}} {
		got := raw(t, daemons[follower].ZkAddr()).connectAsking(t, c.ask, created.sessionID, created.passwd)
		if got.sessionID != created.sessionID || got.timeout != c.want {
			t.Fatalf("resume on the follower asking %dms: session %d timeout %d, want session %d timeout %d", c.ask, got.sessionID, got.timeout, created.sessionID, c.want)
		}
		if ttl := sessionTTLOf(daemons[leader], created.sessionID); ttl != int64(c.want) {
			t.Fatalf("the session's TTL on the leader is %dms, want %d", ttl, c.want)
		}
		for id := range daemons {
			testutil.WaitFor(t, "the renegotiated TTL on "+id, 10*time.Second, func() bool {
				return sessionTTLOf(daemons[id], created.sessionID) == int64(c.want)
			})
		}
	}
}
