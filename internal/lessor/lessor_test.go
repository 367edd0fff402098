package lessor_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
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
	// refuse, if set, decides which proposals fail (not applied).
	refuse func(*fsmpb.Command) error
	// serving is the node's serving term the lessor reads (servingTerm
	// unless a test changes it).
	serving atomic.Uint64
}

// servingTerm is the term the harness's node serves in, and the lessor is
// promoted for.
const servingTerm = 1

func newHarness(t *testing.T) *harness {
	h := &harness{t: t, clk: clock.NewFake(), st: fsm.NewState(), proposed: make(chan *fsmpb.Command, 16)}
	h.serving.Store(servingTerm)
	propose := func(ctx context.Context, cmd *fsmpb.Command) (fsm.Result, error) {
		h.mu.Lock()
		refuse := h.refuse
		h.mu.Unlock()
		if refuse != nil {
			if err := refuse(cmd); err != nil {
				h.proposed <- cmd
				return fsm.Result{}, err
			}
		}
		r := h.apply(cmd)
		h.proposed <- cmd
		return r, r.Err
	}
	read := func(fn func(*fsm.State)) {
		h.mu.Lock()
		defer h.mu.Unlock()
		fn(h.st)
	}
	h.l = lessor.New(h.clk, propose, read, h.serving.Load)
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

func (h *harness) promote() { h.settle(func() { h.l.Promote(servingTerm, 0) }) }

func (h *harness) session(ttl time.Duration) uint64 {
	if h.l.Term() != 0 {
		var id uint64
		h.settle(func() { id = h.session0(ttl) })
		return id
	}
	return h.session0(ttl)
}

func (h *harness) session0(ttl time.Duration) uint64 {
	return h.apply(&fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: "o", TtlMs: ttl.Milliseconds()}}}).Session
}

// stepSize is how far step moves the clock at a time: less than
// lessor.StallGap, so that the lessor sees time pass while it runs, not a
// stall of its process.
const stepSize = 200 * time.Millisecond

// step lets d pass while the lessor runs (in steps of stepSize) and
// reports what it proposed.
func (h *harness) step(d time.Duration) []*fsmpb.Command {
	h.t.Helper()
	var got []*fsmpb.Command
	for d > 0 {
		inc := min(d, stepSize)
		got = append(got, h.jump(inc)...)
		d -= inc
	}
	return got
}

// jump moves the clock by d at once, as the lessor's process sees a stall
// of d (SIGSTOP, a paused VM), and reports what the lessor proposed.
func (h *harness) jump(d time.Duration) []*fsmpb.Command {
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

// expires reports whether cmd is the expiry of exactly the sessions ids
// (in any order).
func expires(cmd *fsmpb.Command, ids ...uint64) bool {
	got := cmd.GetExpireSessions().GetSessions()
	return cmd.GetExpireSessions() != nil && slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(ids)))
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
	if len(got) != 1 || !expires(got[0], before) {
		t.Fatalf("proposed %v, want ExpireSessions(%d)", got, before)
	}
	if _, err := h.l.KeepAlive(before); err == nil {
		t.Fatal("keepalive accepted for an expired session")
	}
}

// TestPromoteAllowance: a new leader gives every session its TTL plus the
// allowance it is promoted with; a keepalive then renews to TTL alone.
func TestPromoteAllowance(t *testing.T) {
	h := newHarness(t)
	a := h.session(3 * time.Second)
	b := h.session(3 * time.Second)
	h.settle(func() { h.l.Promote(servingTerm, 500*time.Millisecond) })
	if got := h.step(3400 * time.Millisecond); len(got) != 0 {
		t.Fatalf("proposed %v within TTL plus allowance", got)
	}
	if _, err := h.l.KeepAlive(b); err != nil {
		t.Fatal(err)
	}
	got := h.stepWant(200*time.Millisecond, 1)
	if len(got) != 1 || !expires(got[0], a) {
		t.Fatalf("proposed %v, want ExpireSessions(%d) at TTL plus allowance", got, a)
	}
	if got := h.step(2600 * time.Millisecond); len(got) != 0 {
		t.Fatalf("proposed %v before b's renewed TTL ran out", got)
	}
	got = h.stepWant(400*time.Millisecond, 1)
	if len(got) != 1 || !expires(got[0], b) {
		t.Fatalf("proposed %v, want ExpireSessions(%d)", got, b)
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

// TestActsOnlyWhileTheNodeServesItsTerm: the lessor acts on the node's
// published leadership, not on a copy of its own: once the node stops
// serving (before Demote comes) it confirms no keepalive, reports no
// times left and proposes no expiry; promoted for one term it does not act
// while the node serves in a later one, until it is promoted for that.
func TestActsOnlyWhileTheNodeServesItsTerm(t *testing.T) {
	h := newHarness(t)
	h.promote()
	id := h.session(time.Second)
	if term := h.l.Term(); term != servingTerm {
		t.Fatalf("promoted lessor acts for term %d, want %d", term, servingTerm)
	}
	for _, serving := range []uint64{0, servingTerm + 1} {
		h.serving.Store(serving)
		if _, err := h.l.KeepAlive(id); !errors.Is(err, lessor.ErrNotLeader) {
			t.Fatalf("node serving term %d: keepalive answered %v, want ErrNotLeader", serving, err)
		}
		if _, ok := h.l.TimesLeft([]uint64{id}); ok {
			t.Fatalf("node serving term %d: the lessor reported times left", serving)
		}
		if term := h.l.Term(); term != 0 {
			t.Fatalf("node serving term %d: the lessor acts for term %d", serving, term)
		}
		if got := h.step(2 * time.Second); len(got) != 0 {
			t.Fatalf("node serving term %d: the lessor proposed %v", serving, got)
		}
	}
	h.settle(func() { h.l.Promote(servingTerm+1, 0) })
	if term := h.l.Term(); term != servingTerm+1 {
		t.Fatalf("lessor promoted for the term served acts for term %d", term)
	}
	if left, ok := h.l.TimesLeft([]uint64{id}); !ok || left[0] != time.Second {
		t.Fatalf("after the promotion: times left %v (ok %v), want a fresh 1s", left, ok)
	}
	if _, err := h.l.KeepAlive(id); err != nil {
		t.Fatalf("keepalive after the promotion: %v", err)
	}
}

func TestLockDelayEndsAfterDelayAndRestartsOnNewLeader(t *testing.T) {
	h := newHarness(t)
	h.promote()
	id := h.session(2 * time.Second)
	h.apply(&fsmpb.Command{Op: &fsmpb.Command_Acquire{Acquire: &fsmpb.Acquire{Session: id, Name: "l", LockDelayMs: 5000}}})
	got := h.stepWant(2*time.Second, 1)
	if len(got) != 1 || got[0].GetExpireSessions() == nil {
		t.Fatalf("proposed %v, want the expiry", got)
	}
	if got := h.step(4800 * time.Millisecond); len(got) != 0 {
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

// TestLockDelayEndRetriedAfterFailedProposal: an EndLockDelay whose
// proposal fails (a timeout, an outcome unknown) is proposed again after a
// short backoff, so one failure does not keep the lock delayed until the
// next leader change.
func TestLockDelayEndRetriedAfterFailedProposal(t *testing.T) {
	h := newHarness(t)
	h.promote()
	id := h.session(2 * time.Second)
	h.apply(&fsmpb.Command{Op: &fsmpb.Command_Acquire{Acquire: &fsmpb.Acquire{Session: id, Name: "l", LockDelayMs: 1000}}})
	if got := h.stepWant(2*time.Second, 1); len(got) != 1 || got[0].GetExpireSessions() == nil {
		t.Fatalf("proposed %v, want the expiry", got)
	}
	failures := 0
	h.mu.Lock()
	h.refuse = func(cmd *fsmpb.Command) error {
		if cmd.GetEndLockDelay() != nil && failures == 0 {
			failures++
			return errors.New("outcome unknown")
		}
		return nil
	}
	h.mu.Unlock()
	if got := h.step(800 * time.Millisecond); len(got) != 0 {
		t.Fatalf("proposed %v before the 1s lock-delay ended", got)
	}
	// The first EndLockDelay fails; the second, a moment later, is applied.
	got := h.stepWant(time.Second, 2)
	if len(got) != 2 || got[0].GetEndLockDelay().GetName() != "l" || got[1].GetEndLockDelay().GetName() != "l" {
		t.Fatalf("proposed %v, want EndLockDelay(l) twice", got)
	}
	h.mu.Lock()
	delayed := h.st.Lock("l").Delayed
	h.mu.Unlock()
	if delayed {
		t.Fatal("lock still delayed after the retried EndLockDelay")
	}
	if got := h.step(10 * time.Second); len(got) != 0 {
		t.Fatalf("proposed %v after the delay ended", got)
	}
}

// TestStallIsNotChargedToSessions: when the lessor finds that its process
// did not run for a while (the clock jumped past its timer: SIGSTOP, a
// paused VM, starvation), it charges no session for that time, so a
// keepalive that arrived meanwhile and is read only now still counts.
// Time that passes while it runs counts as before.
func TestStallIsNotChargedToSessions(t *testing.T) {
	h := newHarness(t)
	h.promote()
	a := h.session(3 * time.Second)
	b := h.session(3 * time.Second)
	if got := h.step(2 * time.Second); len(got) != 0 {
		t.Fatalf("proposed %v before the TTL ran out", got)
	}
	if got := h.jump(8 * time.Second); len(got) != 0 {
		t.Fatalf("proposed %v on resuming from a stall of 8s", got)
	}
	if _, err := h.l.KeepAlive(a); err != nil {
		t.Fatalf("keepalive read after the stall: %v", err)
	}
	// b had 1s left when the stall began, and still has.
	if got := h.step(800 * time.Millisecond); len(got) != 0 {
		t.Fatalf("proposed %v although b has 1s left after the stall", got)
	}
	got := h.stepWant(400*time.Millisecond, 1)
	if len(got) != 1 || !expires(got[0], b) {
		t.Fatalf("proposed %v, want ExpireSessions(%d)", got, b)
	}
	// a was renewed on resuming: 3s from then.
	if got := h.step(1600 * time.Millisecond); len(got) != 0 {
		t.Fatalf("proposed %v before a's renewed TTL ran out", got)
	}
	got = h.stepWant(400*time.Millisecond, 1)
	if len(got) != 1 || !expires(got[0], a) {
		t.Fatalf("proposed %v, want ExpireSessions(%d)", got, a)
	}
}

// TestFailedExpiryKeepsANewLeadershipsTTL: an expiry proposal that fails
// because leadership was lost must not, when it returns after this node
// leads again, cut short the fresh TTL the new leadership gave.
func TestFailedExpiryKeepsANewLeadershipsTTL(t *testing.T) {
	h := newHarness(t)
	h.promote()
	id := h.session(2 * time.Second)
	first := true
	h.mu.Lock()
	h.refuse = func(cmd *fsmpb.Command) error {
		if cmd.GetExpireSessions() != nil && first {
			first = false
			h.l.Demote()
			h.l.Promote(servingTerm, 0) // leads again before the failure comes back
			return errors.New("leadership lost")
		}
		return nil
	}
	h.mu.Unlock()
	if got := h.stepWant(2*time.Second, 1); len(got) != 1 || !expires(got[0], id) {
		t.Fatalf("proposed %v, want ExpireSessions(%d) (which fails)", got, id)
	}
	if got := h.step(1800 * time.Millisecond); len(got) != 0 {
		t.Fatalf("proposed %v within the new leadership's fresh TTL", got)
	}
	if got := h.stepWant(400*time.Millisecond, 1); len(got) != 1 || !expires(got[0], id) {
		t.Fatalf("proposed %v, want ExpireSessions(%d) after the fresh TTL", got, id)
	}
}

// TestExpiriesDueTogetherAreOneCommand: sessions whose deadlines pass
// together are expired by one ExpireSessions (one commit), however many;
// one due later is not in it, and sessions kept alive or closed meanwhile
// are left out.
func TestExpiriesDueTogetherAreOneCommand(t *testing.T) {
	h := newHarness(t)
	h.promote()
	var due []uint64
	for range 50 {
		due = append(due, h.session(2*time.Second))
	}
	kept, closed := h.session(2*time.Second), h.session(2*time.Second)
	later := h.session(5 * time.Second)
	h.step(time.Second)
	if _, err := h.l.KeepAlive(kept); err != nil {
		t.Fatal(err)
	}
	h.apply(&fsmpb.Command{Op: &fsmpb.Command_CloseSession{CloseSession: &fsmpb.CloseSession{Session: closed}}})
	got := h.stepWant(1200*time.Millisecond, 1)
	if len(got) != 1 || !expires(got[0], due...) {
		t.Fatalf("proposed %v, want one ExpireSessions of the %d sessions due", got, len(due))
	}
	h.mu.Lock()
	n := h.st.SessionCount()
	h.mu.Unlock()
	if n != 2 {
		t.Fatalf("%d sessions after the expiry, want 2 (kept and later)", n)
	}
	if got := h.stepWant(2*time.Second, 1); len(got) != 1 || !expires(got[0], kept) {
		t.Fatalf("proposed %v, want ExpireSessions(%d) a TTL after its keepalive", got, kept)
	}
	if got := h.stepWant(2*time.Second, 1); len(got) != 1 || !expires(got[0], later) {
		t.Fatalf("proposed %v, want ExpireSessions(%d)", got, later)
	}
}

// TestKeepAliveAfterPromotionKeepsTheTTL: a keepalive soon after a
// promotion sets the deadline to one TTL from then, even though the
// promotion's allowance had put it later; the session expires on time.
func TestKeepAliveAfterPromotionKeepsTheTTL(t *testing.T) {
	h := newHarness(t)
	id := h.session(2 * time.Second)
	h.settle(func() { h.l.Promote(servingTerm, 3*time.Second) })
	if _, err := h.l.KeepAlive(id); err != nil {
		t.Fatal(err)
	}
	if got := h.step(1800 * time.Millisecond); len(got) != 0 {
		t.Fatalf("proposed %v within the TTL after the keepalive", got)
	}
	if got := h.stepWant(400*time.Millisecond, 1); len(got) != 1 || !expires(got[0], id) {
		t.Fatalf("proposed %v, want ExpireSessions(%d) a TTL after the keepalive", got, id)
	}
}

// TestExpiryRetriedAfterFailedProposal: when the proposal of an expiry
// fails, every session in it is proposed again after a short backoff,
// together.
func TestExpiryRetriedAfterFailedProposal(t *testing.T) {
	h := newHarness(t)
	h.promote()
	a, b := h.session(time.Second), h.session(time.Second)
	failed := false
	h.mu.Lock()
	h.refuse = func(cmd *fsmpb.Command) error {
		if cmd.GetExpireSessions() != nil && !failed {
			failed = true
			return errors.New("outcome unknown")
		}
		return nil
	}
	h.mu.Unlock()
	got := h.stepWant(1200*time.Millisecond, 2)
	if len(got) != 2 || !expires(got[0], a, b) || !expires(got[1], a, b) {
		t.Fatalf("proposed %v, want ExpireSessions(%d, %d) twice", got, a, b)
	}
	h.mu.Lock()
	n := h.st.SessionCount()
	h.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d sessions left after the retried expiry", n)
	}
}
