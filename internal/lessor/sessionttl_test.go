package lessor_test

import (
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

func (h *harness) setTTL(id uint64, ttl time.Duration) {
	h.t.Helper()
	if r := h.apply(&fsmpb.Command{Op: &fsmpb.Command_SetSessionTtl{SetSessionTtl: &fsmpb.SetSessionTTL{Session: id, TtlMs: ttl.Milliseconds()}}}); r.Err != nil {
		h.t.Fatal(r.Err)
	}
}

func (h *harness) keepAlive(id uint64, want time.Duration) {
	h.t.Helper()
	got, err := h.l.KeepAlive(id)
	if err != nil || got != want {
		h.t.Fatalf("KeepAlive(%d) = %v, %v; want %v", id, got, err, want)
	}
}

// TestSetSessionTTLLonger: a session whose TTL grows is due one new TTL
// after the change, and every keepalive then extends it by the new TTL.
func TestSetSessionTTLLonger(t *testing.T) {
	h := newHarness(t)
	h.promote()
	id := h.session(10 * time.Second)
	h.step(2 * time.Second)
	h.setTTL(id, 30*time.Second)
	if got := h.step(29 * time.Second); len(got) != 0 {
		t.Fatalf("proposed %v within the new TTL of the change (the old one ran out)", got)
	}
	h.keepAlive(id, 30*time.Second)
	if got := h.step(29 * time.Second); len(got) != 0 {
		t.Fatalf("proposed %v within the new TTL of a keepalive", got)
	}
	if got := h.stepWant(2*time.Second, 1); len(got) != 1 || !expires(got[0], id) {
		t.Fatalf("proposed %v, want ExpireSessions(%d) once the new TTL ran out", got, id)
	}
}

// TestSetSessionTTLShorter: a TTL that shrinks governs from the next
// keepalive (the ZooKeeper front's, as it answers the client the new
// TTL): the session is due one new TTL after it, not at the heap key the
// old TTL gave it; the deadline the last keepalive confirmed before the
// change is not cut short.
func TestSetSessionTTLShorter(t *testing.T) {
	h := newHarness(t)
	h.promote()
	id := h.session(30 * time.Second)
	h.step(time.Second)
	h.keepAlive(id, 30*time.Second) // due at 31s
	h.setTTL(id, 4*time.Second)
	if got := h.step(10 * time.Second); len(got) != 0 {
		t.Fatalf("proposed %v before the deadline a keepalive confirmed", got)
	}
	h.keepAlive(id, 4*time.Second) // due 4s from now, not at 31s
	if got := h.step(3 * time.Second); len(got) != 0 {
		t.Fatalf("proposed %v within the new TTL", got)
	}
	if got := h.stepWant(2*time.Second, 1); len(got) != 1 || !expires(got[0], id) {
		t.Fatalf("proposed %v, want ExpireSessions(%d) once the new TTL ran out after the keepalive", got, id)
	}
}

// TestPromoteTimesWithChangedTTL: a new leader times a session with the
// TTL it was last given, not the one it was created with.
func TestPromoteTimesWithChangedTTL(t *testing.T) {
	h := newHarness(t)
	id := h.session(30 * time.Second)
	h.setTTL(id, 4*time.Second) // applied while this node follows
	h.promote()
	if got := h.step(3 * time.Second); len(got) != 0 {
		t.Fatalf("proposed %v within the TTL", got)
	}
	if got := h.stepWant(2*time.Second, 1); len(got) != 1 || !expires(got[0], id) {
		t.Fatalf("proposed %v, want ExpireSessions(%d) after the changed TTL", got, id)
	}
}
