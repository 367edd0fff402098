package server_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
	"github.com/tenure-io/tenure/internal/version"
)

// TestClusterVersionRaisedOnceEveryVoterSpeaksIt: in a cluster of this
// build the leader raises the cluster version to the protocol every voter
// reports, every member's status shows it, and the member list gives each
// member's protocol and release.
func TestClusterVersionRaisedOnceEveryVoterSpeaksIt(t *testing.T) {
	ms := startCluster(t, 3)
	c := clusterClient(t, ms)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, m := range ms {
		mc := testutil.Dial(t, m.d.Addr())
		testutil.WaitFor(t, m.id+"'s cluster version", 30*time.Second, func() bool {
			st, err := mc.Status(ctx)
			return err == nil && st.GetClusterVersion() == version.Protocol && st.GetProtocol() == version.Protocol && st.GetMinProtocol() == version.MinProtocol
		})
	}
	resp, err := c.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range resp.GetMembers() {
		if m.GetProtocol() != version.Protocol || m.GetVersion() != version.String() {
			t.Fatalf("member %s reports protocol %d, release %q; want %d, %q", m.GetId(), m.GetProtocol(), m.GetVersion(), version.Protocol, version.String())
		}
	}
}

// TestMemberTransferLeadership: the leader hands leadership to the voter
// named, or to one it picks; a name that is no other voter is refused.
func TestMemberTransferLeadership(t *testing.T) {
	ms := startCluster(t, 3)
	c := clusterClient(t, ms)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wantWrites(t, ctx, c)
	_, leader := voterIDs(t, ctx, c)
	target := "n1"
	if leader == target {
		target = "n2"
	}
	got, err := c.TransferLeadership(ctx, target)
	if err != nil || got != target {
		t.Fatalf("transfer to %s: leader %q, %v", target, got, err)
	}
	testutil.WaitFor(t, "the new leader in the member list", 10*time.Second, func() bool {
		_, l := voterIDs(t, ctx, c)
		return l == target
	})
	if _, err := c.TransferLeadership(ctx, "n9"); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("transfer to no member: %v, want ErrInvalid", err)
	}
	got, err = c.TransferLeadership(ctx, "")
	if err != nil || got == target {
		t.Fatalf("transfer to any: leader %q, %v", got, err)
	}
}
