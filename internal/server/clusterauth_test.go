package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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
	"github.com/tenure-io/tenure/internal/server"
	"github.com/tenure-io/tenure/internal/testutil"
)

// authMember is one in-process node of a test cluster whose members may
// or may not run with --auth; it can be stopped and started again on its
// data and addresses.
type authMember struct {
	id, peer, root, addr string
	auth                 bool
	peers                map[string]string
	d                    *daemon.Daemon
	stop                 func()
}

// start starts m (again) and waits until it is ready.
func (m *authMember) start(t *testing.T) {
	t.Helper()
	listen := m.addr
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	d, err := daemon.Start(daemon.Config{NodeID: m.id, DataDir: filepath.Join(m.root, m.id), Listen: listen, PeerListen: m.peer, BootstrapPeers: m.peers, Auth: m.auth, LogOutput: testutil.LogWriter(t, m.id)})
	if err != nil {
		t.Fatal(err)
	}
	m.d, m.addr = d, d.Addr()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	stopped := false
	m.stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(m.stop)
	select {
	case <-d.Ready():
	case err := <-done:
		t.Fatalf("%s stopped: %v", m.id, err)
	case <-time.After(30 * time.Second):
		t.Fatalf("%s not ready", m.id)
	}
}

// startMixedCluster starts a cluster of len(auth) voters, n1.., member i
// with --auth if auth[i].
func startMixedCluster(t *testing.T, auth ...bool) []*authMember {
	t.Helper()
	root := t.TempDir()
	peers := make(map[string]string)
	for i := range auth {
		peers[fmt.Sprint("n", i+1)] = freePort(t)
	}
	ms := make([]*authMember, len(auth))
	for i := range ms {
		id := fmt.Sprint("n", i+1)
		ms[i] = &authMember{id: id, peer: peers[id], root: root, auth: auth[i], peers: peers}
	}
	started := make(chan struct{}, len(ms))
	for _, m := range ms {
		go func() { defer func() { started <- struct{}{} }(); m.start(t) }()
	}
	for range ms {
		<-started
	}
	return ms
}

// leaderOf returns the member every running member takes for the leader
// (nil while they disagree or know none).
func leaderOf(ms []*authMember, running func(*authMember) bool) *authMember {
	var id string
	for _, m := range ms {
		if !running(m) {
			continue
		}
		l := m.d.Node.Status().Leader
		if l == "" || (id != "" && l != id) {
			return nil
		}
		id = l
	}
	for _, m := range ms {
		if m.id == id && running(m) && m.d.Node.IsLeader() {
			return m
		}
	}
	return nil
}

// makeLeader restarts leaders other than want (each restart moves
// leadership to one of the others) until want leads, or fails.
func makeLeader(t *testing.T, ms []*authMember, want *authMember) {
	t.Helper()
	all := func(*authMember) bool { return true }
	for round := 0; round < 20; round++ {
		var l *authMember
		testutil.WaitFor(t, "one leader all members agree on", 30*time.Second, func() bool { l = leaderOf(ms, all); return l != nil })
		if l == want {
			return
		}
		l.stop()
		others := func(m *authMember) bool { return m != l }
		testutil.WaitFor(t, "a new leader", 30*time.Second, func() bool { return leaderOf(ms, others) != nil })
		l.start(t)
	}
	t.Fatalf("%s never became the leader", want.id)
}

// rawAPI is a connection to one member, no redirects.
func rawAPI(t *testing.T, addr string) pb.TenureClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewTenureClient(conn)
}

// withToken is ctx carrying an auth token.
func withToken(ctx context.Context, secret string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, server.AuthTokenHeader, secret)
}

// TestMixedAuthClusterEnforcesTheClusterACLs: n1 and n2 run with --auth,
// n3 without. Whether the ACLs are enforced is the cluster's: n3 serves no
// anonymous serializable read of a key as a follower (before or after a
// snapshot and a restart), and once it leads it refuses anonymous puts and
// the minting of a management token.
func TestMixedAuthClusterEnforcesTheClusterACLs(t *testing.T) {
	testutil.Slow(t)
	ms := startMixedCluster(t, true, true, false)
	n1, n3 := ms[0], ms[2]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// An --auth member leads: from then on the cluster enforces its ACLs,
	// as n3 learns from the log.
	makeLeader(t, ms, n1)
	anon3 := rawAPI(t, n3.addr)
	testutil.WaitFor(t, "n3 to enforce the cluster's ACLs", 30*time.Second, func() bool {
		who, err := anon3.AclWhoAmI(ctx, &pb.AclWhoAmIRequest{})
		return err == nil && who.GetAuth()
	})

	// The operator bootstraps through the leader and writes a secret.
	anon1 := rawAPI(t, n1.addr)
	boot, err := anon1.AclBootstrap(ctx, &pb.AclBootstrapRequest{})
	if err != nil {
		t.Fatal(err)
	}
	admin := withToken(ctx, boot.GetSecret())
	if _, err := anon1.KVPut(admin, &pb.KVPutRequest{Key: "secret/k", Value: []byte("hunter2")}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "n3 to apply the secret", 30*time.Second, func() bool {
		var found bool
		n3.d.Node.Read(func(st *fsm.State) { _, found = st.KVGet("secret/k") })
		return found
	})

	followerRead := func(when string) {
		t.Helper()
		api := rawAPI(t, n3.addr)
		if n3.d.Node.IsLeader() {
			t.Fatalf("%s: n3 leads", when)
		}
		resp, err := api.KVRange(ctx, &pb.KVRangeRequest{Key: "secret/k", Serializable: true})
		if err == nil || len(resp.GetKvs()) > 0 {
			t.Fatalf("%s: follower n3 served an anonymous serializable read: %v %v", when, resp, err)
		}
		resp, err = api.KVRange(admin, &pb.KVRangeRequest{Key: "secret/k", Serializable: true})
		if err != nil || len(resp.GetKvs()) != 1 || string(resp.GetKvs()[0].GetValue()) != "hunter2" {
			t.Fatalf("%s: follower n3 refused the management token's serializable read: %v %v", when, resp, err)
		}
	}
	followerRead("n3 as a follower")

	// The setting is in n3's snapshot and survives its restart.
	if err := n3.d.Node.Snapshot(); err != nil {
		t.Fatal(err)
	}
	n3.stop()
	n3.start(t)
	followerRead("n3 after a snapshot and a restart")

	// n3 leads: the attacks of a member without --auth are refused.
	makeLeader(t, ms, n3)
	anon3 = rawAPI(t, n3.addr)
	if _, err := anon3.KVPut(ctx, &pb.KVPutRequest{Key: "secret/k", Value: []byte("owned")}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("anonymous put on leader n3: %v, want PERMISSION_DENIED", err)
	}
	tok, err := anon3.AclTokenCreate(ctx, &pb.AclTokenCreateRequest{Policies: []string{fsm.ManagementPolicy}})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("anonymous management token on leader n3: %v %v, want PERMISSION_DENIED", tok, err)
	}
	if _, err := anon3.KVPut(admin, &pb.KVPutRequest{Key: "secret/k", Value: []byte("rotated")}); err != nil {
		t.Fatalf("the management token's put on leader n3: %v", err)
	}
}

// TestRestoreKeepsACLEnforcement: a forced restore of a snapshot taken
// before the cluster enforced its ACLs leaves them enforced: nothing turns
// enforcement off.
func TestRestoreKeepsACLEnforcement(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	anon := testutil.Dial(t, srv.Addr())
	var snap bytes.Buffer
	if _, err := anon.SaveSnapshot(ctx, &snap); err != nil {
		t.Fatal(err)
	}
	if _, _, err := anon.EnableACL(ctx); err != nil {
		t.Fatal(err)
	}
	tok, err := anon.BootstrapACL(ctx)
	if err != nil {
		t.Fatal(err)
	}
	admin := testutil.Dial(t, srv.Addr(), client.WithAuthToken(tok.Secret))
	if _, err := admin.RestoreSnapshot(ctx, bytes.NewReader(snap.Bytes()), true); err != nil {
		t.Fatal(err)
	}
	if !srv.Node.Security().Enforced {
		t.Fatal("the restore of an older snapshot turned ACL enforcement off")
	}
	if _, err := anon.Put(ctx, "k", []byte("v")); !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("anonymous put after the restore: %v, want PERMISSION_DENIED", err)
	}
}
