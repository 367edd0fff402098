package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
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

// startMixedAuthCluster runs n1 and n2 with --auth and n3 without, on
// loopback without TLS, bootstrapped together, and bootstraps the ACLs;
// it returns the members and the management token.
func startMixedAuthCluster(t *testing.T) ([]*member, string) {
	t.Helper()
	ms := make([]*member, 3)
	var peers []string
	for i := range ms {
		ms[i] = &member{id: fmt.Sprintf("n%d", i+1), addr: freeAddr(t), peer: freeAddr(t)}
		peers = append(peers, ms[i].id+"="+ms[i].peer)
	}
	root := t.TempDir()
	for i, m := range ms {
		args := []string{"serve", "--http-listen", "127.0.0.1:0", "--node-id", m.id, "--listen", m.addr, "--peer-listen", m.peer,
			"--data-dir", filepath.Join(root, m.id), "--bootstrap-peers", strings.Join(peers, ",")}
		if i < 2 {
			args = append(args, "--auth")
		}
		m.p = start(t, m.id, m.addr, args...)
	}
	for _, m := range ms {
		testutil.WaitFor(t, m.id+"'s ready line", 30*time.Second, func() bool {
			if m.p.exited() {
				t.Fatalf("%s exited with %d: %s", m.id, m.p.status, m.p.stderr())
			}
			return strings.HasPrefix(m.p.stdout(), "tenure: serving on "+m.addr)
		})
	}
	var boot struct{ ID, Secret string }
	var r result
	testutil.WaitFor(t, "acl bootstrap", 30*time.Second, func() bool {
		r = tenure(t, endpoints(ms), "acl", "bootstrap", "-o", "json")
		return r.code == 0
	})
	if err := json.Unmarshal([]byte(r.stdout), &boot); err != nil {
		t.Fatal(err)
	}
	return ms, boot.Secret
}

// moveLeader stops (SIGSTOP) leaders until the cluster's leader is one
// for which want holds, letting each stopped one go on (SIGCONT) once
// another leads.
func moveLeader(t *testing.T, ctx context.Context, ms []*member, admin string, want func(*member) bool) *member {
	t.Helper()
	c := dial(t, ctx, endpoints(ms), client.WithAuthToken(admin))
	for range 20 {
		var l *member
		testutil.WaitFor(t, "a leader", 30*time.Second, func() bool {
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			st, err := c.Status(sctx)
			for _, m := range ms {
				if err == nil && m.id == st.GetLeader() {
					l = m
				}
			}
			return l != nil
		})
		if want(l) {
			return l
		}
		l.p.signal(syscall.SIGSTOP)
		var others []*member
		for _, m := range ms {
			if m != l {
				others = append(others, m)
			}
		}
		rest := dial(t, ctx, endpoints(others), client.WithAuthToken(admin))
		testutil.WaitFor(t, "a leader other than "+l.id, 30*time.Second, func() bool {
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			st, err := rest.Status(sctx)
			return err == nil && st.GetLeader() != "" && st.GetLeader() != l.id
		})
		l.p.signal(syscall.SIGCONT)
	}
	t.Fatal("the leader never moved where it was wanted")
	return nil
}

// TestMixedAuthClusterRefusesAnonymousCallers: n1 and n2 run with --auth,
// n3 without, as a member given --etcd-listen had to. The ACLs are the
// cluster's: n3 as a follower serves no anonymous serializable read of a
// protected key, and as the leader refuses an anonymous put and the
// minting of a management token.
func TestMixedAuthClusterRefusesAnonymousCallers(t *testing.T) {
	ms, admin := startMixedAuthCluster(t)
	n3 := ms[2]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if r := tenure(t, endpoints(ms), "kv", "put", "secret/k", "hunter2", "--auth-token", admin); r.code != 0 {
		t.Fatalf("admin put: exit %d, %s", r.code, r.stderr)
	}
	testutil.WaitFor(t, "n3 to hold the key", 30*time.Second, func() bool {
		r := tenure(t, n3.addr, "kv", "get", "secret/k", "--consistency", "serializable", "--auth-token", admin)
		return r.code == 0 && strings.Contains(r.stdout, "hunter2")
	})

	moveLeader(t, ctx, ms, admin, func(m *member) bool { return m != n3 })
	r := tenure(t, n3.addr, "kv", "get", "secret/k", "--consistency", "serializable")
	if r.code == 0 || strings.Contains(r.stdout, "hunter2") {
		t.Fatalf("follower n3 served an anonymous serializable read: exit %d, %q", r.code, r.stdout)
	}

	moveLeader(t, ctx, ms, admin, func(m *member) bool { return m == n3 })
	for _, args := range [][]string{
		{"kv", "put", "secret/k", "owned"},
		{"acl", "token", "create", "--policy", "management"},
	} {
		r := tenure(t, n3.addr, args...)
		if r.code != 1 || !strings.Contains(r.stderr, "permission denied") {
			t.Errorf("anonymous %v on leader n3: exit %d, stdout %q, stderr %q; want permission denied", args, r.code, r.stdout, r.stderr)
		}
	}
	if r := tenure(t, n3.addr, "kv", "get", "secret/k", "--auth-token", admin); r.code != 0 || !strings.Contains(r.stdout, "hunter2") {
		t.Fatalf("the key after the refused put: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
}

// TestRevokedWorkersWatchEnds: a worker's `tenure kv watch` ends with
// permission denied once its token is revoked, and prints nothing written
// after the revocation.
func TestRevokedWorkersWatchEnds(t *testing.T) {
	ms, admin := startMixedAuthCluster(t)
	eps := endpoints(ms)
	var tok struct{ ID, Secret string }
	if r := tenure(t, eps, "acl", "policy", "create", "reader", "--rule", "kv:jobs/:read", "--auth-token", admin); r.code != 0 {
		t.Fatalf("policy create: exit %d, %s", r.code, r.stderr)
	}
	r := tenure(t, eps, "acl", "token", "create", "--policy", "reader", "-o", "json", "--auth-token", admin)
	if err := json.Unmarshal([]byte(r.stdout), &tok); err != nil {
		t.Fatalf("token create: %q %q: %v", r.stdout, r.stderr, err)
	}
	w := start(t, "watch", eps, "kv", "watch", "jobs/", "--prefix", "-o", "json", "--auth-token", tok.Secret)
	testutil.WaitFor(t, "the watch to print a change", 30*time.Second, func() bool {
		tenure(t, eps, "kv", "put", "jobs/before", "1", "--auth-token", admin)
		return strings.Contains(w.stdout(), "jobs/before")
	})
	if r := tenure(t, eps, "acl", "token", "revoke", tok.ID, "--auth-token", admin); r.code != 0 {
		t.Fatalf("revoke: exit %d, %s", r.code, r.stderr)
	}
	revoked := time.Now()
	if r := tenure(t, eps, "kv", "put", "jobs/after", "2", "--auth-token", admin); r.code != 0 {
		t.Fatalf("put: exit %d, %s", r.code, r.stderr)
	}
	if code := w.wait(10 * time.Second); code != 1 || !strings.Contains(w.stderr(), "permission denied") {
		t.Fatalf("the watch after the revocation: exit %d, stderr %q", code, w.stderr())
	}
	t.Logf("the watch ended %v after the revocation was acknowledged", time.Since(revoked))
	if strings.Contains(w.stdout(), "jobs/after") {
		t.Fatalf("the watch printed a change written after the revocation:\n%s", w.stdout())
	}
}
