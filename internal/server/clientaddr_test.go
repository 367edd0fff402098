package server_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/testutil"
	"github.com/tenure-io/tenure/internal/tlsconfig"
)

// TestClientFindsTheClusterFromOneEndpoint: every member publishes its
// client address (the leader commits its own, followers send theirs to
// the leader), MemberList reports them, a follower forwards what needs
// the leader (and names the leader's address when it
// cannot), and a client given one follower (WithDiscovery) locks through
// it and, when the leader stops, goes on with the next one among the
// members it learned.
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

	// Nobody but a member can publish an address: a forged one (no HMAC,
	// or a wrong one) is refused, and every address stays.
	cc, err := grpc.NewClient(addr[leader], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	for _, mac := range []string{"", "00"} {
		cctx := ctx
		if mac != "" {
			cctx = metadata.AppendToOutgoingContext(ctx, "tenure-member-mac", mac)
		}
		err := cc.Invoke(cctx, "/tenure.server.v1.Members/PublishClientAddr", &fsmpb.SetEtcdURL{Member: follower.id, Url: "127.0.0.1:1"}, &emptypb.Empty{})
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("a forged address (mac %q): %v, want PERMISSION_DENIED", mac, err)
		}
	}
	for _, m := range ms {
		if m.id != leader {
			continue
		}
		got := "" // the leader applies what it accepts before it answers
		m.d.Node.Read(func(st *fsm.State) { got = st.ClientAddr(follower.id) })
		if got != addr[follower.id] {
			t.Fatalf("after the forgeries the leader has %q for %s", got, follower.id)
		}
	}

	// A follower forwards what needs the leader; what it cannot forward
	// (here: a request forwarded to it, which is never forwarded again)
	// it answers NOT_LEADER naming the leader's address.
	var leaderMember *member
	for _, m := range ms {
		if m.id == leader {
			leaderMember = m
		}
	}
	_, err = forwardAPI(t, leaderMember.d, follower.id).FencedGet(ctx, &pb.FencedGetRequest{Key: "k"})
	st, _ := status.FromError(err)
	hinted := ""
	for _, d := range st.Details() {
		if e, ok := d.(*pb.Error); ok && e.GetReason() == pb.ErrorReason_ERROR_REASON_NOT_LEADER {
			hinted = e.GetLeaderAddr()
		}
	}
	if st.Code() != codes.Unavailable || hinted != addr[leader] {
		t.Fatalf("the follower's answer to a forwarded request: %v, naming %q; want UNAVAILABLE naming the leader's %s", err, hinted, addr[leader])
	}
	if _, err := testutil.API(t, follower.d.Addr()).FencedGet(ctx, &pb.FencedGetRequest{Key: "k"}); err != nil {
		t.Fatalf("a linearizable read on the follower's client API: %v, want it forwarded", err)
	}

	c := testutil.Dial(t, follower.d.Addr(), client.WithDiscovery())
	s := testutil.Session(t, ctx, c, client.WithOwner("one-endpoint"))
	m, _ := s.Mutex("res")
	h, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// It locked through the follower it was given, which forwarded and
	// named the leader: the client may have moved there since.
	if ep := c.Endpoint(); ep != follower.d.Addr() && ep != addr[leader] {
		t.Fatalf("the client is at %s, neither the follower %s it was given nor the leader %s", ep, follower.d.Addr(), addr[leader])
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

// TestClientAddrsPublishedOverTLS: with client TLS (client certificates
// required, from another CA than the peers') and peer TLS, a follower
// publishes its address to the leader's client API with its peer
// certificate: every member's address reaches every member's state.
func TestClientAddrsPublishedOverTLS(t *testing.T) {
	testutil.Slow(t)
	dir := t.TempDir()
	clientCA, err := tlsconfig.NewCA("clients", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	peerCA, err := tlsconfig.NewCA("peers", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	serverTLS, err := tlsconfig.New(peerFiles(t, dir, "server", clientCA), tlsconfig.Server, nil)
	if err != nil {
		t.Fatal(err)
	}
	peers := map[string]string{"n1": freePort(t), "n2": freePort(t), "n3": freePort(t)}
	var ms []*member
	for id := range peers {
		pr, err := tlsconfig.New(peerFiles(t, dir, "peer-"+id, peerCA), tlsconfig.Peer, nil)
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, startDaemon(t, daemon.Config{NodeID: id, DataDir: filepath.Join(dir, id), PeerListen: peers[id], BootstrapPeers: peers, TLS: serverTLS.ServerConfig(), PeerTLS: pr.Config}))
	}
	testutil.WaitFor(t, "every member's client address in every member's state", 30*time.Second, func() bool {
		for _, m := range ms {
			for _, o := range ms {
				got := ""
				m.d.Node.Read(func(st *fsm.State) { got = st.ClientAddr(o.id) })
				if got != o.d.Addr() {
					return false
				}
			}
		}
		return true
	})
}
