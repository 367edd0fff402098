package server_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestClientFindsTheClusterFromOneEndpoint: every member publishes its
// client address (the leader commits its own, followers send theirs to
// the leader), MemberList reports them, a follower's "not the leader"
// names the leader's, and a client given one follower (WithDiscovery)
// locks on the leader and, when the leader stops, goes on with the next
// one among the members it learned.
func TestClientFindsTheClusterFromOneEndpoint(t *testing.T) {
	testutil.Slow(t)
	ms := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addr := map[string]string{}
	for _, m := range ms {
		addr[m.id] = m.d.Addr()
	}
	all := clusterClient(t, ms)
	var leader string
	testutil.WaitFor(t, "every member's client address in MemberList", 20*time.Second, func() bool {
		resp, err := all.Members(ctx)
		if err != nil {
			return false
		}
		for _, m := range resp.GetMembers() {
			if m.GetClientAddr() != addr[m.GetId()] {
				return false
			}
			if m.GetLeader() {
				leader = m.GetId()
			}
		}
		return len(resp.GetMembers()) == 3 && leader != ""
	})
	var follower *member
	for _, m := range ms {
		if m.id != leader {
			follower = m
			break
		}
	}

	// The follower's NOT_LEADER names the leader's address.
	_, err := testutil.API(t, follower.d.Addr()).FencedGet(ctx, &pb.FencedGetRequest{Key: "k"})
	st, _ := status.FromError(err)
	hinted := ""
	for _, d := range st.Details() {
		if e, ok := d.(*pb.Error); ok && e.GetReason() == pb.ErrorReason_ERROR_REASON_NOT_LEADER {
			hinted = e.GetLeaderAddr()
		}
	}
	if st.Code() != codes.Unavailable || hinted != addr[leader] {
		t.Fatalf("the follower's answer: %v, naming %q; want UNAVAILABLE naming the leader's %s", err, hinted, addr[leader])
	}

	c := testutil.Dial(t, follower.d.Addr(), client.WithDiscovery())
	s := testutil.Session(t, ctx, c, client.WithOwner("one-endpoint"))
	m, _ := s.Mutex("res")
	h, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c.Endpoint() != addr[leader] {
		t.Fatalf("the client locked at %s, the leader is at %s", c.Endpoint(), addr[leader])
	}
	// The leader stops: the client finds the next one, which may be the
	// member it was never given.
	for _, m := range ms {
		if m.id == leader {
			m.stop()
		}
	}
	if _, err := c.FencedPut(ctx, "res/state", []byte("v"), h.Token(), "op-1"); err != nil {
		t.Fatalf("after the leader stopped: %v", err)
	}
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
