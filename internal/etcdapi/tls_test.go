package etcdapi_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	tpb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/testutil"
	"github.com/tenure-io/tenure/internal/tlsconfig"
)

// issue writes a certificate of ca for name (with hosts) and returns
// its files (CA: ca's certificate).
func issue(t *testing.T, dir, name string, ca *tlsconfig.CA, hosts []string, usage tlsconfig.Usage) tlsconfig.Files {
	t.Helper()
	leaf, err := ca.Issue(name, hosts, usage, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f := tlsconfig.Files{Cert: filepath.Join(dir, name+".pem"), Key: filepath.Join(dir, name+"-key.pem"), CA: filepath.Join(dir, name+"-ca.pem")}
	for file, data := range map[string][]byte{f.Cert: leaf.CertPEM, f.Key: leaf.KeyPEM, f.CA: ca.PEM} {
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// clientTLS is a client's configuration: the server's CA, and the client
// certificate of files (none if Cert is empty).
func clientTLS(t *testing.T, ca *tlsconfig.CA, files tlsconfig.Files) *tls.Config {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	c := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if files.Cert != "" {
		cert, err := tls.LoadX509KeyPair(files.Cert, files.Key)
		if err != nil {
			t.Fatal(err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c
}

func dialTLS(t *testing.T, addr string, c *tls.Config) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(c)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestAuthClusterOverTLS: three members with --auth, client TLS (client
// certificates required) and peer TLS from another CA serve etcd's API;
// a follower forwards writes and linearizable reads to the leader over
// the peer TLS settings, with the caller's token or certificate identity,
// which the leader checks again; certificate names a client puts in the
// metadata count for nothing; a watch on a follower ends when its token
// is revoked.
func TestAuthClusterOverTLS(t *testing.T) {
	testutil.Slow(t)
	root := t.TempDir()
	clientCA, err := tlsconfig.NewCA("clients", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	peerCA, err := tlsconfig.NewCA("peers", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	serverFiles := issue(t, root, "server", clientCA, []string{"127.0.0.1"}, tlsconfig.ServerAuth)
	appFiles := issue(t, root, "app-client", clientCA, nil, tlsconfig.ClientAuth)
	nobodyFiles := issue(t, root, "nobody", clientCA, nil, tlsconfig.ClientAuth)
	serverTLS, err := tlsconfig.New(serverFiles, tlsconfig.Server, nil)
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"n1", "n2", "n3"}
	peers := map[string]string{}
	for _, id := range ids {
		peers[id] = testutil.FreeAddr(t, 61000, 65000)
	}
	daemons := map[string]*daemon.Daemon{}
	for _, id := range ids {
		pr, err := tlsconfig.New(issue(t, root, "peer-"+id, peerCA, []string{"127.0.0.1"}, tlsconfig.ServerAuth|tlsconfig.ClientAuth), tlsconfig.Peer, nil)
		if err != nil {
			t.Fatal(err)
		}
		d, err := daemon.Start(daemon.Config{NodeID: id, DataDir: filepath.Join(root, id), Listen: "127.0.0.1:0", EtcdListen: "127.0.0.1:0",
			PeerListen: peers[id], BootstrapPeers: peers, TLS: serverTLS.ServerConfig(), PeerTLS: pr.Config, Auth: true,
			LogOutput: testutil.LogWriter(t, id)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		daemons[id] = d
	}
	for id, d := range daemons {
		select {
		case <-d.Ready():
		case <-time.After(30 * time.Second):
			t.Fatalf("%s not ready", id)
		}
	}
	var leader, follower *daemon.Daemon
	for _, d := range daemons {
		if d.Node.IsLeader() {
			leader = d
		} else {
			follower = d
		}
	}
	if leader == nil {
		t.Fatal("no leader")
	}
	app := clientTLS(t, clientCA, appFiles)
	n := bootstrap(t, tpb.NewTenureClient(dialTLS(t, leader.Addr(), app)))
	tok := n.token(t, "app", "kv:app/:write", "kv:w/:read", "session:etcd:write")
	if _, err := n.api.AclIdentityBind(n.ctx(t), &tpb.AclIdentityBindRequest{Identity: &tpb.AclIdentity{Name: "app-client", Policies: []string{"app"}}}); err != nil {
		t.Fatal(err)
	}
	fconn := dialTLS(t, follower.EtcdAddr(), app)
	kv, watch, lease := pb.NewKVClient(fconn), pb.NewWatchClient(fconn), pb.NewLeaseClient(fconn)
	ctx := ctxT(t)
	withTok := withToken(ctx, tok.GetSecret())
	var putErr error
	testutil.WaitFor(t, "a put through a follower with a token (once the leader's etcd address is published)", 20*time.Second, func() bool {
		_, putErr = kv.Put(withTok, &pb.PutRequest{Key: []byte("app/1"), Value: []byte("v")})
		return putErr == nil
	})
	if r, err := kv.Range(withTok, &pb.RangeRequest{Key: []byte("app/1")}); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("a linearizable read through a follower: %v %v", r, err)
	}
	if _, err := lease.LeaseGrant(withTok, &pb.LeaseGrantRequest{TTL: 30}); err != nil {
		t.Fatalf("a lease through a follower: %v", err)
	}
	_, err = kv.Put(withTok, &pb.PutRequest{Key: []byte("secret/1"), Value: []byte("v")})
	wantErr(t, err, rpctypes.ErrGRPCPermissionDenied)
	// The certificate's identity, without a token, is forwarded too.
	if _, err := kv.Put(ctx, &pb.PutRequest{Key: []byte("app/2"), Value: []byte("v")}); err != nil {
		t.Fatalf("a put through a follower with a bound certificate: %v", err)
	}
	_, err = kv.Put(ctx, &pb.PutRequest{Key: []byte("secret/2"), Value: []byte("v")})
	wantErr(t, err, rpctypes.ErrGRPCPermissionDenied)
	// The JSON gateway on the follower's etcd port, over TLS (HTTP/1.1 and
	// h2 by ALPN), forwards to the leader with etcd's token header, and
	// with the client certificate's identity alone; another certificate's
	// rights are its own.
	gatewayTLS(t, follower.EtcdAddr(), app, tok.GetSecret())
	gatewayTLS(t, follower.EtcdAddr(), app, "")
	nobodyGW := gwClient{base: "https://" + follower.EtcdAddr(), hc: &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS(t, clientCA, nobodyFiles)}}}
	if resp, b := nobodyGW.do(t, http.MethodPost, "/v3/kv/put", map[string]any{"key": b64("app/4"), "value": b64("v")}); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a put through the gateway with an unbound certificate: %d %s", resp.StatusCode, b)
	}
	// A client cannot claim another certificate's names, at the leader
	// or at a follower.
	for _, d := range []*daemon.Daemon{leader, follower} {
		nobody := pb.NewKVClient(dialTLS(t, d.EtcdAddr(), clientTLS(t, clientCA, nobodyFiles)))
		forged := metadata.AppendToOutgoingContext(ctx, "tenure-etcd-cert-bin", "app-client")
		_, err := nobody.Put(forged, &pb.PutRequest{Key: []byte("app/3"), Value: []byte("v")})
		wantErr(t, err, rpctypes.ErrGRPCPermissionDenied)
	}
	// A client certificate cannot pass for a member.
	member := clientTLS(t, clientCA, appFiles)
	member.ServerName = "tenure-etcd-forward"
	member.InsecureSkipVerify = true
	if _, err := pb.NewKVClient(dialTLS(t, leader.EtcdAddr(), member)).Range(ctx, &pb.RangeRequest{Key: []byte("app/1")}); err == nil {
		t.Fatal("a client certificate connected as a member")
	}
	// A watch on the follower ends when its token is revoked.
	w, err := watch.Watch(withTok)
	if err != nil {
		t.Fatal(err)
	}
	create(t, w, &pb.WatchCreateRequest{Key: []byte("w/"), RangeEnd: []byte("w0")})
	rootCtx := withToken(ctx, n.root)
	if _, err := kv.Put(rootCtx, &pb.PutRequest{Key: []byte("w/1"), Value: []byte("before")}); err != nil {
		t.Fatal(err)
	}
	if r := recvWatch(t, w); len(r.Events) != 1 {
		t.Fatalf("before the revocation: %v", r)
	}
	if _, err := n.api.AclTokenRevoke(n.ctx(t), &tpb.AclTokenRevokeRequest{Id: tok.GetId()}); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	if _, err := kv.Put(rootCtx, &pb.PutRequest{Key: []byte("w/2"), Value: []byte("after")}); err != nil {
		t.Fatal(err)
	}
	for {
		r, err := w.Recv()
		if err != nil {
			wantErr(t, err, rpctypes.ErrGRPCPermissionDenied)
			break
		}
		for _, ev := range r.Events {
			t.Fatalf("delivered after the revocation: %s", ev.Kv.Key)
		}
	}
	if d := time.Since(revoked); d > time.Second {
		t.Fatalf("the follower's watch ended %v after the revocation", d)
	}
}

// TestTLSClusterNeedsPeerTLS: a member with --etcd-listen and client TLS
// but no peer TLS is refused at start, with one line naming the peer TLS
// flags (its followers would have nothing to forward with).
func TestTLSClusterNeedsPeerTLS(t *testing.T) {
	root := t.TempDir()
	ca, err := tlsconfig.NewCA("clients", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	r, err := tlsconfig.New(issue(t, root, "server", ca, []string{"127.0.0.1"}, tlsconfig.ServerAuth), tlsconfig.Server, nil)
	if err != nil {
		t.Fatal(err)
	}
	peer := testutil.FreeAddr(t, 61000, 65000)
	_, err = daemon.Start(daemon.Config{NodeID: "n1", DataDir: filepath.Join(root, "n1"), Listen: "127.0.0.1:0", EtcdListen: "127.0.0.1:0",
		PeerListen: peer, BootstrapPeers: map[string]string{"n1": peer}, TLS: r.ServerConfig(), LogOutput: testutil.LogWriter(t, "n1")})
	if err == nil || !strings.Contains(err.Error(), "--peer-tls-cert") {
		t.Fatalf("start: %v, want a refusal naming --peer-tls-cert", err)
	}
}
