package lessor_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/clock"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/lessor"
)

// TestStallMovesEveryDeadline: a stall leaves every session, lock-delay and
// queue visibility lease exactly as much time as it had when the stall
// began; a keepalive read after it renews its session to one TTL and
// leaves the others as they were; and each then runs out at the time it
// had left.
func TestStallMovesEveryDeadline(t *testing.T) {
	h := newHarness(t)
	h.promote()
	x := h.session(time.Second)
	h.apply(&fsmpb.Command{Op: &fsmpb.Command_Acquire{Acquire: &fsmpb.Acquire{Session: x, Name: "l", LockDelayMs: 5000}}})
	a, b := h.session(3*time.Second), h.session(3*time.Second)
	// 1 s: x expires, and the lock-delay of l runs until 6 s.
	if got := h.stepWant(time.Second, 1); len(got) != 1 || !expires(got[0], x) {
		t.Fatalf("proposed %v, want ExpireSessions(%d)", got, x)
	}
	var qid, qtok uint64
	h.settle(func() { qid, qtok = h.enqueueDequeue("q", 3*time.Second) }) // until 4 s
	if got := h.step(time.Second); len(got) != 0 {
		t.Fatalf("proposed %v before anything was due", got)
	}
	// 2 s.
	before, ok := h.l.TimesLeft([]uint64{a, b})
	if !ok || !slices.Equal(before, []time.Duration{time.Second, time.Second}) {
		t.Fatalf("times left before the stall: %v %v, want 1s each", before, ok)
	}
	if got := h.jump(8 * time.Second); len(got) != 0 {
		t.Fatalf("proposed %v on resuming from a stall of 8s", got)
	}
	after, _ := h.l.TimesLeft([]uint64{a, b})
	if !slices.Equal(after, before) {
		t.Fatalf("times left after the stall: %v, want %v", after, before)
	}
	if ttl, err := h.l.KeepAlive(a); err != nil || ttl != 3*time.Second {
		t.Fatalf("keepalive read after the stall: %v %v", ttl, err)
	}
	left, _ := h.l.TimesLeft([]uint64{a, b})
	if !slices.Equal(left, []time.Duration{3 * time.Second, time.Second}) {
		t.Fatalf("times left after a's keepalive: %v, want [3s 1s]", left)
	}
	// Counting only the time the lessor ran: b ends at 3 s, the delivery
	// at 4 s, a at 5 s, the lock-delay at 6 s.
	for i, want := range []func(*fsmpb.Command) bool{
		func(c *fsmpb.Command) bool { return expires(c, b) },
		func(c *fsmpb.Command) bool {
			e := c.GetQueueExpire()
			return e != nil && e.GetId() == qid && e.GetDeliveryToken() == qtok
		},
		func(c *fsmpb.Command) bool { return expires(c, a) },
		func(c *fsmpb.Command) bool { return c.GetEndLockDelay().GetName() == "l" },
	} {
		span := 600 * time.Millisecond // the one before came 0.2 s after its time
		if i == 0 {
			span = 800 * time.Millisecond
		}
		if got := h.step(span); len(got) != 0 {
			t.Fatalf("deadline %d: proposed %v before its time", i, got)
		}
		if got := h.stepWant(400*time.Millisecond, 1); len(got) != 1 || !want(got[0]) {
			t.Fatalf("deadline %d: proposed %v", i, got)
		}
	}
	if got := h.step(10 * time.Second); len(got) != 0 {
		t.Fatalf("proposed %v after everything ended", got)
	}
}

// BenchmarkStall measures a keepalive that finds a stall, at 1,000 and at
// 1,000,000 sessions: moving every deadline costs the same however many
// there are.
func BenchmarkStall(b *testing.B) {
	for _, n := range []int{1000, 1000000} {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) {
			clk := clock.NewFake()
			st := fsm.NewState()
			l := lessor.New(clk, nil, func(fn func(*fsm.State)) { fn(st) }, func() uint64 { return servingTerm })
			l.Promote(servingTerm, 0)
			for i := range n {
				l.Observe(fsm.Event{Kind: fsm.EventSessionCreated, Session: uint64(i + 1), TTLMs: 3600000})
			}
			b.ResetTimer()
			for range b.N {
				clk.Advance(lessor.StallGap + time.Millisecond)
				if _, err := l.KeepAlive(1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
