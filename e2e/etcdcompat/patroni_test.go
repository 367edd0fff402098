package etcdcompat

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// patroniTTL is the leader key's TTL the test bootstraps Patroni with, in
// seconds (Patroni's default is 30): small, so that a leader key that is
// not renewed expires within the test.
const patroniTTL = 10

// TestPatroni runs Debian's Patroni (3.0, its `etcd3:` section, which
// speaks etcd's JSON gateway over HTTP) with a PostgreSQL member, against
// etcd and against Tenure's etcd port: Patroni bootstraps the cluster,
// becomes its leader and keeps its leader key past several TTLs; stopped
// and started again on the same data directory, it finds its cluster (the
// same system identifier, the initialize key untouched) and leads it again.
//
// Patroni and PostgreSQL come from Debian's packages (.ci/setup-patroni.sh
// installs them); the test fails, not skips, when they are missing. Run as
// root, it runs Patroni (and so PostgreSQL, which refuses root) as the
// postgres account that Debian's PostgreSQL packages create.
func TestPatroni(t *testing.T) {
	env := findPatroni(t)
	t.Run("etcd", func(t *testing.T) { runPatroni(t, env, startEtcd(t)) })
	t.Run("tenure", func(t *testing.T) { runPatroni(t, env, startTenure(t).Etcd) })
}

// patroniEnv is what running Patroni takes on this machine.
type patroniEnv struct {
	patroni string              // the patroni command
	binDir  string              // PostgreSQL's binaries
	cred    *syscall.Credential // whom to run Patroni as (and who owns its directory); nil: as the test
}

func findPatroni(t *testing.T) patroniEnv {
	t.Helper()
	const hint = "install Debian's patroni, python3-etcd and postgresql (.ci/setup-patroni.sh)"
	var env patroniEnv
	var err error
	if env.patroni, err = exec.LookPath("patroni"); err != nil {
		t.Fatalf("patroni not found: %v; %s", err, hint)
	}
	// Patroni's etcd3 section imports python-etcd: check it with the
	// interpreter Patroni runs on, so a missing module is named here and
	// not found in Patroni's log.
	py := "python3"
	if f, err := os.Open(env.patroni); err == nil {
		line, _ := bufio.NewReader(f).ReadString('\n')
		f.Close()
		if fields := strings.Fields(strings.TrimPrefix(line, "#!")); strings.HasPrefix(line, "#!") && len(fields) > 0 {
			py = fields[0]
			if filepath.Base(py) == "env" && len(fields) > 1 {
				py = fields[1]
			}
		}
	}
	if out, err := exec.Command(py, "-c", "import etcd, patroni.dcs.etcd3").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import Patroni's etcd3 support: %v\n%s%s", py, err, out, hint)
	}
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(bins) == 0 {
		t.Fatalf("no PostgreSQL server under /usr/lib/postgresql/*/bin; %s", hint)
	}
	version := func(p string) float64 {
		v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(filepath.Dir(p))), 64)
		return v
	}
	sort.Slice(bins, func(i, j int) bool { return version(bins[i]) < version(bins[j]) })
	env.binDir = filepath.Dir(bins[len(bins)-1])
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root, Patroni must run as another user (initdb refuses root), and the postgres account is missing: %v; %s", err, hint)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		env.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	return env
}

// patroniMember is one Patroni member's configuration and directory.
type patroniMember struct {
	env     patroniEnv
	scope   string
	name    string
	dir     string // the member's own directory: config, data, socket
	config  string
	restAPI string
}

func newPatroniMember(t *testing.T, env patroniEnv, etcdAddr string) *patroniMember {
	t.Helper()
	// Not t.TempDir: Patroni may run as another user, who must reach the
	// directory; a short path also keeps PostgreSQL's socket path short.
	dir, err := os.MkdirTemp("", "tenure-patroni-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if env.cred != nil {
		if err := os.Chown(dir, int(env.cred.Uid), int(env.cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	m := &patroniMember{env: env, scope: "tenure-ha", name: "pg1", dir: dir, config: filepath.Join(dir, "patroni.yml"), restAPI: freeAddr(t)}
	pg := freeAddr(t)
	_, pgPort, _ := strings.Cut(pg, ":")
	conf := fmt.Sprintf(`scope: %[1]s
name: %[2]s
restapi:
  listen: %[3]s
  connect_address: %[3]s
etcd3:
  hosts: %[4]s
bootstrap:
  dcs:
    ttl: %[9]d
    loop_wait: 2
    retry_timeout: 5
  initdb:
  - encoding: UTF8
postgresql:
  listen: %[5]s
  connect_address: %[5]s
  data_dir: %[6]s
  bin_dir: %[7]s
  pgpass: %[8]s
  authentication:
    superuser:
      username: postgres
      password: tenure-test
    replication:
      username: replicator
      password: tenure-test
  parameters:
    unix_socket_directories: %[10]s
watchdog:
  mode: "off"
`, m.scope, m.name, m.restAPI, etcdAddr, pg, filepath.Join(dir, "data"), env.binDir, filepath.Join(dir, "pgpass"), patroniTTL, dir)
	if err := os.WriteFile(m.config, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("Patroni %s, PostgreSQL %s on %s, REST API on %s, etcd at %s", env.patroni, env.binDir, pgPort, m.restAPI, etcdAddr)
	// Runs after every Patroni's own cleanup: a PostgreSQL that a killed
	// Patroni left behind (it runs in a session of its own) is stopped
	// by its PID.
	t.Cleanup(func() { m.stopPostmaster(t) })
	return m
}

// start starts Patroni with the member's configuration, in a process group
// of its own, as env.cred; it is killed when the test ends.
func (m *patroniMember) start(t *testing.T) *proc {
	t.Helper()
	logs := t.TempDir()
	p := &proc{out: filepath.Join(logs, "stdout"), errF: filepath.Join(logs, "stderr"), done: make(chan struct{})}
	stdout, err := os.Create(p.out)
	if err != nil {
		t.Fatal(err)
	}
	defer stdout.Close()
	stderr, err := os.Create(p.errF)
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	p.cmd = exec.Command(m.env.patroni, m.config)
	p.cmd.Dir = m.dir
	p.cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + m.dir, "LC_ALL=C"}
	p.cmd.Stdout, p.cmd.Stderr = stdout, stderr
	p.cmd.SysProcAttr = procAttr()
	p.cmd.SysProcAttr.Credential = m.env.cred
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		p.exitStatus = p.cmd.ProcessState.ExitCode()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		<-p.done
		if t.Failed() {
			t.Logf("patroni (pid %d) output, its last 40 lines:\n%s", p.cmd.Process.Pid, lastLines(p.stdout()+p.stderr(), 40))
		}
	})
	return p
}

// lastLines is the last n lines of s: Patroni repeats a failure every
// loop, so its last lines tell the story.
func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = append([]string{fmt.Sprintf("[%d lines]", len(l)-n)}, l[len(l)-n:]...)
	}
	return strings.Join(l, "\n")
}

// patroniErrors is the ERROR lines and tracebacks' first lines of
// Patroni's log (the test shows the log's end when it fails).
func patroniErrors(log string) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, " ERROR: ") || strings.HasPrefix(l, "Traceback") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// stop stops Patroni as an operator does, with SIGTERM to its PID: it
// stops PostgreSQL and gives up its leader key.
func (m *patroniMember) stop(t *testing.T, p *proc) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.wait(t, 30*time.Second)
	if pid := m.postmasterPID(); pid > 0 {
		t.Fatalf("PostgreSQL (pid %d) still runs after Patroni stopped", pid)
	}
}

// postmasterPID is the PID of the member's PostgreSQL when it runs, else 0.
func (m *patroniMember) postmasterPID() int {
	b, err := os.ReadFile(filepath.Join(m.dir, "data", "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return 0
	}
	// The PID file outlives a killed postmaster: believe it only while the
	// process is PostgreSQL's, on this data directory.
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !strings.Contains(string(cmdline), filepath.Join(m.dir, "data")) {
		return 0
	}
	return pid
}

func (m *patroniMember) stopPostmaster(t *testing.T) {
	pid := m.postmasterPID()
	if pid == 0 {
		return
	}
	t.Logf("stopping PostgreSQL (pid %d) left by Patroni", pid)
	_ = syscall.Kill(pid, syscall.SIGQUIT) // immediate shutdown, children included
	deadline := time.Now().Add(10 * time.Second)
	for m.postmasterPID() != 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if m.postmasterPID() != 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// patroniStatus is what Patroni's REST API answers on GET /patroni.
type patroniStatus struct {
	State    string `json:"state"`
	Role     string `json:"role"`
	SystemID string `json:"database_system_identifier"`
	Timeline int    `json:"timeline"`
}

func (m *patroniMember) status() (patroniStatus, error) {
	var s patroniStatus
	c := http.Client{Timeout: 2 * time.Second}
	r, err := c.Get("http://" + m.restAPI + "/patroni")
	if err != nil {
		return s, err
	}
	defer r.Body.Close()
	err = json.NewDecoder(r.Body).Decode(&s)
	return s, err
}

// isPrimary: Patroni 3.0 says "master", later versions "primary".
func (s patroniStatus) isPrimary() bool {
	return (s.Role == "master" || s.Role == "primary") && s.State == "running"
}

// waitLeader polls Patroni's REST API and the store until Patroni reports
// a running primary of a cluster with a system identifier and the leader
// key names it (while it bootstraps, Patroni already reports a running
// primary, before it takes the key), and fails the test after d or when
// Patroni exits.
func (m *patroniMember) waitLeader(t *testing.T, p *proc, d time.Duration, leaderKey func() patroniKey) patroniStatus {
	t.Helper()
	deadline := time.Now().Add(d)
	var last patroniStatus
	var lastErr error
	var key patroniKey
	for {
		select {
		case <-p.done:
			t.Fatalf("patroni exited (status %d) before it led; last status %+v, %v", p.exitStatus, last, lastErr)
		default:
		}
		last, lastErr = m.status()
		if lastErr == nil && last.isPrimary() && last.SystemID != "" {
			if key = leaderKey(); key.present && key.value == m.name {
				return last
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("Patroni does not lead within %v: last status %+v, %v; leader key %+v", d, last, lastErr, key)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (m *patroniMember) key(k string) string { return "/service/" + m.scope + "/" + k }

// patroniKey is one of Patroni's keys as the test reads it.
type patroniKey struct {
	value         string
	lease, modRev int64
	present       bool
}

func runPatroni(t *testing.T, env patroniEnv, etcdAddr string) {
	m := newPatroniMember(t, env, etcdAddr)
	cli := client(t, etcdAddr)
	get := func(k string) (kv patroniKey) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := cli.Get(ctx, m.key(k))
		if err != nil {
			t.Fatalf("get %s: %v", m.key(k), err)
		}
		if len(r.Kvs) == 1 {
			kv.value, kv.lease, kv.modRev, kv.present = string(r.Kvs[0].Value), r.Kvs[0].Lease, r.Kvs[0].ModRevision, true
		}
		return kv
	}

	// Bootstrap: initdb, the initialize key, the leader race.
	leaderKey := func() patroniKey { return get("leader") }
	began := time.Now()
	p := m.start(t)
	st := m.waitLeader(t, p, 45*time.Second, leaderKey)
	t.Logf("bootstrapped and leading in %v: %+v", time.Since(began).Round(time.Millisecond), st)
	initKey := get("initialize")
	if !initKey.present || initKey.value != st.SystemID {
		t.Fatalf("initialize key %+v, want the system identifier %s", initKey, st.SystemID)
	}
	if member := get("members/" + m.name); !member.present || member.lease == 0 {
		t.Fatalf("member key %+v, want one bound to a lease", member)
	}

	// The leader key names the member and is bound to a lease of the
	// configured TTL, which Patroni keeps alive: it is there at every look
	// for well over two TTLs.
	leader := get("leader")
	if leader.value != m.name || leader.lease == 0 {
		t.Fatalf("leader key %+v, want %q bound to a lease", leader, m.name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(leader.lease))
	cancel()
	if err != nil || ttl.GrantedTTL != patroniTTL || ttl.TTL <= 0 {
		t.Fatalf("the leader key's lease: %+v, %v; want granted TTL %d, some left", ttl, err, patroniTTL)
	}
	watchFor := 5 * patroniTTL * time.Second / 2
	leases := map[int64]bool{leader.lease: true}
	for end := time.Now().Add(watchFor); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		l := get("leader")
		if !l.present || l.value != m.name {
			t.Fatalf("after %v the leader key is %+v, want %q", time.Since(began).Round(time.Millisecond), l, m.name)
		}
		leases[l.lease] = true
	}
	if st, err := m.status(); err != nil || !st.isPrimary() {
		t.Fatalf("after %v of leading Patroni reports %+v, %v", watchFor, st, err)
	}
	if len(leases) != 1 {
		t.Fatalf("the leader key was bound to %d leases in %v: Patroni's keep-alives did not keep its lease", len(leases), watchFor)
	}
	// Patroni recovers from what goes wrong (a failed keep-alive, a
	// broken watch stream) by logging an error and trying again: there
	// must be none.
	if errs := patroniErrors(p.stdout() + p.stderr()); errs != "" {
		t.Fatalf("Patroni logged errors while it led:\n%s", errs)
	}
	t.Logf("the leader key lived %v (%.1f TTLs) on one lease", watchFor, watchFor.Seconds()/patroniTTL)

	// Stopped, Patroni stops PostgreSQL and gives up its leader key.
	m.stop(t, p)
	waitFor(t, 10*time.Second, "the leader key deleted when Patroni stopped", func() bool { return !get("leader").present })

	// Started again on the same data directory, it finds its cluster:
	// no new initdb (the same system identifier, the initialize key as it
	// was), and it takes the leader key again (waitLeader).
	began = time.Now()
	p = m.start(t)
	again := m.waitLeader(t, p, 45*time.Second, leaderKey)
	t.Logf("restarted and leading in %v: %+v", time.Since(began).Round(time.Millisecond), again)
	if again.SystemID != st.SystemID {
		t.Fatalf("after the restart the system identifier is %s, was %s: Patroni bootstrapped a new cluster", again.SystemID, st.SystemID)
	}
	if now := get("initialize"); now != initKey {
		t.Fatalf("after the restart the initialize key is %+v, was %+v", now, initKey)
	}
	if strings.Contains(p.stderr(), "bootstrap a new cluster") {
		t.Fatalf("after the restart Patroni tried to bootstrap a new cluster")
	}
	m.stop(t, p)
}
