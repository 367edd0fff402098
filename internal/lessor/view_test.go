package lessor_test

import (
	"slices"
	"testing"
	"time"
)

// TestTimesLeft: the leader tells how long each session has left; a
// keepalive restores the full TTL; a follower knows nothing.
func TestTimesLeft(t *testing.T) {
	h := newHarness(t)
	id := h.session(10 * time.Second)
	if _, ok := h.l.TimesLeft([]uint64{id}); ok {
		t.Fatal("a follower reported times left")
	}
	h.promote()
	h.step(4 * time.Second)
	left, ok := h.l.TimesLeft([]uint64{id, id + 100})
	if !ok || !slices.Equal(left, []time.Duration{6 * time.Second, -1}) {
		t.Fatalf("times left %v %v, want [6s -1]", left, ok)
	}
	if _, err := h.l.KeepAlive(id); err != nil {
		t.Fatal(err)
	}
	if left, _ := h.l.TimesLeft([]uint64{id}); left[0] != 10*time.Second {
		t.Fatalf("after a keepalive: %v", left)
	}
}
