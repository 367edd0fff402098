package clienttest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/clock"
	"github.com/tenure-io/tenure/internal/testutil"
)

// fakeClock is a clock.Fake as a client.Clock.
type fakeClock struct{ *clock.Fake }

func (f fakeClock) NewTimer(d time.Duration) client.Timer { return f.Fake.NewTimer(d) }

// advance moves the fake clock and waits until the session's keeper has
// handled it (it re-arms its timer after every wake-up).
func advance(t *testing.T, clk *clock.Fake, d time.Duration) {
	t.Helper()
	armed := clk.TimerCreated()
	clk.Advance(d)
	select {
	case <-armed:
	case <-time.After(10 * time.Second):
		t.Fatal("keeper did not re-arm its timer")
	}
}

func waitState(t *testing.T, h *client.Hold, want client.State) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for h.State() != want {
		if time.Now().After(deadline) {
			t.Fatalf("hold state %v, want %v", h.State(), want)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func waitArmed(t *testing.T, clk *clock.Fake) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for clk.Pending() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no timer armed")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestSuspectCancelsBeforeServerCouldExpire(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	px := testutil.StartProxy(t, srv.Addr())
	clk := clock.NewFake()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := dial(t, px.Addr(), client.WithClock(fakeClock{clk}))
	const ttl = 9 * time.Second
	s, err := c.NewSession(ctx, client.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	created := clk.Now() // the create request was sent at this instant
	m, _ := s.Mutex("job")
	h, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	work := h.Context()
	changes := h.Changes()
	waitArmed(t, clk)

	px.Pause(false, true)  // renewals reach the server, confirmations do not come back
	advance(t, clk, ttl/3) // renewal 1 sent, unconfirmed
	if h.State() != client.Held {
		t.Fatalf("state %v after one renewal period", h.State())
	}
	advance(t, clk, ttl/3) // renewal 1 still unconfirmed: suspect
	select {
	case <-work.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("suspect did not cancel the hold's context")
	}
	if got := <-changes; got != client.Suspect {
		t.Fatalf("first change %v, want suspect", got)
	}
	// The server counts the session from no earlier than the create was
	// sent, so it cannot have expired it before created+TTL.
	if now := clk.Now(); !now.Before(created.Add(ttl)) {
		t.Fatalf("suspect at +%v, not before the server's earliest expiry +%v", now.Sub(created), ttl)
	}

	px.Resume() // confirmations arrive: held again, with a fresh context
	if got := <-changes; got != client.Held {
		t.Fatalf("change %v, want held", got)
	}
	if h.Context().Err() != nil || h.Context() == work {
		t.Fatal("held again but context is not a fresh live one")
	}

	px.Pause(false, true)
	for i := 0; i < 20 && h.State() != client.Lost; i++ {
		before := clk.Now()
		safe := s.SafeDeadline()
		if before.After(safe) {
			t.Fatalf("still %v at +%v, past the safe deadline +%v", h.State(), before.Sub(created), safe.Sub(created))
		}
		clk.Advance(time.Second)
		select {
		case <-h.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	waitState(t, h, client.Lost)
	if !errors.Is(h.Err(), client.ErrSessionExpired) || !errors.Is(s.Err(), client.ErrSessionExpired) {
		t.Fatalf("lost with %v / session %v, want ErrSessionExpired", h.Err(), s.Err())
	}
	px.Resume()
	// Lost is terminal: confirmations arriving late change nothing.
	if err := h.Unlock(ctx); !errors.Is(err, client.ErrNotHeld) {
		t.Fatalf("unlock of a lost hold: %v, want ErrNotHeld", err)
	}
	if h.State() != client.Lost {
		t.Fatalf("lost hold moved to %v", h.State())
	}
}

func TestLostWhenServerExpiresSession(t *testing.T) {
	srvClock := clock.NewFake()
	srv := testutil.Start(t, "", srvClock)
	px := testutil.StartProxy(t, srv.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := dial(t, px.Addr())
	s, err := c.NewSession(ctx, client.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := s.Mutex("job")
	h, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	px.Pause(true, false) // the server hears nothing more from this client
	for i := 0; i < 200 && h.State() != client.Lost; i++ {
		testutil.Elapse(t, srvClock, time.Second)
		select {
		case <-h.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	waitState(t, h, client.Lost)
	if !errors.Is(h.Err(), client.ErrSessionExpired) {
		t.Fatalf("lost with %v", h.Err())
	}
	if h.Context().Err() == nil {
		t.Fatal("lost hold's context not cancelled")
	}
	// The lock is free and the next grant's token is larger.
	direct := dial(t, srv.Addr())
	s2, err := direct.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m2, _ := s2.Mutex("job")
	h2, err := m2.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h2.Token() <= h.Token() {
		t.Fatalf("new token %d not above lost token %d", h2.Token(), h.Token())
	}
	hist, err := direct.LockHistory(ctx, "job")
	if err != nil || len(hist.Grants) != 2 || hist.Grants[0].Ended != "expired" {
		t.Fatalf("history %v %v", hist, err)
	}
}

func TestProgressWatchdogLetsGoOfStuckHolder(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	clk := clock.NewFake()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := dial(t, srv.Addr(), client.WithClock(fakeClock{clk}))
	s, err := c.NewSession(ctx, client.WithTTL(30*time.Second), client.WithProgressDeadline(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := s.Mutex("job")
	h, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitArmed(t, clk)
	clk.Advance(3 * time.Second) // nothing is due yet
	h.Progress()
	advance(t, clk, 3*time.Second) // 6s since start, 3s since progress: fine
	if h.State() != client.Held {
		t.Fatalf("state %v with recent progress", h.State())
	}
	clk.Advance(3 * time.Second) // 6s without progress: the watchdog fires
	waitState(t, h, client.Lost)
	if !errors.Is(h.Err(), client.ErrProgressDeadline) {
		t.Fatalf("lost with %v, want ErrProgressDeadline", h.Err())
	}
	// It let go on the server too: another session gets the lock at once,
	// long before the 30s TTL.
	other := dial(t, srv.Addr())
	s2, err := other.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m2, _ := s2.Mutex("job")
	lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
	defer lcancel()
	if _, err := m2.Lock(lctx); err != nil {
		t.Fatalf("lock after watchdog: %v", err)
	}
}

func TestBrokenConnectionIsSuspectThenHeld(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	px := testutil.StartProxy(t, srv.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := dial(t, px.Addr())
	s, err := c.NewSession(ctx, client.WithTTL(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := s.Mutex("job")
	h, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	changes := h.Changes()
	work := h.Context()
	px.Cut()
	if got := <-changes; got != client.Suspect {
		t.Fatalf("change %v, want suspect", got)
	}
	if work.Err() == nil {
		t.Fatal("context not cancelled on a broken connection")
	}
	if got := <-changes; got != client.Held {
		t.Fatalf("change %v, want held after reconnect", got)
	}
	st, err := c.LockStatus(ctx, "job")
	if err != nil || st.Holder == nil || st.Holder.Session != s.ID() || st.Holder.Token != h.Token() {
		t.Fatalf("status after reconnect %v %v", st, err)
	}
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
