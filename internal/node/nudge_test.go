package node_test

import (
	"context"
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
// after a znode write that is the last of its log: a lone one reaches a
// follower's state well within raft's commit timeout (median of several,
// the machine may stall one).
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
	// raftCommitTimeout is raft's CommitTimeout (its default, which the
	// node keeps): the soonest a follower learns of a lone write without
	// a nudge.
	const raftCommitTimeout = 50 * time.Millisecond
	const writes = 9
	var took []time.Duration
	for i := 1; i <= writes; i++ {
		path := "/n" + strconv.Itoa(i)
		start := time.Now()
		propose(t, a, &fsmpb.Command{Op: &fsmpb.Command_ZkTxn{ZkTxn: &fsmpb.ZkTxn{TimeMs: 1000, Ops: []*fsmpb.ZkOp{{Op: &fsmpb.ZkOp_Create{Create: &fsmpb.ZkCreate{
			Path: path, Data: []byte("d"), Acl: []*fsmpb.ZnodeACL{{Perms: fsm.ZkPermAll, Scheme: "world", Id: "anyone"}}}}}}}}})
		if err := testutil.PollUntil(10*time.Second, func() (bool, error) {
			var ok bool
			b.Read(func(s *fsm.State) { _, _, _, ok = s.Znode(path) })
			return ok, nil
		}); err != nil {
			t.Fatalf("znode %s never reached follower b: %v", path, err)
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	if med := took[writes/2]; med >= raftCommitTimeout {
		t.Fatalf("a lone znode write reached a follower's state in %v (median; all: %v), want under raft's commit timeout %v, the soonest a follower learns of it without a nudge", med, took, raftCommitTimeout)
	}
	t.Logf("a lone znode write on the leader to a follower's state: %v", took)
}
