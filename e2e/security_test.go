package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/fenceproof"
	"github.com/tenure-io/tenure/internal/testutil"
)

// secureCluster is a cluster of `tenure serve` processes with TLS for
// clients (client certificates required), mutual TLS between peers and
// ACLs, set up with the files of `tenure cert dev`, as docs/security.md
// walks through it.
type secureCluster struct {
	t     *testing.T
	ms    []*member
	certs string
	admin string // the management token's secret
}

// file is a file of the development certificates.
func (sc *secureCluster) file(name string) string { return filepath.Join(sc.certs, name) }

// tls is the environment of a client with the development client
// certificate.
func (sc *secureCluster) tls() []string {
	return []string{"TENURE_CACERT=" + sc.file("ca.pem"), "TENURE_CERT=" + sc.file("client.pem"), "TENURE_KEY=" + sc.file("client-key.pem")}
}

// run runs a tenure command against the cluster with extra environment.
func (sc *secureCluster) run(extra []string, args ...string) result {
	t := sc.t
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "tenure"), args...)
	cmd.Env = append(env(endpoints(sc.ms)), extra...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("tenure %v did not finish in 30s", args)
	}
	return result{code: exitStatus(cmd.ProcessState), stdout: out.String(), stderr: errb.String()}
}

// runJSON runs a command with -o json that must exit with want and decodes
// its output into v.
func (sc *secureCluster) runJSON(extra []string, want int, v any, args ...string) {
	sc.t.Helper()
	r := sc.run(extra, append(args, "-o", "json")...)
	if r.code != want {
		sc.t.Fatalf("tenure %v: exit %d, want %d\nstdout: %s\nstderr: %s", args, r.code, want, r.stdout, r.stderr)
	}
	if v != nil {
		if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
			sc.t.Fatalf("tenure %v: stdout %q: %v", args, r.stdout, err)
		}
	}
}

func startSecureCluster(t *testing.T, n int) *secureCluster {
	t.Helper()
	root := t.TempDir()
	sc := &secureCluster{t: t, certs: filepath.Join(root, "certs")}
	if r := tenure(t, "127.0.0.1:1", "cert", "dev", "--dir", sc.certs); r.code != 0 {
		t.Fatalf("cert dev: exit %d, %s", r.code, r.stderr)
	}
	var peers []string
	for i := 0; i < n; i++ {
		m := &member{id: fmt.Sprintf("n%d", i+1), addr: freeAddr(t), peer: freeAddr(t)}
		sc.ms = append(sc.ms, m)
		peers = append(peers, m.id+"="+m.peer)
	}
	for _, m := range sc.ms {
		m.p = start(t, m.id, m.addr, "serve", "--http-listen", "127.0.0.1:0", "--node-id", m.id, "--listen", m.addr, "--peer-listen", m.peer,
			"--data-dir", filepath.Join(root, m.id), "--bootstrap-peers", strings.Join(peers, ","),
			"--tls-cert", sc.file("server.pem"), "--tls-key", sc.file("server-key.pem"), "--tls-client-ca", sc.file("ca.pem"),
			"--peer-tls-cert", sc.file("peer.pem"), "--peer-tls-key", sc.file("peer-key.pem"), "--peer-tls-ca", sc.file("ca.pem"),
			"--auth")
	}
	for _, m := range sc.ms {
		testutil.WaitFor(t, m.id+"'s ready line", 30*time.Second, func() bool {
			if m.p.exited() {
				t.Fatalf("%s exited with %d: %s", m.id, m.p.status, m.p.stderr())
			}
			return strings.HasPrefix(m.p.stdout(), "tenure: serving on "+m.addr)
		})
	}
	var boot struct{ ID, Secret string }
	sc.runJSON(sc.tls(), 0, &boot, "acl", "bootstrap")
	sc.admin = boot.Secret
	return sc
}

// TestSecureClusterWalkthrough: docs/security.md's walkthrough, against
// real processes: three members whose raft traffic is mutual TLS, clients
// over TLS with certificates, ACLs bootstrapped; a worker token reaches
// its prefix and nothing else, fences its writes with the grant's proof,
// and the cluster keeps serving it after its leader is killed.
func TestSecureClusterWalkthrough(t *testing.T) {
	sc := startSecureCluster(t, 3)
	admin := append(sc.tls(), "TENURE_AUTH_TOKEN="+sc.admin)
	sc.runJSON(admin, 0, nil, "acl", "policy", "create", "jobs",
		"--rule", "lock:jobs/:write", "--rule", "fence:jobs/:write", "--rule", "session::write")
	var tok struct{ ID, Secret string }
	sc.runJSON(admin, 0, &tok, "acl", "token", "create", "--policy", "jobs")
	worker := append(sc.tls(), "TENURE_AUTH_TOKEN="+tok.Secret)

	// The worker's fenced write, with the grant's proof.
	if r := sc.run(worker, "lock", "jobs/a", "--", "sh", "-c",
		`tenure fence put jobs/a v1 --token "$TENURE_FENCE_TOKEN" --proof "$TENURE_FENCE_PROOF"`); r.code != 0 {
		t.Fatalf("the worker's fenced write: exit %d\n%s", r.code, r.stderr)
	}
	for _, c := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"another prefix", worker, []string{"lock", "billing/a", "--", "true"}, `lock write on "billing/a"`},
		{"a snapshot", worker, []string{"snapshot", "save", filepath.Join(t.TempDir(), "s")}, "cluster write"},
		{"a certificate bound to nothing, no token", sc.tls(), []string{"fence", "get", "jobs/a"}, `certificate "tenure-dev-client"`},
		{"plaintext", nil, []string{"status"}, ""},
		{"no client certificate", []string{"TENURE_CACERT=" + sc.file("ca.pem"), "TENURE_AUTH_TOKEN=" + sc.admin}, []string{"status"}, ""},
	} {
		r := sc.run(c.env, c.args...)
		if r.code != 1 || !strings.HasPrefix(r.stderr, "tenure: ") || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%s: exit %d, stderr %q; want exit 1 naming %q", c.name, r.code, r.stderr, c.want)
		}
	}

	// The cluster's keys verify the worker's proofs offline.
	var ks fenceproof.Keyset
	sc.runJSON(admin, 0, &ks, "cluster", "keys")
	raw, _ := json.Marshal(ks)
	v, err := fenceproof.ParseKeyset(raw)
	if err != nil {
		t.Fatal(err)
	}

	// Kill the leader: the others elect a new one over mutual TLS.
	var st struct {
		Leader string `json:"leader"`
	}
	sc.runJSON(admin, 0, &st, "status")
	for _, m := range sc.ms {
		if m.id == st.Leader {
			if err := m.p.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			<-m.p.done
		}
	}
	out := filepath.Join(t.TempDir(), "grant")
	testutil.WaitFor(t, "a grant after the leader was killed", 60*time.Second, func() bool {
		r := sc.run(worker, "lock", "jobs/b", "--", "sh", "-c", `echo "$TENURE_FENCE_TOKEN $TENURE_FENCE_PROOF" > `+out)
		return r.code == 0
	})
	var token uint64
	var proof string
	if _, err := fmt.Sscan(readFile(t, out, 5*time.Second), &token, &proof); err != nil {
		t.Fatal(err)
	}
	if err := v.Verify("jobs/b", token, proof); err != nil {
		t.Fatalf("the new leader's proof does not verify with the keys read before: %v", err)
	}
}
