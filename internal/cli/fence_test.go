package cli

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

// fenceSetup starts a server and gives a hold on lock "job".
func fenceSetup(t *testing.T) (addr string, c *client.Client, s *client.Session, h *client.Hold) {
	t.Helper()
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	c = testutil.Dial(t, srv.Addr())
	s = testutil.Session(t, ctx, c)
	m, err := s.Mutex("job")
	if err != nil {
		t.Fatal(err)
	}
	if h, err = m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	return srv.Addr(), c, s, h
}

// wantFenceJSON checks a fenced write's JSON answer.
func wantFenceJSON(t *testing.T, m map[string]any, result string, token uint64) {
	t.Helper()
	hasKeys(t, m, map[string]string{"result": "string", "token": "number", "revision": "number"})
	if m["result"] != result || num(t, m, "token") != token {
		t.Fatalf("answer %v, want result %q token %d", m, result, token)
	}
}

// TestFencePutUnissuedToken: `fence put --token 999999999`, a token nobody
// was granted, used to be accepted and made every honest holder stale on
// the key. It is refused: exit 1, result "invalid", nothing stored.
func TestFencePutUnissuedToken(t *testing.T) {
	addr, c, _, h := fenceSetup(t)
	st, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"fence", "put", "K", "evil", "--token", "999999999"},
		{"fence", "put", "K", "evil", "--token", "999999999", "--lock", "job", "--op-id", "op"},
		{"fence", "delete", "K", "--token", "999999999"},
	} {
		m := runJSON(t, addr, ExitError, args...)
		wantFenceJSON(t, m, "invalid", 999999999)
		if num(t, m, "revision") != st.GetRevision() {
			t.Fatalf("%v: revision %v, want %d", args, m["revision"], st.GetRevision())
		}
		r := run(t, addr, args...)
		if r.code != ExitError || strings.Count(r.stdout, "\n") != 1 || !strings.HasPrefix(r.stdout, "invalid") {
			t.Fatalf("%v as text: exit %d, stdout %q", args, r.code, r.stdout)
		}
		if strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, "token 999999999 was never issued") {
			t.Fatalf("%v: stderr %q", args, r.stderr)
		}
	}
	m := runJSON(t, addr, 0, "fence", "get", "K")
	if m["found"] != false {
		t.Fatalf("register after the refused writes: %v", m)
	}
	tok := fmt.Sprint(h.Token())
	wantFenceJSON(t, runJSON(t, addr, 0, "fence", "put", "K", "honest", "--token", tok), "accepted", h.Token())
}

// TestFencePutLock: with --lock the write needs a current grant of the
// lock; a holder whose grant ended is stale (exit 3) before anyone newer
// writes.
func TestFencePutLock(t *testing.T) {
	addr, _, _, h := fenceSetup(t)
	tok := fmt.Sprint(h.Token())
	wantFenceJSON(t, runJSON(t, addr, 0, "fence", "put", "K", "v1", "--token", tok, "--lock", "job"), "accepted", h.Token())
	if err := h.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := run(t, addr, "fence", "put", "K", "late", "--token", tok, "--lock", "job", "-o", "json")
	if r.code != ExitStale {
		t.Fatalf("ended grant with --lock: exit %d, want 3 (%q)", r.code, r.stderr)
	}
	wantFenceJSON(t, decodeOne(t, r.stdout), "stale", h.Token())
	if !strings.HasPrefix(r.stderr, "tenure: stale fence token") || !strings.Contains(r.stderr, `lock "job"`) {
		t.Fatalf("stale stderr %q", r.stderr)
	}
	if m := runJSON(t, addr, 0, "fence", "get", "K"); m["value"] != "v1" {
		t.Fatalf("register after the late write: %v", m)
	}
	r = run(t, addr, "fence", "put", "K", "x", "--token", tok, "--lock", "")
	if r.code != ExitError || !strings.Contains(r.stderr, "--lock must not be empty") {
		t.Fatalf("empty --lock: %+v", r)
	}
}

// TestFenceDelete: `fence delete` removes a register with the checks and
// answers of put; an older token cannot write the key again.
func TestFenceDelete(t *testing.T) {
	addr, c, s, h := fenceSetup(t)
	ctx := context.Background()
	old := fmt.Sprint(h.Token())
	wantFenceJSON(t, runJSON(t, addr, 0, "fence", "put", "K", "v1", "--token", old), "accepted", h.Token())
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	m, _ := s.Mutex("job")
	h2, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tok := fmt.Sprint(h2.Token())
	if r := run(t, addr, "fence", "delete", "K"); r.code != ExitError || !strings.Contains(r.stderr, "--token is required") {
		t.Fatalf("delete without --token: %+v", r)
	}
	// The ended grant, naming the lock, is stale; the op id is remembered.
	r := run(t, addr, "fence", "delete", "K", "--token", old, "--lock", "job", "--op-id", "d1", "-o", "json")
	if r.code != ExitStale {
		t.Fatalf("stale delete: exit %d (%q)", r.code, r.stderr)
	}
	wantFenceJSON(t, decodeOne(t, r.stdout), "stale", h.Token())
	wantFenceJSON(t, runJSON(t, addr, 0, "fence", "delete", "K", "--token", tok, "--op-id", "d1"), "duplicate", h.Token())

	txt := run(t, addr, "fence", "delete", "K", "--token", tok, "--lock", "job")
	if txt.code != 0 || txt.stdout != fmt.Sprintf("accepted (register K token %d)\n", h2.Token()) {
		t.Fatalf("delete as text: %+v", txt)
	}
	if reg, err := c.FencedGet(ctx, "K"); err != nil || reg.Found {
		t.Fatalf("register after the delete: %+v %v", reg, err)
	}
	r = run(t, addr, "fence", "put", "K", "late", "--token", old, "-o", "json")
	if r.code != ExitStale {
		t.Fatalf("older token after the delete: exit %d (%q)", r.code, r.stderr)
	}
	wantFenceJSON(t, decodeOne(t, r.stdout), "stale", h2.Token())
	wantFenceJSON(t, runJSON(t, addr, 0, "fence", "put", "K", "v2", "--token", tok), "accepted", h2.Token())
}

// TestFencePutNamingAnotherLock: `fence put --lock res/A` at register
// res/B, which res/B's holder wrote naming res/B, with A's (newer) token,
// used to be accepted: the sender chose the lock. The register is bound to
// res/B: exit 1, result "invalid", the register unchanged.
func TestFencePutNamingAnotherLock(t *testing.T) {
	addr, c, s, _ := fenceSetup(t)
	ctx := context.Background()
	lockOf := func(name string) *client.Hold {
		m, err := s.Mutex(name)
		if err != nil {
			t.Fatal(err)
		}
		h, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	hb := lockOf("res/B")
	wantFenceJSON(t, runJSON(t, addr, 0, "fence", "put", "res/B", "b1", "--token", fmt.Sprint(hb.Token()), "--lock", "res/B"), "accepted", hb.Token())
	ha := lockOf("res/A")
	args := []string{"fence", "put", "res/B", "evil", "--token", fmt.Sprint(ha.Token()), "--lock", "res/A"}
	wantFenceJSON(t, runJSON(t, addr, ExitError, args...), "invalid", ha.Token())
	r := run(t, addr, args...)
	if r.code != ExitError || !strings.HasPrefix(r.stdout, "invalid (register res/B is bound to lock \"res/B\"") || !strings.Contains(r.stderr, `bound to lock "res/B"`) {
		t.Fatalf("as text: %+v", r)
	}
	if reg, err := c.FencedGet(ctx, "res/B"); err != nil || string(reg.Value) != "b1" || reg.Token != hb.Token() || reg.Lock != "res/B" {
		t.Fatalf("res/B after the refused write: %+v %v", reg, err)
	}
	if m := runJSON(t, addr, 0, "fence", "get", "res/B"); m["lock"] != "res/B" || m["value"] != "b1" {
		t.Fatalf("fence get res/B: %v, want its lock res/B", m)
	}
}
