package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	pb "github.com/tenure-io/tenure/api/tenurepb"
)

// documented is the hold's state machine as docs/architecture.md and the
// State constants draw it, written out edge by edge.
var documented = map[[2]State]bool{
	{Acquiring, Held}: true, {Acquiring, Suspect}: true, {Acquiring, Lost}: true, {Acquiring, Released}: true,
	{Held, Suspect}: true, {Held, Lost}: true, {Held, Released}: true,
	{Suspect, Held}: true, {Suspect, Lost}: true, {Suspect, Released}: true,
}

var allStates = []State{Acquiring, Held, Suspect, Lost, Released}

// holdIn returns a hold (of no session) moved to st along documented
// edges.
func holdIn(t *testing.T, st State) *Hold {
	t.Helper()
	h := &Hold{state: Acquiring, done: make(chan struct{})}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	h.cancel()
	path := map[State][]State{Acquiring: nil, Held: {Held}, Suspect: {Held, Suspect}, Lost: {Held, Lost}, Released: {Held, Released}}[st]
	for _, s := range path {
		if !h.setState(s, nil) {
			t.Fatalf("setting up a %v hold: the move to %v was refused", st, s)
		}
	}
	return h
}

// TestHoldTransitionsFollowTheTable: from every state, exactly the
// documented moves happen; every other one (back to Acquiring, out of a
// terminal state, to the same state) changes nothing: not the state, not
// the context, and no change is reported.
func TestHoldTransitionsFollowTheTable(t *testing.T) {
	for _, from := range allStates {
		for _, to := range allStates {
			h := holdIn(t, from)
			ctxBefore := h.Context()
			changes := h.Changes()
			if from.terminal() {
				<-changes // the terminal state, then closed
			}
			moved := h.setState(to, nil)
			want := documented[[2]State{from, to}]
			if moved != want || canMove(from, to) != want {
				t.Errorf("%v → %v: moved %v, canMove %v; documented %v", from, to, moved, canMove(from, to), want)
			}
			if !want {
				if h.State() != from {
					t.Errorf("%v → %v refused, but the hold is now %v", from, to, h.State())
				}
				if h.Context() != ctxBefore {
					t.Errorf("%v → %v refused, but the hold's context changed", from, to)
				}
				select {
				case st, ok := <-changes:
					if ok {
						t.Errorf("%v → %v refused, but Changes reported %v", from, to, st)
					}
				default:
				}
				continue
			}
			if h.State() != to {
				t.Errorf("%v → %v: the hold is %v", from, to, h.State())
			}
			if st := <-changes; st != to {
				t.Errorf("%v → %v: Changes reported %v", from, to, st)
			}
			if live := h.Context().Err() == nil; live != (to == Held) {
				t.Errorf("%v → %v: context live %v", from, to, live)
			}
		}
	}
}

// TestChangesReportsOverflowInsteadOfDropping: a receiver that does not
// keep up gets every change up to its buffer, in order, and then its
// channel is closed while the hold lives on; a new Changes sees what
// follows.
func TestChangesReportsOverflowInsteadOfDropping(t *testing.T) {
	h := holdIn(t, Held)
	ch := h.Changes()
	var sent []State
	for i := range 3 * maxLag {
		st := Suspect
		if i%2 == 1 {
			st = Held
		}
		if !h.setState(st, nil) {
			t.Fatalf("move %d to %v refused", i, st)
		}
		sent = append(sent, st)
	}
	var got []State
	for st := range ch {
		got = append(got, st)
	}
	if len(got) != maxLag {
		t.Fatalf("the lagging receiver got %d changes before its channel closed, want %d", len(got), maxLag)
	}
	for i := range got {
		if got[i] != sent[i] {
			t.Fatalf("change %d: got %v, want %v (every change in order)", i, got[i], sent[i])
		}
	}
	if h.State().terminal() {
		t.Fatalf("the hold is %v: the close should report the overflow of a live hold", h.State())
	}
	again := h.Changes()
	h.setState(Released, nil)
	if st := <-again; st != Released {
		t.Fatalf("a new Changes got %v, want released", st)
	}
	if _, ok := <-again; ok {
		t.Fatal("Changes not closed after the terminal state")
	}
}

// TestAcquiringWhileInFlight: a hold is Acquiring, with no token and a
// cancelled context, while its acquire waits in line; the grant moves it
// to Held, and an acquire given up on ends Released.
func TestAcquiringWhileInFlight(t *testing.T) {
	f := startFake(t, true)
	f.setQueue(true)
	c := dialFake(t, f)
	ctx := testCtx(t)
	s, err := c.NewSession(ctx, WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := s.Mutex("L")
	seen := make(chan *Hold, 1)
	queued := make(chan int, 1)
	type result struct {
		h   *Hold
		err error
	}
	locked := make(chan result, 1)
	go func() {
		h, err := m.Lock(ctx, OnAcquiring(func(h *Hold) { seen <- h }), OnQueued(func(p int) { queued <- p }))
		locked <- result{h, err}
	}()
	h := <-seen
	changes := h.Changes()
	<-queued
	if h.State() != Acquiring || h.Token() != 0 || h.Context().Err() == nil {
		t.Fatalf("while queued: state %v, token %d, context %v; want acquiring, 0, cancelled", h.State(), h.Token(), h.Context().Err())
	}
	if err := h.Unlock(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Unlock while acquiring: %v, want ErrNotHeld", err)
	}
	if n := f.grantQueued(); n != 1 {
		t.Fatalf("%d acquires in line, want 1", n)
	}
	r := <-locked
	if r.err != nil || r.h != h {
		t.Fatalf("Lock: %v (the same hold: %v)", r.err, r.h == h)
	}
	if st := <-changes; st != Held || h.Token() == 0 || h.Context().Err() != nil {
		t.Fatalf("after the grant: change %v, token %d, context %v", st, h.Token(), h.Context().Err())
	}

	// An acquire given up on while in line ends Released.
	m2, _ := s.Mutex("M")
	actx, giveUp := context.WithCancel(ctx)
	seen2 := make(chan *Hold, 1)
	queued2 := make(chan int, 1)
	gaveUp := make(chan error, 1)
	go func() {
		_, err := m2.Lock(actx, OnAcquiring(func(h *Hold) { seen2 <- h }), OnQueued(func(p int) { queued2 <- p }))
		gaveUp <- err
	}()
	h2 := <-seen2
	<-queued2
	giveUp()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock given up: %v", err)
	}
	if h2.State() != Released {
		t.Fatalf("an acquire given up on left its hold %v, want released", h2.State())
	}
}

// TestOneLoopFollowsTheLeader: acquire, unlock and close all go through
// the session's one request loop: an answer "not the leader" moves the
// session to the node that leads, and the request is sent again there.
func TestOneLoopFollowsTheLeader(t *testing.T) {
	a, b := startFake(t, true), startFake(t, false)
	c := dialFake(t, a, b)
	ctx := testCtx(t)
	s, err := c.NewSession(ctx, WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	a.setLeader(false)
	b.setLeader(true)
	m, _ := s.Mutex("L")
	h, err := m.Lock(ctx)
	if err != nil {
		t.Fatalf("Lock after the leader moved: %v", err)
	}
	if n, _ := b.counts(); n != 1 {
		t.Fatalf("the new leader saw %d acquires, want 1", n)
	}
	b.setLeader(false)
	a.setLeader(true)
	if err := h.Unlock(ctx); err != nil {
		t.Fatalf("Unlock after the leader moved back: %v", err)
	}
	b.setLeader(true)
	a.setLeader(false)
	if err := s.Close(ctx); err != nil {
		t.Fatalf("Close after the leader moved again: %v", err)
	}
	if _, closes := b.counts(); closes != 1 {
		t.Fatalf("the leader answered %d closes, want 1", closes)
	}
}

// TestDialHonoursContext: a context that has ended makes Dial return its
// error at once, and no client.
func TestDialHonoursContext(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	for name, tc := range map[string]struct {
		ctx  context.Context
		want error
	}{"cancelled": {cancelled, context.Canceled}, "expired": {expired, context.DeadlineExceeded}} {
		start := time.Now()
		c, err := Dial(tc.ctx, "127.0.0.1:1")
		if !errors.Is(err, tc.want) || c != nil {
			t.Errorf("%s: Dial = %v, %v; want nil, %v", name, c, err, tc.want)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("%s: Dial took %v", name, d)
		}
	}
}

// TestClientCloseEndsSessions: Client.Close ends its sessions' goroutines
// (the keeper renewing a session would otherwise run on until the safe
// deadline), and their holds are Lost with ErrClosed.
func TestClientCloseEndsSessions(t *testing.T) {
	f := startFake(t, true)
	ignore := goleak.IgnoreCurrent()
	c, err := Dial(context.Background(), f.addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	s, err := c.NewSession(ctx, WithTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := s.Mutex("L")
	h, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(s.Err(), ErrClosed) || h.State() != Lost || !errors.Is(h.Err(), ErrClosed) {
		t.Fatalf("after Client.Close: session %v, hold %v (%v); want ErrClosed, lost", s.Err(), h.State(), h.Err())
	}
	select {
	case <-s.Done():
	default:
		t.Fatal("the session's Done is open after Client.Close")
	}
	if _, err := c.NewSession(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("NewSession on a closed client: %v", err)
	}
	goleak.VerifyNone(t, ignore)
}

// TestFollowsTheLeaderNamed: a member that answers "not the leader" with
// the leader's address sends the client there at once: a session opened
// on a follower, and a read sent to it, end on the leader. Without
// WithDiscovery an address the client was not given is not followed.
func TestFollowsTheLeaderNamed(t *testing.T) {
	leader, follower := startFake(t, true), startFake(t, false)
	follower.set(func(f *fakeTenure) { f.hint = leader.addr })
	c, err := Dial(context.Background(), follower.addr, WithDiscovery())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx := testCtx(t)
	s, err := c.NewSession(ctx, WithTTL(30*time.Second))
	if err != nil {
		t.Fatalf("a session opened through a follower that names the leader: %v", err)
	}
	m, _ := s.Mutex("L")
	if _, err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _ := leader.counts(); n != 1 || c.Endpoint() != leader.addr {
		t.Fatalf("the leader saw %d acquires; the client is at %s, the leader at %s", n, c.Endpoint(), leader.addr)
	}

	// A unary read through a client given the follower alone ends on the
	// leader too.
	c2, err := Dial(context.Background(), follower.addr, WithDiscovery())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := c2.FencedGet(ctx, "k"); err != nil || c2.Endpoint() != leader.addr {
		t.Fatalf("a read through the follower: %v, at %s", err, c2.Endpoint())
	}

	// Without discovery the named leader is not one of the endpoints:
	// not followed, and no leader answers.
	c3, err := Dial(context.Background(), follower.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := c3.FencedGet(sctx, "k"); !errors.Is(err, ErrNoLeader) {
		t.Fatalf("without discovery: %v, want ErrNoLeader", err)
	}
}

// TestDiscoveryOneEndpointSuffices: a client given one member learns the
// others from the member list after its first call, and goes on through
// them when that member stops; a list of one member adds nothing.
func TestDiscoveryOneEndpointSuffices(t *testing.T) {
	a, b := startFake(t, true), startFake(t, false)
	members := []*pb.Member{{Id: "a", ClientAddr: a.addr, Leader: true}, {Id: "b", ClientAddr: b.addr}}
	a.set(func(f *fakeTenure) { f.members = members })
	b.set(func(f *fakeTenure) { f.members = members })
	c, err := Dial(context.Background(), a.addr, WithDiscovery())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := testCtx(t)
	if _, err := c.FencedGet(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if n := len(c.all()); n != 2 {
		t.Fatalf("after the first call the client knows %d endpoints, want 2", n)
	}
	a.stop()
	b.setLeader(true)
	if _, err := c.FencedGet(ctx, "k"); err != nil || c.Endpoint() != b.addr {
		t.Fatalf("after the only given member stopped: %v, at %s", err, c.Endpoint())
	}

	solo := startFake(t, true)
	solo.set(func(f *fakeTenure) { f.members = []*pb.Member{{Id: "s", ClientAddr: "127.0.0.1:1"}} })
	c2, err := Dial(context.Background(), solo.addr, WithDiscovery())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := c2.FencedGet(ctx, "k"); err != nil || len(c2.all()) != 1 {
		t.Fatalf("a single member's list: %v, %d endpoints", err, len(c2.all()))
	}
}
