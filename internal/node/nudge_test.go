package node_test

import (
	"context"
	"io"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/node"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestFollowerAppliesLoneWriteSoon: a follower learns that an entry is
// committed from the leader's next append to it; when no write follows,
// raft sends that append only on its commit timeout, 50 to 100 ms after
// the last. The ZooKeeper front's follower answers a write it relayed
// once it applied it, and delivers watch events as it applies them: it
// waited that long for each lone write. The leader nudges its followers
// after a znode write that is the last of its log, with a barrier, while
// a follower serves a ZooKeeper client (its connection relayed to the
// leader), and only then: the test waits, for each lone write, until the follower applied it and the
// leader's log grew past it although nothing else was proposed. Without
// the nudge the log stays at the write and the wait fails. How soon the
// follower applied it is logged (a figure, not an assertion: the machine
// may stall).
func TestFollowerAppliesLoneWriteSoon(t *testing.T) {
	testutil.Slow(t)
	addrA, addrB, addrC := freeAddr(t), freeAddr(t), freeAddr(t)
	a := openConfig(t, node.Config{NodeID: "a", DataDir: t.TempDir(), PeerAddr: addrA})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b, _ := joining(t, "b", addrB)
	joining(t, "c", addrC)
	for _, m := range []struct{ id, addr string }{{"b", addrB}, {"c", addrC}} {
		if err := a.AddVoter(ctx, m.id, m.addr, 0); err != nil {
			t.Fatalf("adding %s: %v", m.id, err)
		}
	}
	// A follower serves a ZooKeeper client: its connection is relayed to
	// the leader over the peer port.
	if a.FollowersWait() {
		t.Fatal("the leader counts a follower that serves a ZooKeeper client before any relay connection")
	}
	relayed := a.ZkRelayListener()
	go func() {
		for {
			c, err := relayed.Accept()
			if err != nil {
				return
			}
			go func() {
				_, _ = io.Copy(io.Discard, c)
				c.Close()
			}()
		}
	}()
	client, err := b.DialZkRelay(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the leader to hold the relay connection", 10*time.Second, a.FollowersWait)
	const writes = 9
	var took []time.Duration
	for i := 1; i <= writes; i++ {
		path := "/n" + strconv.Itoa(i)
		last := a.RaftStats().LastIndex
		start := time.Now()
		propose(t, a, &fsmpb.Command{Op: &fsmpb.Command_ZkTxn{ZkTxn: &fsmpb.ZkTxn{TimeMs: 1000, Ops: []*fsmpb.ZkOp{{Op: &fsmpb.ZkOp_Create{Create: &fsmpb.ZkCreate{
			Path: path, Data: []byte("d"), Acl: []*fsmpb.ZnodeACL{{Perms: fsm.ZkPermAll, Scheme: "world", Id: "anyone"}}}}}}}}})
		applied := false
		if err := testutil.PollUntil(10*time.Second, func() (bool, error) {
			if !applied {
				b.Read(func(s *fsm.State) { _, _, _, applied = s.Znode(path) })
				if applied {
					took = append(took, time.Since(start))
				}
			}
			return applied && a.RaftStats().LastIndex > last+1, nil
		}); err != nil {
			t.Fatalf("after the lone write of %s (applied by follower b: %v), the leader's log stayed at %d, want a barrier after the write at %d: %v",
				path, applied, a.RaftStats().LastIndex, last+1, err)
		}
	}
	// Without a relayed client, the leader nudges nobody.
	client.Close()
	testutil.WaitFor(t, "the leader to see the relay connection closed", 10*time.Second, func() bool { return !a.FollowersWait() })
	slices.Sort(took)
	t.Logf("a lone znode write on the leader to a follower's state: median %v, all %v (raft's commit timeout, without the nudge: 50 to 100 ms)", took[writes/2], took)
}
