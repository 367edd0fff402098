package lessor_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/clock"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/lessor"
)

// harness runs a lessor over a real State, applying what it proposes.
type harness struct {
	t   *testing.T
	clk *clock.Fake
	l   *lessor.Lessor

	mu       sync.Mutex
	st       *fsm.State
	proposed chan *fsmpb.Command
}

func newHarness(t *testing.T) *harness {
	h := &harness{t: t, clk: clock.NewFake(), st: fsm.NewState(), proposed: make(chan *fsmpb.Command, 16)}
	propose := func(ctx context.Context, cmd *fsmpb.Command) (fsm.Result, error) {
		r := h.apply(cmd)
		h.proposed <- cmd
		return r, r.Err
	}
	read := func(fn func(*fsm.State)) {
		h.mu.Lock()
		defer h.mu.Unlock()
		fn(h.st)
	}
	h.l = lessor.New(h.clk, propose, read)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	armed := h.clk.TimerCreated()
	go func() { h.l.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	<-armed // the loop is idle: every later wake-up re-arms exactly once
	return h
}

func (h *harness) apply(cmd *fsmpb.Command) fsm.Result {
	h.mu.Lock()
	var evs []fsm.Event
	r := h.st.Apply(cmd, func(e fsm.Event) { evs = append(evs, e) })
	h.mu.Unlock()
	for _, e := range evs {
		h.l.Observe(e)
	}
	return r
}

// settle runs fn, which wakes the lessor, and waits until it is idle again.
func (h *harness) settle(fn func()) {
	h.t.Helper()
	armed := h.clk.TimerCreated()
	fn()
	select {
	case <-armed:
	case <-time.After(10 * time.Second):
		h.t.Fatal("lessor did not re-arm")
	}
}

func (h *harness) promote() { h.settle(h.l.Promote) }

func (h *harness) session(ttl time.Duration) uint64 {
	if h.l.IsLeader() {
		var id uint64
		h.settle(func() { id = h.session0(ttl) })
		return id
	}
	return h.session0(ttl)
}

func (h *harness) session0(ttl time.Duration) uint64 {
	return h.apply(&fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: "o", TtlMs: ttl.Milliseconds()}}}).Session
}

// step advances the clock by d and reports what the lessor proposed.
func (h *harness) step(d time.Duration) []*fsmpb.Command {
	h.t.Helper()
	armed := h.clk.TimerCreated()
	if h.clk.Advance(d) == 0 {
		return nil // no timer came due: the lessor did nothing
	}
	var got []*fsmpb.Command
	for {
		select {
		case c := <-h.proposed:
			got = append(got, c)
		case <-armed: // the loop is idle again
			select {
			case c := <-h.proposed:
				got = append(got, c)
				continue
			default:
			}
			return got
		case <-time.After(10 * time.Second):
			h.t.Fatal("lessor did not re-arm")
		}
	}
}

// stepWant is step for a move after which the lessor must propose n
// commands: it also waits (with a deadline) for proposals still on their way.
func (h *harness) stepWant(d time.Duration, n int) []*fsmpb.Command {
	h.t.Helper()
	got := h.step(d)
	deadline := time.After(10 * time.Second)
	for len(got) < n {
		select {
		case c := <-h.proposed:
			got = append(got, c)
		case <-deadline:
			return got
		}
	}
	return got
}

func TestExpiryOnlyAfterFullTTLOnLeader(t *testing.T) {
	h := newHarness(t)
	before := h.session(10 * time.Second) // exists before this node leads
	h.step(time.Hour)                     // a follower proposes nothing
	h.promote()                           // fresh full TTL from now
	if got := h.step(9 * time.Second); len(got) != 0 {
		t.Fatalf("proposed %v before the TTL ran out", got)
	}
	if _, err := h.l.KeepAlive(before); err != nil {
		t.Fatal(err)
	}
	if got := h.step(9 * time.Second); len(got) != 0 {
		t.Fatalf("proposed %v although a keepalive came 9s ago", got)
	}
	got := h.stepWant(2*time.Second, 1)
	if len(got) != 1 || got[0].GetExpireSession().GetSession() != before {
		t.Fatalf("proposed %v, want ExpireSession(%d)", got, before)
	}
	if _, err := h.l.KeepAlive(before); err == nil {
		t.Fatal("keepalive accepted for an expired session")
	}
}

func TestKeepAliveRefusedOnFollowerAndForUnknown(t *testing.T) {
	h := newHarness(t)
	id := h.session(5 * time.Second)
	if _, err := h.l.KeepAlive(id); err != lessor.ErrNotLeader {
		t.Fatalf("follower keepalive: %v", err)
	}
	h.promote()
	if _, err := h.l.KeepAlive(id + 100); err != fsm.ErrSessionNotFound {
		t.Fatalf("unknown session: %v", err)
	}
	h.l.Demote()
	if got := h.step(time.Hour); len(got) != 0 {
		t.Fatalf("demoted lessor proposed %v", got)
	}
}

func TestLockDelayEndsAfterDelayAndRestartsOnNewLeader(t *testing.T) {
	h := newHarness(t)
	h.promote()
	id := h.session(2 * time.Second)
	h.apply(&fsmpb.Command{Op: &fsmpb.Command_Acquire{Acquire: &fsmpb.Acquire{Session: id, Name: "l", LockDelayMs: 5000}}})
	got := h.stepWant(3*time.Second, 1)
	if len(got) != 1 || got[0].GetExpireSession() == nil {
		t.Fatalf("proposed %v, want the expiry", got)
	}
	if got := h.step(4 * time.Second); len(got) != 0 {
		t.Fatalf("proposed %v before the 5s lock-delay ended", got)
	}
	h.l.Demote()
	h.promote() // a new leader starts the delay again in full
	if got := h.step(4 * time.Second); len(got) != 0 {
		t.Fatalf("new leader ended the delay early: %v", got)
	}
	got = h.stepWant(2*time.Second, 1)
	if len(got) != 1 || got[0].GetEndLockDelay().GetName() != "l" {
		t.Fatalf("proposed %v, want EndLockDelay(l)", got)
	}
	h.mu.Lock()
	delayed := h.st.Lock("l").Delayed
	h.mu.Unlock()
	if delayed {
		t.Fatal("lock still delayed")
	}
}
