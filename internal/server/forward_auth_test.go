package server_test

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/testutil"
	"github.com/tenure-io/tenure/internal/tlsconfig"
)

// forwardAPI is Tenure's API at member to's forward door, dialled by from
// over the peer port as a follower forwards (node.DialForward).
func forwardAPI(t *testing.T, from *daemon.Daemon, to string) pb.TenureClient {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+to,
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return from.Node.DialForward(ctx, to) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return pb.NewTenureClient(cc)
}

// TestForwardedCallsAnswerToTheLeadersACLs: under --auth a follower
// forwards a client's calls with the caller's credential, and the leader
// checks them: an anonymous call and a token without the right are
// refused (PERMISSION_DENIED, not "not the leader"), a management token's
// call succeeds. Forwarded-identity metadata is believed only on the
// forward door, from a member: sent to a client API, by the follower or
// by the leader, it is ignored; a stranger on the peer port that cannot
// prove it holds the cluster's keys gets no API at all.
func TestForwardedCallsAnswerToTheLeadersACLs(t *testing.T) {
	testutil.Slow(t)
	ms := startMixedCluster(t, true, true, true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var leader *authMember
	testutil.WaitFor(t, "a leader", 30*time.Second, func() bool {
		leader = leaderOf(ms, func(*authMember) bool { return true })
		return leader != nil
	})
	var follower *authMember
	for _, m := range ms {
		if m != leader {
			follower = m
			break
		}
	}
	boot, err := rawAPI(t, leader.addr).AclBootstrap(ctx, &pb.AclBootstrapRequest{})
	if err != nil {
		t.Fatal(err)
	}
	admin := withToken(ctx, boot.GetSecret())
	lapi := rawAPI(t, leader.addr)
	if _, err := lapi.AclPolicyCreate(admin, &pb.AclPolicyCreateRequest{Policy: &pb.AclPolicy{Name: "read-other", Rules: []*pb.AclRule{{Kind: "kv", Prefix: "other/", Access: "read"}}}}); err != nil {
		t.Fatal(err)
	}
	weak, err := lapi.AclTokenCreate(admin, &pb.AclTokenCreateRequest{Policies: []string{"read-other"}})
	if err != nil {
		t.Fatal(err)
	}
	// A certificate name bound to the management policy: whoever can
	// make the leader believe it holds that certificate owns the cluster.
	if _, err := lapi.AclIdentityBind(admin, &pb.AclIdentityBindRequest{Identity: &pb.AclIdentity{Name: "ops-admin", Policies: []string{fsm.ManagementPolicy}}}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the follower to apply the ACLs", 30*time.Second, func() bool {
		ok := false
		follower.d.Node.Read(func(st *fsm.State) { _, ok = st.Security().Binding("ops-admin") })
		return ok
	})

	fapi := rawAPI(t, follower.addr)
	put := func(ctx context.Context, api pb.TenureClient, key string) error {
		_, err := api.KVPut(ctx, &pb.KVPutRequest{Key: key, Value: []byte("v")})
		return err
	}
	if err := put(ctx, fapi, "app/k"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("an anonymous put through the follower: %v, want PERMISSION_DENIED from the leader", err)
	}
	if err := put(withToken(ctx, weak.GetSecret()), fapi, "app/k"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a put with a token without the right, through the follower: %v, want PERMISSION_DENIED", err)
	}
	if err := put(admin, fapi, "app/k"); err != nil {
		t.Fatalf("the management token's put through the follower: %v", err)
	}
	who, err := fapi.AclWhoAmI(admin, &pb.AclWhoAmIRequest{})
	if err != nil || !who.GetAuth() {
		t.Fatalf("whoami: %v %v", who, err)
	}

	// Forged forwarded-identity metadata on a client API, the follower's
	// or the leader's, names nobody.
	forged := metadata.AppendToOutgoingContext(ctx, "tenure-forwarded-by", leader.id, "tenure-forwarded-cert-bin", "ops-admin")
	for _, m := range []*authMember{follower, leader} {
		if err := put(forged, rawAPI(t, m.addr), "app/forged"); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("a put with forged forwarded-identity metadata on %s's client API: %v, want PERMISSION_DENIED", m.id, err)
		}
	}
	// On the forward door, from a member, the names are believed: that
	// is what a follower sends for a client certificate it verified.
	door := forwardAPI(t, follower.d, leader.id)
	if err := put(ctx, door, "app/door"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("an anonymous put on the forward door: %v, want PERMISSION_DENIED", err)
	}
	if err := put(metadata.AppendToOutgoingContext(ctx, "tenure-forwarded-cert-bin", "ops-admin"), door, "app/door"); err != nil {
		t.Fatalf("a put a member forwarded for certificate ops-admin: %v", err)
	}

	// A stranger on the peer port: the handshake refuses it.
	c, err := net.DialTimeout("tcp", leader.peer, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte{'F', 1}); err != nil {
		t.Fatal(err)
	}
	nonce := make([]byte, 16)
	if _, err := io.ReadFull(c, nonce); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(append([]byte{2, 'n', '9'}, make([]byte, 32)...)); err != nil {
		t.Fatal(err)
	}
	var answer [1]byte
	if _, err := io.ReadFull(c, answer[:]); err != nil || answer[0] != 1 {
		t.Fatalf("the handshake's answer to a stranger: %v %v, want refused (1)", answer, err)
	}
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("the connection stayed open after the refusal")
	}
}

// TestFollowerForwardsAVerifiedClientCertificate: with client TLS
// (client certificates required) and peer TLS, under --auth, a client
// whose certificate is bound to a policy works through a follower: the
// follower verifies the certificate and forwards its names over the peer
// port's TLS, and the leader grants what the binding allows and refuses
// the rest; a session opened through the follower holds a lock.
func TestFollowerForwardsAVerifiedClientCertificate(t *testing.T) {
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
		ms = append(ms, startDaemon(t, daemon.Config{NodeID: id, DataDir: filepath.Join(dir, id), PeerListen: peers[id], BootstrapPeers: peers, TLS: serverTLS.ServerConfig(), PeerTLS: pr.Config, Auth: true}))
	}
	dial := func(name string, m *member, opts ...client.Option) *client.Client {
		t.Helper()
		f := peerFiles(t, dir, name, clientCA)
		cfg, err := tlsconfig.ClientConfig(f.CA, f.Cert, f.Key)
		if err != nil {
			t.Fatal(err)
		}
		return testutil.Dial(t, m.d.Addr(), append(opts, client.WithTLS(cfg))...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var leader, follower *member
	testutil.WaitFor(t, "a leader every member knows, and the keys on every member", 30*time.Second, func() bool {
		leader, follower = nil, nil
		for _, m := range ms {
			if len(m.d.Node.Security().Keys) == 0 {
				return false
			}
			if m.d.Node.IsLeader() {
				leader = m
			}
		}
		for _, m := range ms {
			if leader == nil || m.d.Node.Leader() != leader.id {
				return false
			}
			if m != leader {
				follower = m
			}
		}
		return true
	})
	boot, err := dial("operator", leader).BootstrapACL(ctx)
	if err != nil {
		t.Fatal(err)
	}
	admin := dial("operator", leader, client.WithAuthToken(boot.Secret))
	if err := admin.CreatePolicy(ctx, &pb.AclPolicy{Name: "app", Rules: []*pb.AclRule{{Kind: "kv", Prefix: "app/", Access: "write"}, {Kind: "lock", Prefix: "app/", Access: "write"}, {Kind: "session", Prefix: "", Access: "write"}}}, false); err != nil {
		t.Fatal(err)
	}
	if err := admin.BindIdentity(ctx, "app-client", []string{"app"}); err != nil {
		t.Fatal(err)
	}
	app := dial("app-client", follower)
	if _, err := app.Put(ctx, "app/k", []byte("v")); err != nil {
		t.Fatalf("the certificate's put through the follower: %v", err)
	}
	if _, err := app.Put(ctx, "other/k", []byte("v")); status.Code(err) != codes.PermissionDenied && !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("the certificate's put outside its policy, through the follower: %v, want PERMISSION_DENIED", err)
	}
	s := testutil.Session(t, ctx, app, client.WithOwner("app"))
	m, err := s.Mutex("app/lock")
	if err != nil {
		t.Fatal(err)
	}
	h, err := m.Lock(ctx)
	if err != nil {
		t.Fatalf("a lock through the follower: %v", err)
	}
	if app.Endpoint() != follower.d.Addr() {
		t.Fatalf("the client is at %s, not the follower", app.Endpoint())
	}
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	anon := dial("stranger", follower)
	if _, err := anon.Put(ctx, "app/k", []byte("v")); status.Code(err) != codes.PermissionDenied && !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("an unbound certificate's put through the follower: %v, want PERMISSION_DENIED", err)
	}
}
