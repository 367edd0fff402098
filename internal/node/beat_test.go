package node_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/node"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestDeposedLeaderSendsNoHeartbeat: a node that led and was deposed
// sends no heartbeat of its own (the peer watch's, the membership
// checks'): a heartbeat stamped with the term it has learned since, in
// which another node leads, would make that leader step down and take the
// deposed node for the leader of its term (two leaders of one term, seen
// from the new leader). Here a hands leadership to b, then a's heartbeat
// to b is refused before it is sent, and b still leads its term.
func TestDeposedLeaderSendsNoHeartbeat(t *testing.T) {
	testutil.Slow(t)
	addrA, addrB := freeAddr(t), freeAddr(t)
	a := openConfig(t, node.Config{NodeID: "a", DataDir: t.TempDir(), PeerAddr: addrA})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b, _ := joining(t, "b", addrB)
	if err := a.AddVoter(ctx, "b", addrB, 0); err != nil {
		t.Fatalf("adding b: %v", err)
	}
	if _, err := a.TransferLeadership(ctx, "b"); err != nil {
		t.Fatalf("handing leadership to b: %v", err)
	}
	testutil.WaitFor(t, "b leads", 10*time.Second, func() bool { return b.Leadership().Leading })
	term := b.Leadership().Term
	testutil.WaitFor(t, "a learns b's term", 10*time.Second, func() bool { return a.Leadership().Term == term })

	if err := a.Beat(ctx, "b", addrB); !errors.Is(err, node.ErrNotLeader) {
		t.Fatalf("a deposed leader's heartbeat: %v, want node.ErrNotLeader (not sent)", err)
	}
	if l := b.Leadership(); !l.Leading || l.Term != term || !b.IsLeader() {
		t.Fatalf("b after a's heartbeat: %+v, want it to lead term %d still", l, term)
	}
}
