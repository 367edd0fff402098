package zkapi_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/testutil"
	"github.com/tenure-io/tenure/internal/tlsconfig"
	"github.com/tenure-io/tenure/internal/zkapi"
)

// certs are a test CA's files: the server's certificate and clients'.
type certs struct {
	dir string
	ca  *tlsconfig.CA
}

func newCerts(t *testing.T) *certs {
	t.Helper()
	ca, err := tlsconfig.NewCA("zk test ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c := &certs{dir: t.TempDir(), ca: ca}
	c.write(t, "ca.pem", ca.PEM)
	return c
}

func (c *certs) write(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(c.dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// leaf issues a certificate for cn and returns its files.
func (c *certs) leaf(t *testing.T, cn string, usage tlsconfig.Usage, hosts ...string) (cert, key string) {
	t.Helper()
	l, err := c.ca.Issue(cn, hosts, usage, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return c.write(t, cn+".pem", l.CertPEM), c.write(t, cn+"-key.pem", l.KeyPEM)
}

// serverTLS is the client API's TLS configuration, requiring client
// certificates of the CA when clientCA.
func (c *certs) serverTLS(t *testing.T, clientCA bool) *tls.Config {
	t.Helper()
	cert, key := c.leaf(t, "server", tlsconfig.ServerAuth, "127.0.0.1")
	files := tlsconfig.Files{Cert: cert, Key: key}
	if clientCA {
		files.CA = filepath.Join(c.dir, "ca.pem")
	}
	r, err := tlsconfig.New(files, tlsconfig.Server, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r.ServerConfig()
}

// clientTLS is a client's configuration: the CA, and the certificate of
// cn ("" none).
func (c *certs) clientTLS(t *testing.T, cn string) *tls.Config {
	t.Helper()
	var cert, key string
	if cn != "" {
		cert, key = c.leaf(t, cn, tlsconfig.ClientAuth)
	}
	cfg, err := tlsconfig.ClientConfig(filepath.Join(c.dir, "ca.pem"), cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// connectTLS opens a go-zookeeper client over TLS.
func connectTLS(t *testing.T, addrs []string, cfg *tls.Config) *zk.Conn {
	t.Helper()
	dialer := func(network, addr string, timeout time.Duration) (net.Conn, error) {
		return tls.DialWithDialer(&net.Dialer{Timeout: timeout}, network, addr, cfg)
	}
	c, _, err := zk.Connect(addrs, 10*time.Second, zk.WithLogger(testLogger{t}), zk.WithDialer(dialer))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	testutil.WaitFor(t, "a session over TLS", 10*time.Second, func() bool { return c.State() == zk.StateHasSession })
	return c
}

// rawTLS is a rawConn over TLS.
func rawTLS(t *testing.T, addr string, cfg *tls.Config) *rawConn {
	t.Helper()
	nc, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &rawConn{nc}
}

// whoAmI asks r's connection who it is: scheme:id pairs.
func whoAmI(t *testing.T, r *rawConn) []string {
	t.Helper()
	code, body := r.call(t, 1, 107, nil)
	if code != 0 {
		t.Fatalf("whoAmI: code %d", code)
	}
	n := int(binary.BigEndian.Uint32(body))
	body = body[4:]
	str := func() string {
		l := int(binary.BigEndian.Uint32(body))
		s := string(body[4 : 4+l])
		body = body[4+l:]
		return s
	}
	var out []string
	for range n {
		scheme := str()
		out = append(out, scheme+":"+str())
	}
	return out
}

// cluster is a 3-member cluster serving ZooKeeper clients.
type cluster struct {
	daemons   map[string]*daemon.Daemon
	leader    string
	followers []string
}

// startZkCluster runs three members, mod configuring each; it returns
// once the leader's ZooKeeper front has published its address (when it
// has one) and serves.
func startZkCluster(t *testing.T, mod func(id string, cfg *daemon.Config)) *cluster {
	t.Helper()
	root := t.TempDir()
	ids := []string{"n1", "n2", "n3"}
	peers := map[string]string{}
	for _, id := range ids {
		peers[id] = testutil.FreeAddr(t, 61000, 65000)
	}
	cl := &cluster{daemons: map[string]*daemon.Daemon{}}
	for _, id := range ids {
		cfg := daemon.Config{NodeID: id, DataDir: filepath.Join(root, id), Listen: "127.0.0.1:0",
			ZkMinSessionTimeout: time.Second, ZkMaxSessionTimeout: 30 * time.Second,
			PeerListen: peers[id], BootstrapPeers: peers, LogOutput: testutil.LogWriter(t, id)}
		mod(id, &cfg)
		cl.daemons[id] = runDaemon(t, cfg)
	}
	testutil.WaitFor(t, "a leader", 30*time.Second, func() bool {
		for id, d := range cl.daemons {
			if d.Node.IsLeader() {
				cl.leader = id
				return true
			}
		}
		return false
	})
	for _, id := range ids {
		if id != cl.leader {
			cl.followers = append(cl.followers, id)
		}
	}
	// The cluster runs at version 3 (znodes' writes need it) once the
	// leader has raised it; followers know the leader.
	testutil.WaitFor(t, "cluster version 3 on the followers", 30*time.Second, func() bool {
		for _, id := range cl.followers {
			var cv uint32
			cl.daemons[id].Node.Read(func(st *fsm.State) { cv = st.ClusterVersion() })
			if cv < 3 || cl.daemons[id].Node.Leader() != cl.leader {
				return false
			}
		}
		return true
	})
	return cl
}

// TestRelayOverThePeerPort: followers relay their clients to the leader
// over the peer port, under peer TLS, so a client of a follower writes
// although the ZooKeeper address the leader published cannot be reached
// (a firewall: here an address nobody listens on) and although the
// members serve ZooKeeper over TLS only. The relay carries the client's verified
// certificate: the leader checks a write through a follower against the
// client's x509 id, and a client without the certificate is refused by
// the znode's ACL. A stranger on the peer port, with a certificate of the
// peers' CA but without the cluster's signing keys, gets no relay
// connection.
func TestRelayOverThePeerPort(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster")
	}
	ca := newCerts(t)
	serverTLS := ca.serverTLS(t, true)
	peerCert, peerKey := ca.leaf(t, "peer", tlsconfig.ServerAuth|tlsconfig.ClientAuth, "127.0.0.1")
	peer, err := tlsconfig.New(tlsconfig.Files{Cert: peerCert, Key: peerKey, CA: filepath.Join(ca.dir, "ca.pem")}, tlsconfig.Peer, nil)
	if err != nil {
		t.Fatal(err)
	}
	cl := startZkCluster(t, func(id string, cfg *daemon.Config) {
		cfg.PeerTLS = peer.Config
		cfg.TLS = serverTLS
		cfg.ZkSecureListen = "127.0.0.1:0"
		cfg.ZkListen = "127.0.0.1:0"
		cfg.ZkAdvertise = "127.0.0.1:1" // published, but nothing listens there
	})
	leader := cl.daemons[cl.leader]
	testutil.WaitFor(t, "the leader's published ZooKeeper address", 30*time.Second, func() bool {
		var addr string
		cl.daemons[cl.followers[0]].Node.Read(func(st *fsm.State) { addr = st.ZkAddr(cl.leader) })
		return addr == "127.0.0.1:1"
	})
	f1, f2 := cl.daemons[cl.followers[0]], cl.daemons[cl.followers[1]]

	alice := connectTLS(t, []string{f1.ZkSecureAddr()}, ca.clientTLS(t, "alice"))
	acl := append(zk.WorldACL(zk.PermRead), zk.ACL{Perms: zk.PermAll, Scheme: "x509", ID: "CN=alice"})
	if _, err := alice.Create("/x", []byte("1"), 0, acl); err != nil {
		t.Fatalf("create through a follower over TLS: %v", err)
	}
	if _, err := alice.Create("/x/e", nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.Set("/x", []byte("2"), -1); err != nil {
		t.Fatalf("set, allowed to x509:CN=alice only, through a follower: %v", err)
	}
	if _, st, err := alice.Get("/x/e"); err != nil || st.EphemeralOwner != alice.SessionID() {
		t.Fatalf("the follower reads its client's write: %+v %v", st, err)
	}
	r := rawTLS(t, f2.ZkSecureAddr(), ca.clientTLS(t, "alice"))
	if got := r.connect(t, 0, make([]byte, 16), true); got.sessionID == 0 {
		t.Fatal("no session through the other follower")
	}
	if ids := whoAmI(t, r); len(ids) != 2 || ids[0] != "x509:CN=alice" || ids[1] != "ip:127.0.0.1" {
		t.Fatalf("whoAmI over TLS = %q, want [x509:CN=alice ip:127.0.0.1]", ids)
	}

	plain, _ := connect(t, []string{f2.ZkAddr()}, 10*time.Second)
	if _, err := plain.Create("/y", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatalf("create through the other follower in plaintext: %v", err)
	}
	if _, err := plain.Set("/x", []byte("3"), -1); !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("set by a client without the certificate: %v, want NoAuth", err)
	}
	if _, err := plain.Sync("/x"); err != nil {
		t.Fatal(err)
	}
	if data, _, err := plain.Get("/x"); err != nil || string(data) != "2" {
		t.Fatalf("/x after the refused set: %q %v", data, err)
	}

	// A relay connection a member opens to the leader is served as its
	// client's; one opened to a follower is not relayed again (the
	// follower answers nothing, and its client goes elsewhere).
	preamble := jute{}.int(1).str("127.0.0.9:5555").str("").bool(false).int(0)
	relay := func(from, to string) *rawConn {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		nc, err := cl.daemons[from].Node.DialZkRelay(ctx, to)
		if err != nil {
			t.Fatalf("relay from %s to %s: %v", from, to, err)
		}
		t.Cleanup(func() { nc.Close() })
		if _, err := nc.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(preamble))), preamble...)); err != nil {
			t.Fatal(err)
		}
		return &rawConn{nc}
	}
	viaLeader := relay(cl.followers[0], cl.leader)
	if got := viaLeader.connect(t, 0, make([]byte, 16), true); got.sessionID == 0 {
		t.Fatal("no session on a relay connection to the leader")
	}
	if ids := whoAmI(t, viaLeader); len(ids) != 1 || ids[0] != "ip:127.0.0.9" {
		t.Fatalf("whoAmI on the relay = %q, want the client named by the preamble [ip:127.0.0.9]", ids)
	}
	viaFollower := relay(cl.leader, cl.followers[1])
	var req []byte
	req = binary.BigEndian.AppendUint32(req, 0)
	req = binary.BigEndian.AppendUint64(req, 0)
	req = binary.BigEndian.AppendUint32(req, 30000)
	req = binary.BigEndian.AppendUint64(req, 0)
	req = binary.BigEndian.AppendUint32(req, 16)
	req = append(append(req, make([]byte, 16)...), 0)
	if _, err := viaFollower.nc.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(req))), req...)); err != nil {
		t.Fatal(err)
	}
	_ = viaFollower.nc.SetReadDeadline(time.Now().Add(15 * time.Second))
	if got, err := io.ReadAll(viaFollower.nc); err != nil || len(got) != 0 {
		t.Fatalf("a relay connection to a follower answered %x, %v; want it closed unanswered", got, err)
	}

	// A stranger on the leader's peer port: 'Z', the version, then a
	// proof made without the cluster's signing keys.
	var peerAddr string
	ms, err := leader.Node.Members()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.ID == cl.leader {
			peerAddr = m.PeerAddr
		}
	}
	stranger := peer.Config().Clone()
	stranger.ServerName = "127.0.0.1"
	nc, err := tls.Dial("tcp", peerAddr, stranger)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := nc.Write([]byte{'Z', 1}); err != nil {
		t.Fatal(err)
	}
	nonce := make([]byte, 16)
	if _, err := io.ReadFull(nc, nonce); err != nil {
		t.Fatalf("no nonce from the leader: %v", err)
	}
	proof := append([]byte{2}, "n9"...)
	proof = append(proof, make([]byte, 32)...)
	if _, err := nc.Write(proof); err != nil {
		t.Fatal(err)
	}
	var answer [1]byte
	if _, err := io.ReadFull(nc, answer[:]); err != nil || answer[0] != 1 {
		t.Fatalf("a bad proof: answer %v %v, want refused (1)", answer, err)
	}
	// What follows is never served as ZooKeeper's protocol: the
	// connection is closed.
	_, _ = nc.Write([]byte{0, 0, 0, 0})
	if n, err := nc.Read(make([]byte, 64)); err == nil || n > 0 {
		t.Fatalf("after a refused proof the connection answered %d bytes, %v", n, err)
	}
}

// TestSecureListenerIdentity: --zk-secure-listen with a client CA: a
// client without a certificate gets no session; one with a certificate
// is its x509 id (whoAmI) and, under --auth, the caller the
// certificate's binding names for Tenure's ACLs, as on Tenure's API: a
// bound name writes what its policy allows, an unbound one is refused
// NoAuth. A plaintext client on the TLS port gets nothing.
func TestSecureListenerIdentity(t *testing.T) {
	ca := newCerts(t)
	d, _ := startNode(t, func(c *daemon.Config) {
		c.TLS = ca.serverTLS(t, true)
		c.ZkListen = ""
		c.ZkSecureListen = "127.0.0.1:0"
		c.Auth = true
	})
	if d.ZkAddr() != "" || d.ZkSecureAddr() == "" {
		t.Fatalf("addresses %q (plaintext), %q (TLS)", d.ZkAddr(), d.ZkSecureAddr())
	}
	addr := d.ZkSecureAddr()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := testutil.Dial(t, d.Addr(), client.WithTLS(ca.clientTLS(t, "operator")))
	tok, err := admin.BootstrapACL(ctx)
	if err != nil {
		t.Fatal(err)
	}
	admin = testutil.Dial(t, d.Addr(), client.WithTLS(ca.clientTLS(t, "operator")), client.WithAuthToken(tok.Secret))
	rule, err := fsm.ParseRule("kv:zk/app:write")
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.CreatePolicy(ctx, &pb.AclPolicy{Name: "app", Rules: []*pb.AclRule{{Kind: string(rule.Kind), Prefix: rule.Prefix, Access: rule.Access.String()}}}, false); err != nil {
		t.Fatal(err)
	}
	if err := admin.BindIdentity(ctx, "alice", []string{"app"}); err != nil {
		t.Fatal(err)
	}

	// No certificate: the handshake fails, no session.
	nc, err := tls.Dial("tcp", addr, ca.clientTLS(t, ""))
	if err == nil {
		_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = nc.Write(append(binary.BigEndian.AppendUint32(nil, 45), make([]byte, 45)...))
		_, err = nc.Read(make([]byte, 1))
		nc.Close()
	}
	if err == nil {
		t.Fatal("a client without a certificate was answered")
	}
	// Plaintext on the TLS port: at most a TLS alert, then the end.
	pr := raw(t, addr)
	_, _ = pr.nc.Write(append(binary.BigEndian.AppendUint32(nil, 45), make([]byte, 45)...))
	_ = pr.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(pr.nc)
	if err != nil || len(got) > 0 && got[0] != 0x15 {
		t.Fatalf("a plaintext client on the TLS port: %x %v, want a TLS alert at most, then the connection closed", got, err)
	}

	alice := connectTLS(t, []string{addr}, ca.clientTLS(t, "alice"))
	if _, err := alice.Create("/app", []byte("a"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatalf("create by a certificate bound to kv:zk/app:write: %v", err)
	}
	if _, err := alice.Create("/other", nil, 0, zk.WorldACL(zk.PermAll)); !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("create outside its policy: %v, want NoAuth", err)
	}
	bob := connectTLS(t, []string{addr}, ca.clientTLS(t, "bob"))
	if _, err := bob.Create("/app/b", nil, 0, zk.WorldACL(zk.PermAll)); !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("create by an unbound certificate: %v, want NoAuth", err)
	}
	r := rawTLS(t, addr, ca.clientTLS(t, "alice"))
	if got := r.connect(t, 0, make([]byte, 16), true); got.sessionID == 0 {
		t.Fatal("no session")
	}
	if ids := whoAmI(t, r); len(ids) != 2 || ids[0] != "x509:CN=alice" || !strings.HasPrefix(ids[1], "ip:") {
		t.Fatalf("whoAmI = %q, want [x509:CN=alice ip:...] (ZooKeeper's order)", ids)
	}
}

// TestSecureListenerHandshakeDeadline: a client that opens a connection
// to --zk-secure-listen and never finishes its TLS handshake is closed
// once the handshake's time is up.
func TestSecureListenerHandshakeDeadline(t *testing.T) {
	t.Cleanup(zkapi.SetHandshakeTimeout(time.Second)) // restored once the node stopped
	ca := newCerts(t)
	d, _ := startNode(t, func(c *daemon.Config) {
		c.TLS = ca.serverTLS(t, false)
		c.ZkListen = ""
		c.ZkSecureListen = "127.0.0.1:0"
	})
	nc, err := net.Dial("tcp", d.ZkSecureAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	start := time.Now()
	_ = nc.SetReadDeadline(time.Now().Add(20 * time.Second))
	got, err := io.ReadAll(nc)
	if err != nil {
		t.Fatalf("a silent client was not closed: %x %v", got, err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("closed after %v, want about the handshake's bound (1s)", took)
	}
	// A client that does its handshake gets a session.
	connectTLS(t, []string{d.ZkSecureAddr()}, ca.clientTLS(t, ""))
}

// TestSecureListenerReloadsCertificate: --zk-secure-listen serves the
// certificate the files hold now: replaced on disk, the next handshake
// presents the new one, as Tenure's API does (internal/tlsconfig).
func TestSecureListenerReloadsCertificate(t *testing.T) {
	ca := newCerts(t)
	d, _ := startNode(t, func(c *daemon.Config) {
		c.TLS = ca.serverTLS(t, false)
		c.ZkListen = ""
		c.ZkSecureListen = "127.0.0.1:0"
	})
	served := func() []byte {
		nc, err := tls.Dial("tcp", d.ZkSecureAddr(), ca.clientTLS(t, ""))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		return nc.ConnectionState().PeerCertificates[0].Raw
	}
	before := served()
	ca.leaf(t, "server", tlsconfig.ServerAuth, "127.0.0.1") // the same files, a new certificate
	testutil.WaitFor(t, "the new certificate served", 10*time.Second, func() bool { return !bytes.Equal(served(), before) })
}
