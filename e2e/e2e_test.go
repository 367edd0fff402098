// Package e2e runs the tenure binary as real processes: a server, lock
// holders that get paused with SIGSTOP, and the register they write
// through fencing tokens.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"

	// The tests run a tenure binary built from source; importing what it
	// is made of makes Go's test cache see changes to it.
	_ "github.com/tenure-io/tenure/internal/cli"
)

// binDir holds the tenure binary built by TestMain.
var binDir string

func TestMain(m *testing.M) {
	os.Exit(testutil.MainWithTenure(m, func(bin string) { binDir = filepath.Dir(bin) }))
}

// proc is a tenure process started by the test, in a process group of its
// own. Its output goes to files, so that a grandchild still holding them
// open cannot keep Wait from returning.
type proc struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	outF   string
	errF   string
	done   chan struct{}
	status int
}

// dial connects a Go client to endpoints (comma-separated); it is closed
// when the test ends.
func dial(t *testing.T, ctx context.Context, endpoints string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.Dial(ctx, endpoints, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// env is the environment every tenure process runs with.
func env(endpoint string) []string {
	return append(os.Environ(), "TENURE_ENDPOINT="+endpoint, "PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

func start(t *testing.T, name, endpoint string, args ...string) *proc {
	t.Helper()
	return startExec(t, name, endpoint, exec.Command(filepath.Join(binDir, "tenure"), args...))
}

// startExec starts cmd in a process group of its own, with tenure on its
// PATH and its output in files; it is stopped (SIGTERM, then SIGKILL) when
// the test ends.
func startExec(t *testing.T, name, endpoint string, cmd *exec.Cmd) *proc {
	t.Helper()
	dir := t.TempDir()
	p := &proc{t: t, name: name, outF: filepath.Join(dir, "stdout"), errF: filepath.Join(dir, "stderr"), done: make(chan struct{})}
	stdout, err := os.Create(p.outF)
	if err != nil {
		t.Fatal(err)
	}
	defer stdout.Close()
	stderr, err := os.Create(p.errF)
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	p.cmd = cmd
	p.cmd.Env = env(endpoint)
	p.cmd.Stdout, p.cmd.Stderr = stdout, stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		p.status = exitStatus(p.cmd.ProcessState)
		close(p.done)
	}()
	t.Cleanup(func() {
		if !p.exited() {
			// SIGTERM first: a `tenure lock` passes it on to its command's
			// process group, which SIGKILL of this group would not reach.
			p.signal(syscall.SIGTERM)
			p.signal(syscall.SIGCONT)
			select {
			case <-p.done:
			case <-time.After(3 * time.Second):
				p.signal(syscall.SIGKILL)
				<-p.done
			}
		}
		if t.Failed() {
			t.Logf("%s stdout:\n%s\n%s stderr:\n%s", p.name, p.stdout(), p.name, p.stderr())
		}
	})
	return p
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) stdout() string { b, _ := os.ReadFile(p.outF); return string(b) }
func (p *proc) stderr() string { b, _ := os.ReadFile(p.errF); return string(b) }

// signal sends sig to the process's group.
func (p *proc) signal(sig syscall.Signal) { killGroup(p.cmd.Process.Pid, sig) }

// wait waits for the process to exit and returns its status.
func (p *proc) wait(d time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.status
	case <-time.After(d):
		p.t.Fatalf("%s still running after %v\nstderr: %s", p.name, d, p.stderr())
		return -1
	}
}

func killGroup(pgid int, sig syscall.Signal) { _ = syscall.Kill(-pgid, sig) }

func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

type result struct {
	code   int
	stdout string
	stderr string
}

// tenure runs one short tenure command to completion.
func tenure(t *testing.T, endpoint string, args ...string) result {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "tenure"), args...)
	cmd.Env = env(endpoint)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("tenure %v did not finish in 20s", args)
	}
	return result{code: exitStatus(cmd.ProcessState), stdout: out.String(), stderr: errb.String()}
}

// tenureJSON runs a tenure command with -o json, checks its exit code and
// decodes its one JSON object into v.
func tenureJSON(t *testing.T, endpoint string, wantCode int, v any, args ...string) {
	t.Helper()
	r := tenure(t, endpoint, append(args, "-o", "json")...)
	if r.code != wantCode {
		t.Fatalf("tenure %v: exit %d, want %d\nstdout: %s\nstderr: %s", args, r.code, wantCode, r.stdout, r.stderr)
	}
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		t.Fatalf("tenure %v: stdout %q: %v", args, r.stdout, err)
	}
}

type putOut struct {
	Result string `json:"result"`
	Token  uint64 `json:"token"`
}

type getOut struct {
	Key   string `json:"key"`
	Value string `json:"value"`
	Token uint64 `json:"token"`
	Found bool   `json:"found"`
}

type holder struct {
	Owner   string `json:"owner"`
	Session uint64 `json:"session"`
	Token   uint64 `json:"token"`
}

type statusOut struct {
	Name    string  `json:"name"`
	Holder  *holder `json:"holder"`
	Waiters int     `json:"waiters"`
}

type historyOut struct {
	Name   string `json:"name"`
	Grants []struct {
		holder
		Ended string `json:"ended"`
	} `json:"grants"`
}

func readFile(t *testing.T, path string, d time.Duration) string {
	t.Helper()
	var b []byte
	testutil.WaitFor(t, path, d, func() bool {
		var err error
		b, err = os.ReadFile(path)
		return err == nil
	})
	return strings.TrimSpace(string(b))
}

// freeAddr picks a free loopback port below the kernel's ephemeral range
// (32768 and up on Linux, 49152 and up on macOS), and away from the range
// the fault suite picks from (20000..31999), since both may run at once:
// a port from the ephemeral range could be given to some outgoing
// connection between this check and the child process binding it.
func freeAddr(t *testing.T) string { return testutil.FreeAddr(t, 10000, 20000) }

// startServer runs `tenure serve` and waits for its ready line.
func startServer(t *testing.T, addr, dataDir string) *proc {
	t.Helper()
	p := start(t, "server", addr, "serve", "--http-listen", "127.0.0.1:0", "--listen", addr, "--data-dir", dataDir)
	want := fmt.Sprintf("tenure: serving on %s (node n1, data %s)\n", addr, dataDir)
	testutil.WaitFor(t, "the server's ready line", 30*time.Second, func() bool {
		if p.exited() {
			t.Fatalf("server exited with %d: %s", p.status, p.stderr())
		}
		return p.stdout() == want
	})
	return p
}

// liveInGroup lists the processes of group pgid that still run (zombies
// waiting for a parent to reap them do not count).
func liveInGroup(t *testing.T, pgid int) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var live []string
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) >= 3 && f[0] != "Z" && f[0] != "X" && f[2] == strconv.Itoa(pgid) {
			live = append(live, string(b[:i+1]))
		}
	}
	return live
}

// TestFencingAcrossPauseAndRestart is the readiness criterion: a paused
// holder loses its lock to a waiter, its late write is rejected as stale,
// its release cannot take the lock from the new holder, op ids make writes
// idempotent, and tokens and registers survive a crash of the server.
func TestFencingAcrossPauseAndRestart(t *testing.T) {
	testStart := time.Now()
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	addr := freeAddr(t)
	srv := startServer(t, addr, dataDir)

	// A takes the lock, writes v1 through its token, reports ready and
	// would write again three seconds later.
	aReady, aFinished := filepath.Join(dir, "a-ready"), filepath.Join(dir, "a-finished")
	scriptA := fmt.Sprintf(`tenure fence put reg v1 --token "$TENURE_FENCE_TOKEN" --op-id a1 -o json > %[1]s/a-put.json || exit 9
echo "$$ $TENURE_FENCE_TOKEN" > %[2]s.tmp && mv %[2]s.tmp %[2]s
sleep 3
tenure fence put reg v1-child-late --token "$TENURE_FENCE_TOKEN" --op-id a2
touch %[3]s`, dir, aReady, aFinished)
	a := start(t, "lock A", addr, "lock", "res", "--ttl", "2s", "--kill-grace", "1s", "--owner", "A", "--", "sh", "-c", scriptA)
	f := strings.Fields(readFile(t, aReady, 15*time.Second))
	childA, _ := strconv.Atoi(f[0])
	tA, _ := strconv.ParseUint(f[1], 10, 64)
	if childA == 0 || tA == 0 {
		t.Fatalf("A's ready file says %q", f)
	}
	t.Cleanup(func() {
		if len(liveInGroup(t, childA)) > 0 {
			killGroup(childA, syscall.SIGKILL)
		}
	})
	var put putOut
	if err := json.Unmarshal([]byte(readFile(t, filepath.Join(dir, "a-put.json"), time.Second)), &put); err != nil || put.Result != "accepted" || put.Token != tA {
		t.Fatalf("A's write: %+v %v", put, err)
	}
	var st statusOut
	tenureJSON(t, addr, 0, &st, "lock", "status", "res")
	if st.Holder == nil || st.Holder.Owner != "A" || st.Holder.Token != tA {
		t.Fatalf("status while A holds: %+v", st)
	}
	sessA := st.Holder.Session

	// B queues behind A; its command writes v2 and holds the lock until
	// the test lets it go.
	bReady, bRelease := filepath.Join(dir, "b-ready"), filepath.Join(dir, "b-release")
	scriptB := fmt.Sprintf(`tenure fence put reg v2 --token "$TENURE_FENCE_TOKEN" --op-id b1 -o json > %[1]s/b-put.json || exit 9
echo "$$ $TENURE_FENCE_TOKEN" > %[2]s.tmp && mv %[2]s.tmp %[2]s
while [ ! -f %[3]s ]; do sleep 0.05; done`, dir, bReady, bRelease)
	b := start(t, "lock B", addr, "lock", "res", "--owner", "B", "--timeout", "30s", "--", "sh", "-c", scriptB)
	testutil.WaitFor(t, "B to queue", 10*time.Second, func() bool {
		return strings.Contains(b.stderr(), "tenure: waiting for lock res (position 1)\n")
	})

	// Freeze A, command included, for longer than its TTL: wait until the
	// server has handed the lock to B.
	a.signal(syscall.SIGSTOP)
	killGroup(childA, syscall.SIGSTOP)
	frozen := time.Now()
	testutil.WaitFor(t, "the lock to pass from A to B", 15*time.Second, func() bool {
		tenureJSON(t, addr, 0, &st, "lock", "status", "res")
		return st.Holder != nil && st.Holder.Session != sessA
	})
	t.Logf("lock passed to B %v after A froze", time.Since(frozen).Round(time.Millisecond))
	if st.Holder.Owner != "B" || st.Waiters != 0 {
		t.Fatalf("status after A's expiry: %+v", st)
	}
	tB := st.Holder.Token
	if tB <= tA {
		t.Fatalf("B's token %d is not above A's %d", tB, tA)
	}
	f = strings.Fields(readFile(t, bReady, 10*time.Second))
	childB, _ := strconv.Atoi(f[0])
	if childB == 0 {
		t.Fatalf("B's ready file says %q", f)
	}
	t.Cleanup(func() {
		if len(liveInGroup(t, childB)) > 0 {
			killGroup(childB, syscall.SIGKILL)
		}
	})
	if f[1] != strconv.FormatUint(tB, 10) {
		t.Fatalf("B's command saw token %q, status says %d", f[1], tB)
	}
	if err := json.Unmarshal([]byte(readFile(t, filepath.Join(dir, "b-put.json"), time.Second)), &put); err != nil || put.Result != "accepted" || put.Token != tB {
		t.Fatalf("B's write: %+v %v", put, err)
	}
	var hist historyOut
	tenureJSON(t, addr, 0, &hist, "lock", "history", "res")
	if n := len(hist.Grants); n != 2 || hist.Grants[0].Token != tA || hist.Grants[0].Ended != "expired" || hist.Grants[1].Token != tB || hist.Grants[1].Ended != "held" {
		t.Fatalf("history %+v", hist)
	}

	// A's late write with its old token is stale.
	var late putOut
	tenureJSON(t, addr, 3, &late, "fence", "put", "reg", "v1-late", "--token", strconv.FormatUint(tA, 10), "--op-id", "a-late")
	if late.Result != "stale" || late.Token != tB {
		t.Fatalf("late write: %+v, want stale with token %d", late, tB)
	}
	var reg getOut
	tenureJSON(t, addr, 0, &reg, "fence", "get", "reg")
	if reg.Value != "v2" || reg.Token != tB || !reg.Found {
		t.Fatalf("register %+v, want v2/%d", reg, tB)
	}

	// Thaw A: it must notice the lost session, stop its command before
	// the command's second write, and leave B holding.
	a.signal(syscall.SIGCONT)
	killGroup(childA, syscall.SIGCONT)
	if code := a.wait(10 * time.Second); code == 0 {
		t.Fatalf("A exited 0 after losing its lock")
	}
	if !regexp.MustCompile(`(?m)^tenure: lost ownership of lock res \((suspect|lost)\): stopped command$`).MatchString(a.stderr()) {
		t.Fatalf("A's stderr: %q", a.stderr())
	}
	if live := liveInGroup(t, childA); len(live) > 0 {
		t.Fatalf("A's command still runs: %v", live)
	}
	if _, err := os.Stat(aFinished); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("A's command ran to its end (%v)", err)
	}
	tenureJSON(t, addr, 0, &st, "lock", "status", "res")
	if st.Holder == nil || st.Holder.Owner != "B" || st.Holder.Token != tB {
		t.Fatalf("status after A resumed: %+v", st)
	}
	tenureJSON(t, addr, 0, &reg, "fence", "get", "reg")
	if reg.Value != "v2" || reg.Token != tB {
		t.Fatalf("register after A resumed: %+v", reg)
	}

	// Replaying B's op id with another value applies nothing.
	var dup putOut
	tenureJSON(t, addr, 0, &dup, "fence", "put", "reg", "not-v2", "--token", strconv.FormatUint(tB, 10), "--op-id", "b1")
	if dup.Result != "duplicate" || dup.Token != tB {
		t.Fatalf("replay: %+v", dup)
	}
	tenureJSON(t, addr, 0, &reg, "fence", "get", "reg")
	if reg.Value != "v2" || reg.Token != tB {
		t.Fatalf("register after replay: %+v", reg)
	}

	// B finishes and releases.
	if err := os.WriteFile(bRelease, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := b.wait(10 * time.Second); code != 0 {
		t.Fatalf("B exited %d", code)
	}

	// Crash the server and restart it on the same data.
	srv.signal(syscall.SIGKILL)
	srv.wait(10 * time.Second)
	srv = startServer(t, addr, dataDir)
	tenureJSON(t, addr, 0, &reg, "fence", "get", "reg")
	if reg.Value != "v2" || reg.Token != tB || !reg.Found {
		t.Fatalf("register after restart: %+v, want v2/%d", reg, tB)
	}
	r := tenure(t, addr, "lock", "res", "--owner", "C", "--", "sh", "-c", `echo "$TENURE_FENCE_TOKEN"`)
	if r.code != 0 {
		t.Fatalf("lock after restart: exit %d: %s", r.code, r.stderr)
	}
	tC, err := strconv.ParseUint(strings.TrimSpace(r.stdout), 10, 64)
	if err != nil || tC <= tB {
		t.Fatalf("token after restart %q (%v), want above %d", r.stdout, err, tB)
	}
	tenureJSON(t, addr, 0, &hist, "lock", "history", "res")
	last := hist.Grants[len(hist.Grants)-1]
	if last.Owner != "C" || last.Token != tC || last.Ended != "released" {
		t.Fatalf("history after restart: %+v", hist)
	}

	// A clean stop exits 0.
	srv.signal(syscall.SIGTERM)
	if code := srv.wait(15 * time.Second); code != 0 {
		t.Fatalf("server exited %d on SIGTERM", code)
	}
	t.Logf("A stderr: %q", a.stderr())
	t.Logf("whole scenario took %v", time.Since(testStart).Round(time.Millisecond))
}

// TestSignals: SIGINT to a waiting `tenure lock` withdraws its wait, and
// SIGTERM to a holding one reaches its command, whose status it returns.
func TestSignals(t *testing.T) {
	dir := t.TempDir()
	addr := freeAddr(t)
	startServer(t, addr, filepath.Join(dir, "data"))

	ready := filepath.Join(dir, "ready")
	script := fmt.Sprintf(`trap 'echo got-term; exit 42' TERM; touch %s; while :; do sleep 0.05; done`, ready)
	holder := start(t, "holder", addr, "lock", "sig", "--", "sh", "-c", script)
	readFile(t, ready, 15*time.Second)

	waiter := start(t, "waiter", addr, "lock", "sig", "--timeout", "0", "--", "sh", "-c", "echo ran")
	testutil.WaitFor(t, "the waiter to queue", 10*time.Second, func() bool {
		return strings.Contains(waiter.stderr(), "tenure: waiting for lock sig (position 1)\n")
	})
	if err := syscall.Kill(waiter.cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := waiter.wait(10 * time.Second); code != 128+int(syscall.SIGINT) {
		t.Fatalf("interrupted waiter exited %d, want 130", code)
	}
	if !strings.Contains(waiter.stderr(), "tenure: interrupted by SIGINT while waiting for lock sig\n") || waiter.stdout() != "" {
		t.Fatalf("waiter stdout %q stderr %q", waiter.stdout(), waiter.stderr())
	}
	var st statusOut
	testutil.WaitFor(t, "the wait to be withdrawn", 5*time.Second, func() bool {
		tenureJSON(t, addr, 0, &st, "lock", "status", "sig")
		return st.Waiters == 0
	})

	if err := syscall.Kill(holder.cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := holder.wait(10 * time.Second); code != 42 {
		t.Fatalf("holder exited %d, want the command's 42", code)
	}
	if holder.stdout() != "got-term\n" {
		t.Fatalf("holder stdout %q", holder.stdout())
	}
	tenureJSON(t, addr, 0, &st, "lock", "status", "sig")
	if st.Holder != nil {
		t.Fatalf("lock still held: %+v", st)
	}
}

// TestSecondServerOnDataDirRefused: a second `tenure serve` on a data
// directory in use exits 1 at once with one line saying so (whatever its
// other flags), and the first goes on serving.
func TestSecondServerOnDataDirRefused(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "data")
	addr := freeAddr(t)
	startServer(t, addr, dataDir)
	second := freeAddr(t)
	r := tenure(t, second, "serve", "--http-listen", "127.0.0.1:0", "--listen", second, "--data-dir", dataDir)
	if r.code != 1 {
		t.Fatalf("second server on the same data dir exited %d, want 1; stderr %q", r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "is locked by another process") {
		t.Fatalf("second server's stderr %q, want one line saying the data dir is locked", r.stderr)
	}
	var st struct {
		Node   string `json:"node"`
		Leader string `json:"leader"`
	}
	tenureJSON(t, addr, 0, &st, "status")
	if st.Node != "n1" || st.Leader != "n1" {
		t.Fatalf("the first server, after the second was refused: status %+v, want node and leader n1", st)
	}
}
