package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
	"github.com/tenure-io/tenure/internal/version"
)

// syncBuffer is a bytes.Buffer safe for a command and a child process
// writing while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type result struct {
	code   int
	stdout string
	stderr string
}

// run runs the command line in-process against addr.
func run(t *testing.T, addr string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb syncBuffer
	code := Run(ctx, append([]string{"--endpoint", addr}, args...), Streams{Out: &out, Err: &errb})
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// runJSON runs a command with -o json, checks the exit code and decodes the
// single JSON object it printed.
func runJSON(t *testing.T, addr string, wantCode int, args ...string) map[string]any {
	t.Helper()
	r := run(t, addr, append(args, "-o", "json")...)
	if r.code != wantCode {
		t.Fatalf("%v: exit %d, want %d (stderr %q)", args, r.code, wantCode, r.stderr)
	}
	return decodeOne(t, r.stdout)
}

func decodeOne(t *testing.T, s string) map[string]any {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(s))
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("stdout %q is not a JSON object: %v", s, err)
	}
	if dec.More() {
		t.Fatalf("stdout %q holds more than one JSON value", s)
	}
	return m
}

// hasKeys checks that m has each key with a value of the given kind:
// "string", "number", "bool", "array", "object", "null" or "object|null".
func hasKeys(t *testing.T, m map[string]any, want map[string]string) {
	t.Helper()
	for k, kind := range want {
		v, ok := m[k]
		if !ok {
			t.Errorf("missing key %q in %v", k, m)
			continue
		}
		var got string
		switch v.(type) {
		case string:
			got = "string"
		case float64:
			got = "number"
		case bool:
			got = "bool"
		case []any:
			got = "array"
		case map[string]any:
			got = "object"
		case nil:
			got = "null"
		}
		if !strings.Contains("|"+kind+"|", "|"+got+"|") {
			t.Errorf("key %q is %s (%v), want %s", k, got, v, kind)
		}
	}
}

func num(t *testing.T, m map[string]any, k string) uint64 {
	t.Helper()
	f, ok := m[k].(float64)
	if !ok {
		t.Fatalf("key %q = %v is not a number", k, m[k])
	}
	return uint64(f)
}

func TestExitCode(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want int
	}{
		{"nil", nil, ExitOK},
		{"plain", errors.New("boom"), ExitError},
		{"stale", fmt.Errorf("put: %w", client.ErrStale), ExitStale},
		{"not held", fmt.Errorf("unlock: %w", client.ErrNotHeld), ExitNotHeld},
		{"deadline", context.DeadlineExceeded, ExitTimeout},
		{"wrapped deadline", fmt.Errorf("waiting: %w", context.DeadlineExceeded), ExitTimeout},
		{"session expired", client.ErrSessionExpired, ExitError},
		{"unavailable", client.ErrUnavailable, ExitError},
		{"no leader", fmt.Errorf("session: %w", client.ErrNoLeader), ExitNoLeader},
		{"no leader after a deadline", fmt.Errorf("%w (%v)", client.ErrNoLeader, context.DeadlineExceeded), ExitNoLeader},
		{"lost", fmt.Errorf("%w of lock x", errLost), ExitLost},
		{"unknown command", fmt.Errorf("x: %w", errUnknownCommand), ExitUsage},
		{"child status", &exitError{code: 42}, 42},
		{"child signal", &exitError{code: 130, err: errors.New("interrupted")}, 130},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := ExitCode(tc.err); got != tc.want {
				t.Fatalf("ExitCode(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
}

func TestErrorLine(t *testing.T) {
	cases := map[string]string{
		"boom":                            "tenure: boom",
		"tenure: stale fence token: x":    "tenure: stale fence token: x",
		"tenure: tenure: twice":           "tenure: twice",
		"two\nlines  and\ttabs":           "tenure: two lines and tabs",
		"cannot reach x: tenure: timeout": "tenure: cannot reach x: tenure: timeout",
	}
	for in, want := range cases {
		if got := errorLine(errors.New(in)); got != want {
			t.Errorf("errorLine(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no command", []string{"lock", "res"}, "missing '-- COMMAND'"},
		{"empty command", []string{"lock", "res", "--"}, "missing COMMAND"},
		{"two names", []string{"lock", "a", "b", "--", "true"}, "exactly one lock name"},
		{"no name", []string{"lock"}, "usage: tenure lock NAME"},
		{"unknown flag", []string{"lock", "res", "--bogus", "--", "true"}, "unknown flag: --bogus"},
		{"bad output", []string{"status", "-o", "yaml"}, `unknown output format "yaml"`},
		{"put without token", []string{"fence", "put", "k", "v"}, "--token is required"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, "127.0.0.1:1", tc.args...)
			if r.code != ExitError {
				t.Fatalf("exit %d, want 1", r.code)
			}
			if r.stdout != "" {
				t.Errorf("stdout %q, want nothing", r.stdout)
			}
			if strings.Count(r.stderr, "\n") != 1 || !strings.HasPrefix(r.stderr, "tenure: ") || !strings.Contains(r.stderr, tc.want) {
				t.Fatalf("stderr %q, want one line 'tenure: ...%s...'", r.stderr, tc.want)
			}
		})
	}
}

func TestUnreachableServer(t *testing.T) {
	r := run(t, "127.0.0.1:1", "status", "-o", "json")
	if r.code != ExitError || !strings.Contains(r.stderr, "cannot reach 127.0.0.1:1") {
		t.Fatalf("got %+v", r)
	}
	if e, _ := decodeOne(t, r.stdout)["error"].(map[string]any); e["code"] != "unavailable" {
		t.Fatalf("stdout %q, want an unavailable error", r.stdout)
	}
}

func TestJSONOutput(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	addr := srv.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	t.Run("status", func(t *testing.T) {
		m := runJSON(t, addr, 0, "status")
		hasKeys(t, m, map[string]string{"node": "string", "leader": "string", "term": "number", "revision": "number", "voters": "array", "storage_error": "string", "degraded": "string"})
		if m["node"] != "n1" || m["leader"] != "n1" || m["storage_error"] != "" || m["degraded"] != "" {
			t.Fatalf("status %v", m)
		}
		if r := run(t, addr, "status"); !strings.Contains(r.stdout, "storage:  ok\n") {
			t.Fatalf("status text without the storage line:\n%s", r.stdout)
		}
	})

	t.Run("lock status free", func(t *testing.T) {
		m := runJSON(t, addr, 0, "lock", "status", "free-lock")
		hasKeys(t, m, map[string]string{"name": "string", "holder": "null", "waiters": "number", "waiter_order": "array"})
		if m["name"] != "free-lock" || num(t, m, "waiters") != 0 {
			t.Fatalf("lock status %v", m)
		}
	})

	// A holds "res"; B waits for it.
	sa, err := c.NewSession(ctx, client.WithOwner("owner-a"))
	if err != nil {
		t.Fatal(err)
	}
	defer sa.Close(context.Background())
	sb, err := c.NewSession(ctx, client.WithOwner("owner-b"))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(context.Background())
	ma, _ := sa.Mutex("res")
	ha, err := ma.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := sb.Mutex("res")
	queued := make(chan struct{})
	go func() {
		_, _ = mb.Lock(ctx, client.OnQueued(func(int) { close(queued) }))
	}()
	<-queued

	t.Run("lock status held", func(t *testing.T) {
		m := runJSON(t, addr, 0, "lock", "status", "res")
		hasKeys(t, m, map[string]string{"name": "string", "holder": "object", "waiters": "number", "waiter_order": "array"})
		h := m["holder"].(map[string]any)
		hasKeys(t, h, map[string]string{"owner": "string", "session": "number", "token": "number"})
		if h["owner"] != "owner-a" || num(t, h, "session") != sa.ID() || num(t, h, "token") != ha.Token() {
			t.Fatalf("holder %v, want owner-a session %d token %d", h, sa.ID(), ha.Token())
		}
		if num(t, m, "waiters") != 1 {
			t.Fatalf("waiters %v", m["waiters"])
		}
		w := m["waiter_order"].([]any)[0].(map[string]any)
		if w["owner"] != "owner-b" || num(t, w, "session") != sb.ID() {
			t.Fatalf("waiter %v", w)
		}
		txt := run(t, addr, "lock", "status", "res")
		if txt.code != 0 || !strings.Contains(txt.stdout, "holder:  owner-a") {
			t.Fatalf("text status %+v", txt)
		}
	})

	t.Run("session list", func(t *testing.T) {
		m := runJSON(t, addr, 0, "session", "list")
		hasKeys(t, m, map[string]string{"sessions": "array"})
		byID := map[uint64]map[string]any{}
		for _, v := range m["sessions"].([]any) {
			s := v.(map[string]any)
			hasKeys(t, s, map[string]string{"id": "number", "owner": "string", "ttl_ms": "number", "held": "array", "waiting": "array"})
			byID[num(t, s, "id")] = s
		}
		a, b := byID[sa.ID()], byID[sb.ID()]
		if a == nil || b == nil {
			t.Fatalf("sessions %v lack %d or %d", m, sa.ID(), sb.ID())
		}
		if fmt.Sprint(a["held"]) != "[res]" || fmt.Sprint(b["waiting"]) != "[res]" || num(t, a, "ttl_ms") != 10000 {
			t.Fatalf("session a %v, b %v", a, b)
		}
	})

	t.Run("fence", func(t *testing.T) {
		tok := fmt.Sprint(ha.Token())
		m := runJSON(t, addr, 0, "fence", "put", "reg", "v1", "--token", tok, "--op-id", "op-1")
		hasKeys(t, m, map[string]string{"result": "string", "token": "number"})
		if m["result"] != "accepted" || num(t, m, "token") != ha.Token() {
			t.Fatalf("put %v", m)
		}
		// A lower token is stale: exit 3, the JSON still reports it.
		r := run(t, addr, "fence", "put", "reg", "old", "--token", "1", "-o", "json")
		if r.code != ExitStale {
			t.Fatalf("stale put: exit %d, want 3 (%q)", r.code, r.stderr)
		}
		m = decodeOne(t, r.stdout)
		if m["result"] != "stale" || num(t, m, "token") != ha.Token() {
			t.Fatalf("stale put %v", m)
		}
		if !strings.HasPrefix(r.stderr, "tenure: stale fence token") {
			t.Fatalf("stale stderr %q", r.stderr)
		}
		// Replaying the op id applies nothing.
		m = runJSON(t, addr, 0, "fence", "put", "reg", "other", "--token", tok, "--op-id", "op-1")
		if m["result"] != "duplicate" || num(t, m, "token") != ha.Token() {
			t.Fatalf("duplicate put %v", m)
		}
		m = runJSON(t, addr, 0, "fence", "get", "reg")
		hasKeys(t, m, map[string]string{"key": "string", "value": "string", "token": "number", "found": "bool"})
		if m["key"] != "reg" || m["value"] != "v1" || num(t, m, "token") != ha.Token() || m["found"] != true {
			t.Fatalf("get %v", m)
		}
		m = runJSON(t, addr, 0, "fence", "get", "never-written")
		if m["found"] != false || m["value"] != "" || num(t, m, "token") != 0 {
			t.Fatalf("get missing %v", m)
		}
	})

	if err := ha.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	t.Run("lock history", func(t *testing.T) {
		var m map[string]any
		testutil.WaitFor(t, "B's grant in history", 5*time.Second, func() bool {
			m = runJSON(t, addr, 0, "lock", "history", "res")
			return len(m["grants"].([]any)) == 2
		})
		hasKeys(t, m, map[string]string{"name": "string", "grants": "array"})
		g := m["grants"].([]any)
		first, second := g[0].(map[string]any), g[1].(map[string]any)
		for _, x := range []map[string]any{first, second} {
			hasKeys(t, x, map[string]string{"owner": "string", "session": "number", "token": "number", "ended": "string"})
		}
		if first["owner"] != "owner-a" || first["ended"] != "released" || num(t, first, "token") != ha.Token() {
			t.Fatalf("first grant %v", first)
		}
		if second["owner"] != "owner-b" || second["ended"] != "held" || num(t, second, "token") <= ha.Token() {
			t.Fatalf("second grant %v", second)
		}
	})
}

func TestLockRunsCommand(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	addr := srv.Addr()

	r := run(t, addr, "lock", "job", "--owner", "tester", "--", "sh", "-c", `echo "$TENURE_LOCK $TENURE_FENCE_TOKEN $TENURE_SESSION $TENURE_ENDPOINT"`)
	if r.code != 0 {
		t.Fatalf("exit %d: %q", r.code, r.stderr)
	}
	f := strings.Fields(r.stdout)
	if len(f) != 4 || f[0] != "job" || f[1] == "" || f[2] == "" || f[3] != addr {
		t.Fatalf("command saw %q", r.stdout)
	}
	// The grant was released when the command exited.
	m := runJSON(t, addr, 0, "lock", "history", "job")
	g := m["grants"].([]any)[0].(map[string]any)
	if g["ended"] != "released" || g["owner"] != "tester" || fmt.Sprint(num(t, g, "token")) != f[1] || fmt.Sprint(num(t, g, "session")) != f[2] {
		t.Fatalf("grant %v, command saw %q", g, r.stdout)
	}

	cases := []struct {
		name   string
		script string
		want   int
	}{
		{"exit status", "exit 7", 7},
		{"killed by signal", "kill -KILL $$", 128 + 9},
		{"terminated", "kill -TERM $$", 128 + 15},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, addr, "lock", "job", "--", "sh", "-c", tc.script)
			if r.code != tc.want || r.stderr != "" {
				t.Fatalf("exit %d stderr %q, want exit %d and no message", r.code, r.stderr, tc.want)
			}
		})
	}

	t.Run("command not found", func(t *testing.T) {
		r := run(t, addr, "lock", "job", "--", "/nonexistent/cmd")
		if r.code != ExitError || !strings.Contains(r.stderr, "/nonexistent/cmd") {
			t.Fatalf("got %+v", r)
		}
		m := runJSON(t, addr, 0, "lock", "status", "job")
		if m["holder"] != nil {
			t.Fatalf("lock left held: %v", m)
		}
	})
}

func TestLockTimeout(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	m, _ := s.Mutex("busy")
	if _, err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r := run(t, srv.Addr(), "lock", "busy", "--timeout", "300ms", "--", "sh", "-c", "echo ran")
	if r.code != ExitTimeout {
		t.Fatalf("exit %d, want 5 (%q)", r.code, r.stderr)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("took %v", took)
	}
	if r.stdout != "" {
		t.Fatalf("command ran: %q", r.stdout)
	}
	if !strings.Contains(r.stderr, "tenure: waiting for lock busy (position 1)\n") || !strings.Contains(r.stderr, "tenure: timed out after 300ms waiting for lock busy") {
		t.Fatalf("stderr %q", r.stderr)
	}
	// The abandoned wait is withdrawn.
	testutil.WaitFor(t, "the wait to be withdrawn", 5*time.Second, func() bool {
		return num(t, runJSON(t, srv.Addr(), 0, "lock", "status", "busy"), "waiters") == 0
	})
}

// TestLockStopsCommandOnSuspect cuts the CLI off from the server while its
// command runs, with --on-suspect stop: the command must be stopped, and
// tenure must say why.
func TestLockStopsCommandOnSuspect(t *testing.T) {
	testutil.Slow(t)
	srv := testutil.Start(t, "", nil)
	px := testutil.StartProxy(t, srv.Addr())
	dir := t.TempDir()
	started, finished := filepath.Join(dir, "started"), filepath.Join(dir, "finished")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		// The child ignores SIGTERM, so only the SIGKILL after the grace
		// stops it.
		script := fmt.Sprintf(`trap "" TERM; touch %s; sleep 20; touch %s`, started, finished)
		done <- Run(ctx, []string{"--endpoint", px.Addr(), "lock", "res", "--ttl", "1s", "--kill-grace", "300ms", "--on-suspect", "stop", "--", "sh", "-c", script}, Streams{Out: &out, Err: &errb})
	}()
	testutil.WaitFor(t, "the command to start", 10*time.Second, func() bool {
		_, err := os.Stat(started)
		return err == nil
	})
	px.Pause(true, true) // renewals go unanswered
	stopped := time.Now()
	var code int
	select {
	case code = <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("tenure lock still running 10s after losing contact (stderr %q)", errb.String())
	}
	px.Resume()
	if took := time.Since(stopped); took > 5*time.Second {
		t.Fatalf("stopping took %v", took)
	}
	if code != ExitLost {
		t.Fatalf("exit %d, want %d (stderr %q)", code, ExitLost, errb.String())
	}
	if !regexp.MustCompile(`^tenure: lost ownership of lock res \((suspect|lost)\): stopped command\n$`).MatchString(errb.String()) {
		t.Fatalf("stderr %q", errb.String())
	}
	if _, err := os.Stat(finished); err == nil {
		t.Fatal("the command ran to its end")
	}
}

func TestServe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb syncBuffer
	dataDir := filepath.Join(t.TempDir(), "data")
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, []string{"serve", "--http-listen", "127.0.0.1:0", "--listen", "127.0.0.1:0", "--data-dir", dataDir, "--node-id", "n7"}, Streams{Out: &out, Err: &errb})
	}()
	line := regexp.MustCompile(`^tenure: serving on (127\.0\.0\.1:\d+) \(node n7, data (.*)\)\n$`)
	httpAddr := regexp.MustCompile(`level=INFO msg=serving listen=127\.0\.0\.1:\d+ http=(127\.0\.0\.1:\d+)`)
	testutil.WaitFor(t, "the ready line", 20*time.Second, func() bool {
		select {
		case code := <-done:
			t.Fatalf("serve exited %d: %s", code, errb.String())
		default:
		}
		return line.MatchString(out.String())
	})
	mm := line.FindStringSubmatch(out.String())
	if mm[2] != dataDir {
		t.Fatalf("ready line %q", out.String())
	}
	m := runJSON(t, mm[1], 0, "status")
	if m["node"] != "n7" {
		t.Fatalf("status %v", m)
	}
	// A node that is its only voter runs at its own protocol at once.
	if p := float64(version.Protocol); m["protocol"] != p || m["cluster_version"] != p || m["min_protocol"] != float64(version.MinProtocol) {
		t.Fatalf("status %v: want protocol and cluster_version %d", m, version.Protocol)
	}
	// The HTTP listener (named in the log): health, readiness and the metrics.
	hm := httpAddr.FindStringSubmatch(errb.String())
	if hm == nil {
		t.Fatalf("no serving record in the log %q", errb.String())
	}
	mm = append(mm, hm[1])
	for path, want := range map[string]string{"/healthz": "ok\n", "/readyz": "ready\n", "/metrics": "tenure_raft_is_leader 1\n"} {
		resp, err := http.Get("http://" + mm[3] + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Fatalf("GET %s: %s %q, want 200 with %q", path, resp.Status, body, want)
		}
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("serve exited %d: %s", code, errb.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop")
	}
	if strings.Count(out.String(), "\n") != 1 {
		t.Fatalf("stdout %q, want one line", out.String())
	}
}

// TestProductHasNoBenchCommand: benchmarks are not part of the product
// binary (they are bench/cmd/tenure-bench): neither the root's nor kv's
// help lists one, and `tenure bench` and `tenure kv bench` are unknown
// commands.
func TestProductHasNoBenchCommand(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"kv", "--help"}, {"queue", "--help"}} {
		r := run(t, "127.0.0.1:1", args...)
		if r.code != ExitOK || !strings.Contains(r.stdout, "Available Commands:") {
			t.Fatalf("%v: exit %d, stdout %q", args, r.code, r.stdout)
		}
		cmds := r.stdout[strings.Index(r.stdout, "Available Commands:"):]
		cmds = cmds[:strings.Index(cmds, "\n\n")]
		for _, line := range strings.Split(cmds, "\n")[1:] {
			if name := strings.Fields(line)[0]; strings.Contains(name, "bench") {
				t.Errorf("%v lists the command %q", args, name)
			}
		}
	}
	for _, args := range [][]string{{"bench", "--mode", "contended"}, {"bench", "queue"}, {"kv", "bench", "--op", "put"}} {
		r := run(t, "127.0.0.1:1", args...)
		if r.code != ExitUsage || r.stdout != "" || !strings.Contains(r.stderr, "unknown command") {
			t.Fatalf("%v: exit %d, stdout %q, stderr %q, want an unknown command", args, r.code, r.stdout, r.stderr)
		}
	}
}

// TestServeRefusesAnOutOfRangeGroupCommitWait: the flag is checked before
// anything is opened, with one line naming the range.
func TestServeRefusesAnOutOfRangeGroupCommitWait(t *testing.T) {
	for _, v := range []string{"-1ms", "11ms"} {
		r := run(t, "127.0.0.1:1", "serve", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--http-listen", "", "--group-commit-wait", v)
		if r.code != 1 || !strings.Contains(r.stderr, "--group-commit-wait must be 0..10ms") {
			t.Fatalf("--group-commit-wait %s: exit %d, stderr %q", v, r.code, r.stderr)
		}
	}
}

// TestServeRefusesANonPositiveZkContainerCheckInterval: the flag is
// checked before anything is opened, with one line.
func TestServeRefusesANonPositiveZkContainerCheckInterval(t *testing.T) {
	for _, v := range []string{"0s", "-1s"} {
		r := run(t, "127.0.0.1:1", "serve", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--http-listen", "",
			"--zk-listen", "127.0.0.1:0", "--zk-container-check-interval", v)
		if r.code != 1 || !strings.Contains(r.stderr, "--zk-container-check-interval must be positive") {
			t.Fatalf("--zk-container-check-interval %s: exit %d, stderr %q", v, r.code, r.stderr)
		}
	}
}

// TestJSONErrors: with -o json every failure prints one JSON object on
// stdout, {"error":{"code","message"}}, with the documented exit code; a
// command that printed its own answer (a stale write) prints only that.
func TestJSONErrors(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	for _, tc := range []struct {
		args []string
		code int
		kind string
	}{
		{[]string{"fence", "put", "k", "v", "--token", "999999999"}, ExitError, ""}, // its own answer: result invalid
		{[]string{"kv", "put", "k", "v", "--session", "7"}, ExitError, "error"},
		{[]string{"lock", "status", ""}, ExitError, "invalid_argument"},
		{[]string{"limits", "set", "--max-keys", "x"}, ExitError, "invalid_argument"},
		{[]string{"queue", "pop", "empty", "--timeout", "50ms"}, ExitTimeout, "timeout"},
	} {
		r := run(t, srv.Addr(), append(tc.args, "-o", "json")...)
		if r.code != tc.code {
			t.Errorf("%v: exit %d, want %d (stderr %q)", tc.args, r.code, tc.code, r.stderr)
			continue
		}
		m := decodeOne(t, r.stdout)
		if tc.kind == "" {
			if _, isErr := m["error"]; isErr {
				t.Errorf("%v: printed an error object besides its own answer: %v", tc.args, m)
			}
			continue
		}
		e, ok := m["error"].(map[string]any)
		if !ok || e["code"] != tc.kind || e["message"] == "" {
			t.Errorf("%v: stdout %v, want an error of code %q with a message", tc.args, m, tc.kind)
		}
	}
}

// procState is the state letter of process pid ('T' when stopped).
func procState(pid string) byte {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

// TestLockPausesCommandWhileSuspect: with the default --on-suspect pause,
// a command whose ownership becomes unproven (renewals go unanswered) is
// SIGSTOPped at once, and SIGCONTed when the hold is confirmed again with
// the same token; it then runs to its end and tenure exits with its
// status.
func TestLockPausesCommandWhileSuspect(t *testing.T) {
	testutil.Slow(t)
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc to see the command's state: " + err.Error())
	}
	srv := testutil.Start(t, "", nil)
	px := testutil.StartProxy(t, srv.Addr())
	dir := t.TempDir()
	pidFile, finished := filepath.Join(dir, "pid"), filepath.Join(dir, "finished")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		script := fmt.Sprintf(`echo $$ > %s.tmp && mv %s.tmp %s; for i in $(seq 16); do sleep 0.5; done; touch %s`, pidFile, pidFile, pidFile, finished)
		done <- Run(ctx, []string{"--endpoint", px.Addr(), "lock", "res", "--ttl", "6s", "--", "sh", "-c", script}, Streams{Out: &out, Err: &errb})
	}()
	var pid string
	testutil.WaitFor(t, "the command to start", 10*time.Second, func() bool {
		b, err := os.ReadFile(pidFile)
		pid = strings.TrimSpace(string(b))
		return err == nil && pid != ""
	})
	px.Pause(true, true) // renewals go unanswered: suspect after a third of the TTL
	testutil.WaitFor(t, "the command to be paused", 10*time.Second, func() bool { return procState(pid) == 'T' || len(done) > 0 })
	if len(done) > 0 {
		t.Fatalf("tenure lock ended: %d %q", <-done, errb.String())
	}
	px.Resume()
	testutil.WaitFor(t, "the command to be resumed", 10*time.Second, func() bool { return procState(pid) != 'T' })
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d, want 0 (stderr %q)", code, errb.String())
		}
	case <-ctx.Done():
		t.Fatalf("tenure lock did not finish (stderr %q)", errb.String())
	}
	if _, err := os.Stat(finished); err != nil {
		t.Fatal("the command did not run to its end")
	}
	if !strings.Contains(errb.String(), "command paused") || !strings.Contains(errb.String(), "command resumed") {
		t.Fatalf("stderr %q, want the pause and the resume said", errb.String())
	}
}
