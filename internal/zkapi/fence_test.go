package zkapi_test

import (
	"context"
	"errors"
	"sort"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

// lockZk takes a ZooKeeper lock the way Kazoo's Lock and Curator's
// InterProcessMutex do: an ephemeral sequential node under dir, held
// once it is the lowest. It returns the node's czxid, the fencing token.
func lockZk(t *testing.T, c *zk.Conn, dir string) (string, uint64) {
	t.Helper()
	p, err := c.Create(dir+"/lock-", nil, zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll))
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the lock", 20*time.Second, func() bool {
		kids, _, err := c.Children(dir)
		if err != nil {
			return false
		}
		sort.Strings(kids)
		return len(kids) > 0 && dir+"/"+kids[0] == p
	})
	_, st, err := c.Get(p)
	if err != nil {
		t.Fatal(err)
	}
	return p, uint64(st.Czxid)
}

// TestLockNodeCzxidFences: the seed's late-write story in ZooKeeper's
// vocabulary. A holder's lock node's czxid is its fencing token; when
// its session expires (a long pause), its node goes, the next holder's
// node has a higher czxid, and the paused holder's late write through
// the fenced register is refused as stale.
func TestLockNodeCzxidFences(t *testing.T) {
	d, addr := startNode(t, nil)
	ctx := context.Background()
	tc := testutil.Dial(t, d.Addr())
	proxy := testutil.StartProxy(t, addr)
	first, _ := connect(t, []string{proxy.Addr()}, 2*time.Second)
	second, _ := connect(t, []string{addr}, 5*time.Second)
	if _, err := second.Create("/locks", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if _, err := second.Create("/locks/shard-7", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	firstNode, firstToken := lockZk(t, first, "/locks/shard-7")
	if r, err := tc.FencedPut(ctx, "shard-7/state", []byte("first"), firstToken, ""); err != nil || !r.Accepted {
		t.Fatalf("the first holder's write: %+v %v", r, err)
	}

	// The first holder stalls: its session expires and its node goes.
	proxy.Block()
	testutil.WaitFor(t, "the stalled holder's node to go", 20*time.Second, func() bool {
		ok, _, err := second.Exists(firstNode)
		return err == nil && !ok
	})
	_, secondToken := lockZk(t, second, "/locks/shard-7")
	if secondToken <= firstToken {
		t.Fatalf("the second holder's czxid %d is not above the first's %d", secondToken, firstToken)
	}
	if r, err := tc.FencedPut(ctx, "shard-7/state", []byte("second"), secondToken, ""); err != nil || !r.Accepted {
		t.Fatalf("the second holder's write: %+v %v", r, err)
	}

	// The first holder wakes up and writes with its old token: stale.
	r, err := tc.FencedPut(ctx, "shard-7/state", []byte("late"), firstToken, "")
	if !errors.Is(err, client.ErrStale) || r.Accepted {
		t.Fatalf("the late write: %+v %v, want ErrStale", r, err)
	}
	reg, err := tc.FencedGet(ctx, "shard-7/state")
	if err != nil || string(reg.Value) != "second" || reg.Token != secondToken {
		t.Fatalf("register: %+v %v", reg, err)
	}
	proxy.Unblock()
	// The first client learns its session expired.
	testutil.WaitFor(t, "the first client to see its session expire", 20*time.Second, func() bool {
		return first.State() == zk.StateExpired || first.State() == zk.StateDisconnected || first.State() == zk.StateConnecting
	})
}

// TestSessionExpiryRemovesEphemerals: a session that stops pinging
// expires on the leader's clock; its ephemerals go in the same command.
func TestSessionExpiryRemovesEphemerals(t *testing.T) {
	_, addr := startNode(t, nil)
	proxy := testutil.StartProxy(t, addr)
	owner, _ := connect(t, []string{proxy.Addr()}, 2*time.Second)
	other, _ := connect(t, []string{addr}, 5*time.Second)
	for _, p := range []string{"/x", "/x/y"} {
		if _, err := owner.Create(p, nil, zk.FlagEphemeral*boolInt(p == "/x/y"), zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
	}
	_, _, ch, err := other.ChildrenW("/x")
	if err != nil {
		t.Fatal(err)
	}
	proxy.Block()
	select {
	case e := <-ch:
		if e.Type != zk.EventNodeChildrenChanged || e.Path != "/x" {
			t.Fatalf("event %+v", e)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the expired session's ephemeral was not removed")
	}
	kids, _, err := other.Children("/x")
	if err != nil || len(kids) != 0 {
		t.Fatalf("children of /x: %v %v", kids, err)
	}
	proxy.Unblock()
}

func boolInt(b bool) int32 {
	if b {
		return 1
	}
	return 0
}
