package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestInspectHolders: lock status lists every holder with its mode (both
// readers of a read-write lock, every permit of a semaphore) and keeps
// "holder" as the first; lock list names each lock's kind, holders and
// waiters.
func TestInspectHolders(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	addr := srv.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testutil.Dial(t, addr)
	r1 := testutil.Session(t, ctx, c, client.WithOwner("reader-1"))
	r2 := testutil.Session(t, ctx, c, client.WithOwner("reader-2"))
	w := testutil.Session(t, ctx, c, client.WithOwner("writer"))
	for _, s := range []*client.Session{r1, r2} {
		m, _ := s.Mutex("rw")
		if _, err := m.RLock(ctx); err != nil {
			t.Fatal(err)
		}
		sem, _ := s.Semaphore("sem", 3)
		if _, err := sem.Lock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	mw, _ := w.Mutex("rw")
	queued := make(chan struct{})
	go func() { _, _ = mw.Lock(ctx, client.OnQueued(func(int) { close(queued) })) }()
	<-queued

	st := runJSON(t, addr, 0, "lock", "status", "rw")
	hasKeys(t, st, map[string]string{"holder": "object", "holders": "array"})
	hs := st["holders"].([]any)
	if len(hs) != 2 {
		t.Fatalf("holders %v, want both readers", hs)
	}
	for i, owner := range []string{"reader-1", "reader-2"} {
		h := hs[i].(map[string]any)
		hasKeys(t, h, map[string]string{"owner": "string", "session": "number", "token": "number", "mode": "string"})
		if h["owner"] != owner || h["mode"] != "shared" {
			t.Fatalf("holder %d: %v", i, h)
		}
	}
	if st["holder"].(map[string]any)["owner"] != "reader-1" {
		t.Fatalf("holder %v, want the first reader", st["holder"])
	}
	if txt := run(t, addr, "lock", "status", "rw").stdout; strings.Count(txt, ", shared)") != 2 {
		t.Fatalf("text status %q", txt)
	}
	sem := runJSON(t, addr, 0, "lock", "status", "sem")
	if hs := sem["holders"].([]any); len(hs) != 2 || hs[1].(map[string]any)["mode"] != "permit" {
		t.Fatalf("semaphore holders %v", sem["holders"])
	}

	ll := runJSON(t, addr, 0, "lock", "list")
	byName := map[string]map[string]any{}
	for _, l := range ll["locks"].([]any) {
		byName[l.(map[string]any)["name"].(string)] = l.(map[string]any)
	}
	if l := byName["rw"]; l["kind"] != "rwlock" || num(t, l, "waiters") != 1 || len(l["holders"].([]any)) != 2 || num(t, l, "delay_ms") != 0 {
		t.Fatalf("rw listed as %v", l)
	}
	if l := byName["sem"]; l["kind"] != "semaphore" || len(l["holders"].([]any)) != 2 {
		t.Fatalf("sem listed as %v", l)
	}
}

// TestSessionListTimeLeft: the leader tells each session's time left,
// within its TTL.
func TestSessionListTimeLeft(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	s := testutil.Session(t, ctx, c, client.WithOwner("o"), client.WithTTL(20*time.Second))
	m := runJSON(t, srv.Addr(), 0, "session", "list")
	got := m["sessions"].([]any)[0].(map[string]any)
	hasKeys(t, got, map[string]string{"time_left_ms": "number"})
	if left := num(t, got, "time_left_ms"); num(t, got, "id") != s.ID() || left == 0 || left > 20_000 {
		t.Fatalf("session %v", got)
	}
	if txt := run(t, srv.Addr(), "session", "list").stdout; !strings.Contains(txt, " left ") {
		t.Fatalf("text list %q", txt)
	}
}

// TestVersionAndStatusWait: version prints this build's version, status
// the server's, and status --wait returns once the node is ready, or
// exits 5 after the wait when nothing answers.
func TestVersionAndStatusWait(t *testing.T) {
	v := runJSON(t, "127.0.0.1:1", 0, "version")
	hasKeys(t, v, map[string]string{"version": "string", "go": "string", "protocol": "number", "min_protocol": "number"})
	if txt := run(t, "127.0.0.1:1", "version"); txt.code != 0 || !strings.HasPrefix(txt.stdout, "tenure ") {
		t.Fatalf("version %+v", txt)
	}
	srv := testutil.Start(t, "", nil)
	st := runJSON(t, srv.Addr(), 0, "status", "--wait", "10s")
	hasKeys(t, st, map[string]string{"version": "string", "ready": "bool", "commit_index": "number", "applied_index": "number", "protocol": "number", "cluster_version": "number"})
	if st["ready"] != true || st["version"] != v["version"] || num(t, st, "applied_index") < num(t, st, "commit_index") {
		t.Fatalf("status %v", st)
	}
	start := time.Now()
	r := run(t, "127.0.0.1:1", "status", "--wait", "300ms")
	if r.code != ExitTimeout || !strings.HasPrefix(r.stderr, "tenure: ") || time.Since(start) > 10*time.Second {
		t.Fatalf("status --wait with no server: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestServeRefusesBadLogFlags: an unknown log format or level is one
// line, before anything is opened.
func TestServeRefusesBadLogFlags(t *testing.T) {
	for _, tc := range []struct{ flag, value, want string }{
		{"--log-format", "xml", `unknown log format "xml"`},
		{"--log-level", "loud", `unknown log level "loud"`},
		{"--metrics-queues", "-1", "--metrics-queues must not be negative"},
	} {
		dir := t.TempDir()
		r := run(t, "127.0.0.1:1", "serve", "--data-dir", dir, "--listen", "127.0.0.1:0", "--http-listen", "", tc.flag, tc.value)
		if r.code != 1 || strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, tc.want) {
			t.Fatalf("%s %s: exit %d, stderr %q", tc.flag, tc.value, r.code, r.stderr)
		}
	}
}
