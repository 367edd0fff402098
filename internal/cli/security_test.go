package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tenure-io/tenure/fenceproof"

	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/testutil"
	"github.com/tenure-io/tenure/internal/tlsconfig"
)

// devCerts writes the development certificates into a temp dir.
func devCerts(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "certs")
	m := runJSON(t, "127.0.0.1:1", 0, "cert", "dev", "--dir", dir)
	if m["dir"] != dir || len(m["files"].([]any)) != len(tlsconfig.DevFiles) {
		t.Fatalf("cert dev -o json = %v", m)
	}
	return dir
}

// TestCLITLSFlags: with the files of `tenure cert dev`, --cacert, --cert
// and --key reach a server that requires client certificates; without
// them the command fails with one line.
func TestCLITLSFlags(t *testing.T) {
	dir := devCerts(t)
	f := func(n string) string { return filepath.Join(dir, n) }
	r, err := tlsconfig.New(tlsconfig.Files{Cert: f("server.pem"), Key: f("server-key.pem"), CA: f("ca.pem")}, tlsconfig.Server, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := testutil.StartConfig(t, daemon.Config{TLS: r.ServerConfig()})

	runJSON(t, s.Addr(), 0, "status", "--cacert", f("ca.pem"), "--cert", f("client.pem"), "--key", f("client-key.pem"))
	for _, args := range [][]string{
		{"status"},                          // plaintext
		{"status", "--cacert", f("ca.pem")}, // no client certificate
	} {
		res := run(t, s.Addr(), args...)
		if res.code != ExitError || !strings.HasPrefix(res.stderr, "tenure: ") || strings.Count(res.stderr, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q; want exit 1 and one line", args, res.code, res.stderr)
		}
	}
	if res := run(t, s.Addr(), "status", "--cert", f("client.pem")); res.code != ExitError || !strings.Contains(res.stderr, "--key") {
		t.Errorf("--cert without --key: exit %d, stderr %q", res.code, res.stderr)
	}
	t.Setenv(envCACert, f("ca.pem"))
	t.Setenv(envCert, f("client.pem"))
	t.Setenv(envKey, f("client-key.pem"))
	runJSON(t, s.Addr(), 0, "status") // the environment's defaults

}

// TestProtectedMode: serving outside loopback needs TLS and --auth (and
// raft peers outside loopback need peer TLS), unless --insecure.
func TestProtectedMode(t *testing.T) {
	dir := devCerts(t)
	f := func(n string) string { return filepath.Join(dir, n) }
	withTLS := serveSecurity{tls: tlsconfig.Files{Cert: f("server.pem"), Key: f("server-key.pem")}}
	withTLSAuth := withTLS
	withTLSAuth.auth = true
	peer := tlsconfig.Files{Cert: f("peer.pem"), Key: f("peer-key.pem"), CA: f("ca.pem")}
	for _, c := range []struct {
		name         string
		sec          serveSecurity
		listen, raft string
		refused      string // "" when it may serve
	}{
		{"loopback, nothing", serveSecurity{}, "127.0.0.1:7070", "", ""},
		{"localhost, nothing", serveSecurity{}, "localhost:7070", "", ""},
		{"::1, nothing", serveSecurity{}, "[::1]:7070", "", ""},
		{"every interface, nothing", serveSecurity{}, ":7070", "", "without TLS and --auth"},
		{"a network address, TLS only", withTLS, "10.1.2.3:7070", "", "without TLS and --auth"},
		{"a network address, auth only", serveSecurity{auth: true}, "0.0.0.0:7070", "", "without TLS and --auth"},
		{"a network address, TLS and auth", withTLSAuth, "0.0.0.0:7070", "", ""},
		{"a network address, insecure", serveSecurity{insecure: true}, "0.0.0.0:7070", "0.0.0.0:7071", ""},
		{"raft on the network without peer TLS", withTLSAuth, "0.0.0.0:7070", "0.0.0.0:7071", "without peer TLS"},
		{"raft on the network with peer TLS", serveSecurity{tls: withTLSAuth.tls, auth: true, peer: peer}, "0.0.0.0:7070", "0.0.0.0:7071", ""},
		{"raft on loopback", serveSecurity{}, "127.0.0.1:7070", "127.0.0.1:7071", ""},
	} {
		cfg := daemon.Config{Listen: c.listen, PeerListen: c.raft}
		_, err := c.sec.configure(&cfg, nil)
		switch {
		case c.refused == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.refused != "" && (err == nil || !strings.Contains(err.Error(), c.refused) || !strings.Contains(err.Error(), "--insecure")):
			t.Errorf("%s: %v, want a refusal saying %q and naming --insecure", c.name, err, c.refused)
		}
	}
	// Outside loopback the etcd API needs TLS and --auth, or client
	// certificates, as the client API does.
	for _, c := range []struct {
		name, etcd string
		sec        serveSecurity
		refused    bool
	}{
		{"etcd API on loopback", "127.0.0.1:2379", serveSecurity{}, false},
		{"etcd API on the network", "0.0.0.0:2379", serveSecurity{}, true},
		{"etcd API on the network with TLS only", "0.0.0.0:2379", serveSecurity{tls: withTLSAuth.tls}, true},
		{"etcd API on the network with TLS and --auth", "0.0.0.0:2379", withTLSAuth, false},
		{"etcd API on the network, insecure", "0.0.0.0:2379", serveSecurity{insecure: true}, false},
	} {
		cfg := daemon.Config{Listen: "127.0.0.1:7070", EtcdListen: c.etcd}
		_, err := c.sec.configure(&cfg, nil)
		if (err != nil) != c.refused || (err != nil && !strings.Contains(err.Error(), "--insecure")) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	// Outside loopback the ZooKeeper API, which has no TLS, needs --auth.
	for _, c := range []struct {
		name, zk string
		sec      serveSecurity
		refused  bool
	}{
		{"ZooKeeper API on loopback", "127.0.0.1:2181", serveSecurity{}, false},
		{"ZooKeeper API on the network", "0.0.0.0:2181", serveSecurity{}, true},
		{"ZooKeeper API on the network with --auth", "0.0.0.0:2181", serveSecurity{auth: true}, false},
		{"ZooKeeper API on the network, insecure", "0.0.0.0:2181", serveSecurity{insecure: true}, false},
	} {
		cfg := daemon.Config{Listen: "127.0.0.1:7070", ZkListen: c.zk}
		_, err := c.sec.configure(&cfg, nil)
		if (err != nil) != c.refused || (err != nil && !strings.Contains(err.Error(), "--insecure")) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	// Outside loopback the ZooKeeper API over TLS follows the etcd API's
	// rule: --auth or client certificates. It needs the certificate.
	withClientCA := withTLS
	withClientCA.tls.CA = f("ca.pem")
	for _, c := range []struct {
		name, zk string
		sec      serveSecurity
		refused  string // "" when it may serve
	}{
		{"ZooKeeper over TLS on loopback", "127.0.0.1:2281", withTLS, ""},
		{"ZooKeeper over TLS without a certificate", "127.0.0.1:2281", serveSecurity{}, "needs --tls-cert"},
		{"ZooKeeper over TLS on the network", "0.0.0.0:2281", withTLS, "--insecure"},
		{"ZooKeeper over TLS on the network with --auth", "0.0.0.0:2281", withTLSAuth, ""},
		{"ZooKeeper over TLS on the network with client certificates", "0.0.0.0:2281", withClientCA, ""},
		{"ZooKeeper over TLS on the network, insecure", "0.0.0.0:2281", serveSecurity{tls: withTLS.tls, insecure: true}, ""},
	} {
		cfg := daemon.Config{Listen: "127.0.0.1:7070", ZkSecureListen: c.zk}
		_, err := c.sec.configure(&cfg, nil)
		if (err != nil) != (c.refused != "") || (err != nil && !strings.Contains(err.Error(), c.refused)) {
			t.Errorf("%s: %v, want a refusal saying %q", c.name, err, c.refused)
		}
	}
	// The command line: one line, exit 1, before anything starts.
	res := run(t, "127.0.0.1:1", "serve", "--listen", "0.0.0.0:0", "--data-dir", filepath.Join(t.TempDir(), "d"))
	if res.code != ExitError || strings.Count(res.stderr, "\n") != 1 || !strings.Contains(res.stderr, "refusing to serve") {
		t.Fatalf("serve on 0.0.0.0 without TLS and auth: exit %d, stderr %q", res.code, res.stderr)
	}
}

// TestCLIACL: bootstrap, a policy, a token, and requests the token may
// and may not make, through the command line.
func TestCLIACL(t *testing.T) {
	s := testutil.StartConfig(t, daemon.Config{Auth: true})
	boot := runJSON(t, s.Addr(), 0, "acl", "bootstrap")
	if len(boot) != 2 || boot["id"] == "" || !strings.HasPrefix(boot["secret"].(string), "tnr_") {
		t.Fatalf("acl bootstrap -o json = %v, want {id, secret}", boot)
	}
	admin := boot["secret"].(string)
	if res := run(t, s.Addr(), "acl", "bootstrap"); res.code != ExitError || !strings.Contains(res.stderr, "permission denied") {
		t.Fatalf("second bootstrap: exit %d, %q", res.code, res.stderr)
	}
	pol := runJSON(t, s.Addr(), 0, "acl", "policy", "create", "jobs", "--rule", "lock:jobs/:write", "--rule", "kv:config/:read", "--rule", "session::write", "--auth-token", admin)
	if pol["name"] != "jobs" || len(pol["rules"].([]any)) != 3 {
		t.Fatalf("policy create = %v", pol)
	}
	if res := run(t, s.Addr(), "acl", "policy", "create", "bad", "--rule", "locks:x:write", "--auth-token", admin); res.code != ExitError || !strings.Contains(res.stderr, "kind") {
		t.Fatalf("a bad rule: exit %d, %q", res.code, res.stderr)
	}
	tok := runJSON(t, s.Addr(), 0, "acl", "token", "create", "--policy", "jobs", "--auth-token", admin)
	worker := tok["secret"].(string)
	list := runJSON(t, s.Addr(), 0, "acl", "token", "list", "--auth-token", admin)
	if n := len(list["tokens"].([]any)); n != 2 {
		t.Fatalf("token list: %v", list)
	}

	t.Setenv(envAuthToken, worker)
	if res := run(t, s.Addr(), "lock", "jobs/a", "--", "true"); res.code != 0 {
		t.Fatalf("lock jobs/a with the worker token: exit %d, %q", res.code, res.stderr)
	}
	for _, args := range [][]string{
		{"lock", "billing/a", "--", "true"},
		{"kv", "put", "config/x", "v"},
		{"snapshot", "save", filepath.Join(t.TempDir(), "snap")},
		{"acl", "token", "create", "--policy", "jobs"},
	} {
		res := run(t, s.Addr(), args...)
		if res.code != ExitError || !strings.HasPrefix(res.stderr, "tenure: permission denied") || strings.Count(res.stderr, "\n") != 1 {
			t.Errorf("%v with the worker token: exit %d, stderr %q; want one permission denied line", args, res.code, res.stderr)
		}
	}
	who := runJSON(t, s.Addr(), 0, "acl", "whoami")
	if who["identity"] != "token "+tok["id"].(string) || who["auth"] != true {
		t.Fatalf("whoami = %v", who)
	}
	runJSON(t, s.Addr(), 0, "acl", "token", "revoke", tok["id"].(string), "--auth-token", admin)
	if res := run(t, s.Addr(), "lock", "jobs/a", "--", "true"); res.code != ExitError || !strings.Contains(res.stderr, "revoked") {
		t.Fatalf("lock with a revoked token: exit %d, %q", res.code, res.stderr)
	}
}

// TestCLIFenceProof: tenure lock exports TENURE_FENCE_PROOF, which the
// keys of tenure cluster keys -o json verify for the lock and token, and
// tenure fence put --proof stores only with a proof that verifies.
func TestCLIFenceProof(t *testing.T) {
	s := testutil.Start(t, "", nil)
	out := filepath.Join(t.TempDir(), "grant")
	if res := run(t, s.Addr(), "lock", "shard-7", "--", "sh", "-c", `echo "$TENURE_FENCE_TOKEN $TENURE_FENCE_PROOF" > `+out); res.code != 0 {
		t.Fatalf("lock: exit %d, %q", res.code, res.stderr)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var token uint64
	var proof string
	if _, err := fmt.Sscan(string(b), &token, &proof); err != nil || proof == "" {
		t.Fatalf("the command saw %q: %v", b, err)
	}
	r := run(t, s.Addr(), "cluster", "keys", "-o", "json")
	v, err := fenceproof.ParseKeyset([]byte(r.stdout))
	if r.code != 0 || err != nil {
		t.Fatalf("cluster keys: exit %d, %q, %v", r.code, r.stdout, err)
	}
	if err := v.Verify("shard-7", token, proof); err != nil {
		t.Fatalf("TENURE_FENCE_PROOF does not verify: %v", err)
	}
	tok := strconv.FormatUint(token, 10)
	if m := runJSON(t, s.Addr(), 0, "fence", "put", "shard-7", "v1", "--token", tok, "--proof", proof); m["result"] != "accepted" {
		t.Fatalf("fence put with the proof: %v", m)
	}
	forged := runJSON(t, s.Addr(), ExitError, "fence", "put", "shard-7", "v2", "--token", tok, "--proof", "AQAAAAAAAAAA")
	if forged["result"] != "forged" || forged["token"] != float64(token) {
		t.Fatalf("fence put with a forged proof: %v", forged)
	}
	if m := runJSON(t, s.Addr(), 0, "fence", "get", "shard-7"); m["value"] != "v1" {
		t.Fatalf("the forged write was stored: %v", m)
	}
}

// TestProtectedModeHTTP: protected mode covers --http-listen as it covers
// the client API: outside loopback it needs TLS (--http-tls-cert) and
// --auth, unless --insecure; --pprof outside loopback needs --auth even
// with --insecure. `serve --http-listen 0.0.0.0:… --pprof` used to start
// without a word.
func TestProtectedModeHTTP(t *testing.T) {
	dir := devCerts(t)
	f := func(n string) string { return filepath.Join(dir, n) }
	httpTLS := tlsconfig.Files{Cert: f("server.pem"), Key: f("server-key.pem")}
	for _, c := range []struct {
		name    string
		sec     serveSecurity
		http    string
		pprof   bool
		refused string // "" when it may serve
	}{
		{"loopback, nothing", serveSecurity{}, "127.0.0.1:7071", false, ""},
		{"loopback with pprof, nothing", serveSecurity{}, "localhost:7071", true, ""},
		{"every interface, nothing", serveSecurity{}, "0.0.0.0:7071", false, "without TLS and --auth"},
		{"no host, nothing", serveSecurity{}, ":7071", false, "without TLS and --auth"},
		{"every interface, auth only", serveSecurity{auth: true}, "0.0.0.0:7071", false, "without TLS and --auth"},
		{"every interface, TLS only", serveSecurity{httpTLS: httpTLS}, "0.0.0.0:7071", false, "without TLS and --auth"},
		{"every interface, TLS and auth", serveSecurity{httpTLS: httpTLS, auth: true}, "0.0.0.0:7071", false, ""},
		{"every interface, TLS and auth, pprof", serveSecurity{httpTLS: httpTLS, auth: true}, "0.0.0.0:7071", true, ""},
		{"every interface, insecure", serveSecurity{insecure: true}, "0.0.0.0:7071", false, ""},
		{"every interface, insecure, pprof", serveSecurity{insecure: true}, "0.0.0.0:7071", true, "--pprof"},
		{"every interface, insecure and auth, pprof", serveSecurity{insecure: true, auth: true}, "0.0.0.0:7071", true, ""},
	} {
		cfg := daemon.Config{Listen: "127.0.0.1:7070", HTTPListen: c.http, Pprof: c.pprof}
		_, err := c.sec.configure(&cfg, nil)
		switch {
		case c.refused == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.refused != "" && (err == nil || !strings.Contains(err.Error(), c.refused)):
			t.Errorf("%s: %v, want a refusal saying %q", c.name, err, c.refused)
		case c.refused == "without TLS and --auth" && !strings.Contains(err.Error(), "--insecure"):
			t.Errorf("%s: %v, want the refusal to name --insecure", c.name, err)
		}
		if err == nil && c.sec.httpTLS.Cert != "" && cfg.HTTPTLS == nil {
			t.Errorf("%s: no TLS configuration for the HTTP listener", c.name)
		}
	}
	// The command line: one line, exit 1, before anything starts.
	res := run(t, "127.0.0.1:1", "serve", "--http-listen", "0.0.0.0:0", "--pprof", "--data-dir", filepath.Join(t.TempDir(), "d"))
	if res.code != ExitError || strings.Count(res.stderr, "\n") != 1 || !strings.Contains(res.stderr, "refusing to serve") {
		t.Fatalf("serve --http-listen 0.0.0.0:0 --pprof: exit %d, stderr %q", res.code, res.stderr)
	}
}
