package fsm_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// Command builders, shared by every test file of the package.

func cmdCreate(owner string, ttlMs int64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: owner, TtlMs: ttlMs}}}
}

func cmdClose(sess uint64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_CloseSession{CloseSession: &fsmpb.CloseSession{Session: sess}}}
}

func cmdExpire(sess uint64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_ExpireSession{ExpireSession: &fsmpb.ExpireSession{Session: sess}}}
}

func cmdAcquire(sess uint64, name string, wait bool, delayMs int64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_Acquire{Acquire: &fsmpb.Acquire{Session: sess, Name: name, Wait: wait, LockDelayMs: delayMs}}}
}

func cmdCancel(sess uint64, name string, acqRev uint64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_CancelAcquire{CancelAcquire: &fsmpb.CancelAcquire{Session: sess, Name: name, AcquireRevision: acqRev}}}
}

func cmdRelease(sess uint64, name string, token uint64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_Release{Release: &fsmpb.Release{Session: sess, Name: name, Token: token}}}
}

func cmdEndDelay(name string, gen uint64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_EndLockDelay{EndLockDelay: &fsmpb.EndLockDelay{Name: name, Generation: gen}}}
}

func cmdPut(key string, value string, token uint64, opID string) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_FencedPut{FencedPut: &fsmpb.FencedPut{Key: key, Value: []byte(value), Token: token, OperationId: opID}}}
}

// fataler is the part of testing.TB that rapid.T also has.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// exportBytes is the canonical encoding of a state: equal states give equal
// bytes.
func exportBytes(tb fataler, s *fsm.State) []byte {
	tb.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(s.Export())
	if err != nil {
		tb.Fatalf("marshal export: %v", err)
	}
	return b
}

// machine wraps a State for the unit tests: every apply records its events
// and fails the test on an unexpected error.
type machine struct {
	tb testing.TB
	s  *fsm.State
}

func newMachine(tb testing.TB) *machine { return &machine{tb: tb, s: fsm.NewState()} }

// apply applies cmd and returns its result and events.
func (m *machine) apply(cmd *fsmpb.Command) (fsm.Result, []fsm.Event) {
	var evs []fsm.Event
	r := m.s.Apply(cmd, func(e fsm.Event) { evs = append(evs, e) })
	if r.Revision != m.s.Revision() {
		m.tb.Fatalf("result revision %d, state revision %d", r.Revision, m.s.Revision())
	}
	return r, evs
}

// ok applies cmd and fails the test if it returns an error.
func (m *machine) ok(cmd *fsmpb.Command) (fsm.Result, []fsm.Event) {
	m.tb.Helper()
	r, evs := m.apply(cmd)
	if r.Err != nil {
		m.tb.Fatalf("apply %v: %v", cmd, r.Err)
	}
	return r, evs
}

// failsWith applies cmd, wants err, and checks the state did not change.
func (m *machine) failsWith(cmd *fsmpb.Command, want error) fsm.Result {
	m.tb.Helper()
	before := exportBytes(m.tb, m.s)
	r, evs := m.apply(cmd)
	if !errors.Is(r.Err, want) {
		m.tb.Fatalf("apply %v: err %v, want %v", cmd, r.Err, want)
	}
	if len(evs) != 0 {
		m.tb.Fatalf("apply %v failed but emitted %v", cmd, evs)
	}
	if !bytes.Equal(before, exportBytes(m.tb, m.s)) {
		m.tb.Fatalf("apply %v failed but changed the state", cmd)
	}
	return r
}

func (m *machine) session(owner string) uint64 {
	m.tb.Helper()
	r, _ := m.ok(cmdCreate(owner, 10_000))
	return r.Session
}

// acquire grants name to sess or fails the test; it returns the token.
func (m *machine) acquire(sess uint64, name string, delayMs int64) uint64 {
	m.tb.Helper()
	r, _ := m.ok(cmdAcquire(sess, name, false, delayMs))
	if !r.Granted {
		m.tb.Fatalf("acquire %q by %d: not granted: %+v", name, sess, r)
	}
	return r.Token
}

// queue queues sess on name or fails the test; it returns the result.
func (m *machine) queue(sess uint64, name string, delayMs int64) fsm.Result {
	m.tb.Helper()
	r, _ := m.ok(cmdAcquire(sess, name, true, delayMs))
	if !r.Queued || r.Granted {
		m.tb.Fatalf("acquire %q by %d: not queued: %+v", name, sess, r)
	}
	return r
}

func (m *machine) holder(name string) *fsm.HolderView { return m.s.Lock(name).Holder }

// wantHolder fails the test unless name is held by (sess, token); sess 0
// means free.
func (m *machine) wantHolder(name string, sess, token uint64) {
	m.tb.Helper()
	h := m.holder(name)
	switch {
	case sess == 0 && h != nil:
		m.tb.Fatalf("lock %q held by %+v, want free", name, *h)
	case sess != 0 && h == nil:
		m.tb.Fatalf("lock %q free, want held by session %d", name, sess)
	case sess != 0 && (h.Session != sess || h.Token != token):
		m.tb.Fatalf("lock %q held by session %d token %d, want session %d token %d", name, h.Session, h.Token, sess, token)
	}
}

// grantedEvents returns the EventGranted events of evs.
func grantedEvents(evs []fsm.Event) []fsm.Event {
	var out []fsm.Event
	for _, e := range evs {
		if e.Kind == fsm.EventGranted {
			out = append(out, e)
		}
	}
	return out
}

func TestCreateSessionValidatesTTL(t *testing.T) {
	cases := []struct {
		name  string
		ttlMs int64
		owner string
		err   error
	}{
		{"zero", 0, "a", fsm.ErrInvalid},
		{"negative", -1, "a", fsm.ErrInvalid},
		{"just below 1s", fsm.MinSessionTTLMs - 1, "a", fsm.ErrInvalid},
		{"exactly 1s", fsm.MinSessionTTLMs, "a", nil},
		{"a minute", 60_000, "a", nil},
		{"exactly 1h", fsm.MaxSessionTTLMs, "a", nil},
		{"just above 1h", fsm.MaxSessionTTLMs + 1, "a", fsm.ErrInvalid},
		{"owner at limit", 10_000, string(bytes.Repeat([]byte("o"), fsm.MaxOwnerLen)), nil},
		{"owner too long", 10_000, string(bytes.Repeat([]byte("o"), fsm.MaxOwnerLen+1)), fsm.ErrInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := newMachine(t)
			if tc.err != nil {
				r := m.failsWith(cmdCreate(tc.owner, tc.ttlMs), tc.err)
				if r.Session != 0 || r.Revision != 0 {
					t.Fatalf("rejected create returned %+v", r)
				}
				return
			}
			r, evs := m.ok(cmdCreate(tc.owner, tc.ttlMs))
			if r.Session == 0 || r.Session != r.Revision {
				t.Fatalf("session id %d at revision %d", r.Session, r.Revision)
			}
			want := []fsm.Event{{Kind: fsm.EventSessionCreated, Session: r.Session, TTLMs: tc.ttlMs}}
			if fmt.Sprint(evs) != fmt.Sprint(want) {
				t.Fatalf("events %+v, want %+v", evs, want)
			}
			if ttl, ok := m.s.Session(r.Session); !ok || ttl != tc.ttlMs {
				t.Fatalf("Session(%d) = %d, %v", r.Session, ttl, ok)
			}
		})
	}
}

func TestAcquireValidation(t *testing.T) {
	m := newMachine(t)
	a := m.session("a")
	long := string(bytes.Repeat([]byte("n"), fsm.MaxNameLen+1))
	cases := []struct {
		name string
		cmd  *fsmpb.Command
		err  error
	}{
		{"empty name", cmdAcquire(a, "", true, 0), fsm.ErrInvalid},
		{"name too long", cmdAcquire(a, long, true, 0), fsm.ErrInvalid},
		{"name not utf-8", cmdAcquire(a, "\xff", true, 0), fsm.ErrInvalid},
		{"negative delay", cmdAcquire(a, "l", true, -1), fsm.ErrInvalid},
		{"delay too long", cmdAcquire(a, "l", true, fsm.MaxLockDelayMs+1), fsm.ErrInvalid},
		{"unknown session", cmdAcquire(a+100, "l", true, 0), fsm.ErrSessionNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m.tb = t
			m.failsWith(tc.cmd, tc.err)
		})
	}
}

func TestAcquireFreeLockGrantsTokenEqualToRevision(t *testing.T) {
	m := newMachine(t)
	a := m.session("a")
	r, evs := m.ok(cmdAcquire(a, "l", false, 0))
	if !r.Granted || r.Queued {
		t.Fatalf("acquire of a free lock: %+v", r)
	}
	if r.Token != r.Revision || r.AcquireRevision != r.Revision || r.Revision != a+1 {
		t.Fatalf("token %d, acquire revision %d, revision %d; want all %d", r.Token, r.AcquireRevision, r.Revision, a+1)
	}
	if len(evs) != 0 {
		t.Fatalf("a direct grant emitted %v; the proposer learns from the result", evs)
	}
	m.wantHolder("l", a, r.Token)
	if v := m.s.Sessions(); len(v) != 1 || fmt.Sprint(v[0].Held) != "[l]" {
		t.Fatalf("sessions %+v", v)
	}
	// A second acquire by the same session, try or wait, is refused.
	m.failsWith(cmdAcquire(a, "l", false, 0), fsm.ErrAlreadyHeld)
	m.failsWith(cmdAcquire(a, "l", true, 0), fsm.ErrAlreadyHeld)
}

func TestTryAcquireHeldLockIsBusy(t *testing.T) {
	m := newMachine(t)
	a, b := m.session("a"), m.session("b")
	tok := m.acquire(a, "l", 0)
	m.failsWith(cmdAcquire(b, "l", false, 0), fsm.ErrBusy)
	m.wantHolder("l", a, tok)

	// Still busy with a waiter queued behind the holder.
	c := m.session("c")
	m.queue(b, "l", 0)
	m.failsWith(cmdAcquire(c, "l", false, 0), fsm.ErrBusy)
}

func TestWaitingAcquireIsQueuedWithPosition(t *testing.T) {
	m := newMachine(t)
	h := m.session("h")
	m.acquire(h, "l", 0)
	var want []fsm.WaiterView
	for i := 1; i <= 4; i++ {
		s := m.session(fmt.Sprintf("w%d", i))
		r := m.queue(s, "l", 0)
		if r.Position != uint32(i) {
			t.Fatalf("waiter %d queued at position %d", i, r.Position)
		}
		if r.AcquireRevision != r.Revision || r.Token != 0 {
			t.Fatalf("queued result %+v", r)
		}
		want = append(want, fsm.WaiterView{Owner: fmt.Sprintf("w%d", i), Session: s, AcquireRevision: r.AcquireRevision})
		// A second wait by the same session is refused.
		m.failsWith(cmdAcquire(s, "l", true, 0), fsm.ErrAlreadyHeld)
	}
	if got := m.s.Lock("l").Waiters; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("waiters %+v, want %+v", got, want)
	}
}

func TestReleaseWithWrongHandleIsNotHeld(t *testing.T) {
	m := newMachine(t)
	a, b := m.session("a"), m.session("b")
	tokA := m.acquire(a, "l", 0)
	m.ok(cmdRelease(a, "l", tokA))
	tokB := m.acquire(b, "l", 0)

	cases := []struct {
		name  string
		sess  uint64
		lock  string
		token uint64
	}{
		// The stale handle: the previous holder's (session, token) must never
		// release the new holder.
		{"stale handle of previous holder", a, "l", tokA},
		{"right session wrong token", b, "l", tokA},
		{"right token wrong session", a, "l", tokB},
		{"token zero", b, "l", 0},
		{"future token", b, "l", tokB + 1},
		{"unknown session", 999, "l", tokB},
		{"unknown lock", b, "other", tokB},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m.tb = t
			m.failsWith(cmdRelease(tc.sess, tc.lock, tc.token), fsm.ErrNotHeld)
			m.wantHolder("l", b, tokB)
		})
	}
}

func TestRetriedReleaseIsHarmless(t *testing.T) {
	m := newMachine(t)
	a, b := m.session("a"), m.session("b")
	tok := m.acquire(a, "l", 0)
	m.ok(cmdRelease(a, "l", tok))
	m.wantHolder("l", 0, 0)
	// The retry of a release whose reply was lost: ErrNotHeld, no change.
	m.failsWith(cmdRelease(a, "l", tok), fsm.ErrNotHeld)

	// Also harmless once someone else holds the lock.
	tokB := m.acquire(b, "l", 0)
	m.failsWith(cmdRelease(a, "l", tok), fsm.ErrNotHeld)
	m.wantHolder("l", b, tokB)
}

func TestReleaseHandsOffToFirstWaiter(t *testing.T) {
	m := newMachine(t)
	a, b, c := m.session("a"), m.session("b"), m.session("c")
	tok := m.acquire(a, "l", 0)
	rb := m.queue(b, "l", 0)
	m.queue(c, "l", 0)

	r, evs := m.ok(cmdRelease(a, "l", tok))
	want := []fsm.Event{{Kind: fsm.EventGranted, Session: b, Name: "l", Token: r.Revision, AcquireRevision: rb.AcquireRevision}}
	if fmt.Sprint(evs) != fmt.Sprint(want) {
		t.Fatalf("release events %+v, want exactly %+v", evs, want)
	}
	if want[0].Token <= tok {
		t.Fatalf("hand-off token %d not above %d", want[0].Token, tok)
	}
	m.wantHolder("l", b, r.Revision)
	if w := m.s.Lock("l").Waiters; len(w) != 1 || w[0].Session != c {
		t.Fatalf("waiters after hand-off %+v, want only session %d", w, c)
	}
	if h := m.holder("l"); h.AcquireRevision != rb.AcquireRevision {
		t.Fatalf("holder acquire revision %d, want %d", h.AcquireRevision, rb.AcquireRevision)
	}
}

func TestEndSessionFreesLocksAndRemovesWaits(t *testing.T) {
	for _, expire := range []bool{false, true} {
		t.Run(fmt.Sprintf("expire=%v", expire), func(t *testing.T) {
			m := newMachine(t)
			a, b, c := m.session("a"), m.session("b"), m.session("c")
			tokA := m.acquire(a, "x", 0) // a holds x; b waits on x
			rbx := m.queue(b, "x", 0)
			tokC := m.acquire(c, "y", 0) // c holds y; a waits on y
			ray := m.queue(a, "y", 0)

			end := cmdClose(a)
			if expire {
				end = cmdExpire(a)
			}
			r, evs := m.ok(end)
			want := []fsm.Event{
				{Kind: fsm.EventWaitEnded, Session: a, Name: "y", AcquireRevision: ray.AcquireRevision, Expired: expire},
				{Kind: fsm.EventGranted, Session: b, Name: "x", Token: r.Revision, AcquireRevision: rbx.AcquireRevision},
				{Kind: fsm.EventSessionEnded, Session: a, Expired: expire},
			}
			if fmt.Sprint(evs) != fmt.Sprint(want) {
				t.Fatalf("events\n got %+v\nwant %+v", evs, want)
			}
			m.wantHolder("x", b, r.Revision)
			m.wantHolder("y", c, tokC)
			if w := m.s.Lock("y").Waiters; len(w) != 0 {
				t.Fatalf("y still has waiters %+v", w)
			}
			if _, ok := m.s.Session(a); ok {
				t.Fatal("ended session still exists")
			}
			for _, v := range m.s.Sessions() {
				if v.ID == a {
					t.Fatalf("Sessions() lists ended session %+v", v)
				}
			}
			hist := m.s.History("x")
			if len(hist) != 2 || hist[0].Token != tokA || hist[0].Ended != map[bool]string{false: "released", true: "expired"}[expire] {
				t.Fatalf("history of x %+v", hist)
			}
			// Everything the ended session does is refused.
			m.failsWith(cmdAcquire(a, "z", true, 0), fsm.ErrSessionNotFound)
			m.failsWith(cmdRelease(a, "x", tokA), fsm.ErrNotHeld)
			m.failsWith(cmdClose(a), fsm.ErrSessionNotFound)
			m.failsWith(cmdExpire(a), fsm.ErrSessionNotFound)
			m.failsWith(cmdCancel(a, "y", ray.AcquireRevision), fsm.ErrSessionNotFound)
		})
	}
}

func TestLockDelay(t *testing.T) {
	t.Run("expiry delays the hand-off until EndLockDelay", func(t *testing.T) {
		m := newMachine(t)
		a, b, c := m.session("a"), m.session("b"), m.session("c")
		m.acquire(a, "l", 5_000)
		rb := m.queue(b, "l", 0)

		exp, evs := m.ok(cmdExpire(a))
		gen := exp.Revision // a delay's generation is the revision that started it
		want := []fsm.Event{
			{Kind: fsm.EventDelayStarted, Name: "l", DelayMs: 5_000, Generation: gen},
			{Kind: fsm.EventSessionEnded, Session: a, Expired: true},
		}
		if fmt.Sprint(evs) != fmt.Sprint(want) {
			t.Fatalf("expire events\n got %+v\nwant %+v", evs, want)
		}
		m.wantHolder("l", 0, 0)
		if v := m.s.Lock("l"); !v.Delayed {
			t.Fatal("lock not delayed")
		}
		if d := m.s.Delays(); fmt.Sprint(d) != fmt.Sprint([]fsm.DelayView{{Name: "l", DelayMs: 5_000, Generation: gen}}) {
			t.Fatalf("delays %+v", d)
		}
		// While delayed nobody gets the lock: a try is busy, a wait queues.
		m.failsWith(cmdAcquire(c, "l", false, 0), fsm.ErrBusy)
		rc := m.queue(c, "l", 0)
		if rc.Position != 2 {
			t.Fatalf("queued at %d, want 2", rc.Position)
		}
		// A wrong generation is a harmless no-op.
		for _, wrong := range []uint64{0, gen - 1, gen + 1} {
			before := exportBytes(t, m.s)
			r, evs := m.apply(cmdEndDelay("l", wrong))
			if r.Err != nil || len(evs) != 0 || !bytes.Equal(before, exportBytes(t, m.s)) {
				t.Fatalf("EndLockDelay gen %d: %+v %v, state changed: %v", wrong, r, evs, !bytes.Equal(before, exportBytes(t, m.s)))
			}
		}
		m.wantHolder("l", 0, 0)
		// The right generation hands off to the first waiter.
		r, evs := m.ok(cmdEndDelay("l", gen))
		want = []fsm.Event{{Kind: fsm.EventGranted, Session: b, Name: "l", Token: r.Revision, AcquireRevision: rb.AcquireRevision}}
		if fmt.Sprint(evs) != fmt.Sprint(want) {
			t.Fatalf("end-delay events %+v, want %+v", evs, want)
		}
		m.wantHolder("l", b, r.Revision)
		if m.s.Lock("l").Delayed || len(m.s.Delays()) != 0 {
			t.Fatal("still delayed after EndLockDelay")
		}
		// Repeating it is a no-op.
		before := exportBytes(t, m.s)
		if r, evs := m.apply(cmdEndDelay("l", gen)); r.Err != nil || len(evs) != 0 || !bytes.Equal(before, exportBytes(t, m.s)) {
			t.Fatalf("repeated EndLockDelay: %+v %v", r, evs)
		}
	})

	t.Run("expiry without waiters frees the lock only after the delay", func(t *testing.T) {
		m := newMachine(t)
		a, b := m.session("a"), m.session("b")
		m.acquire(a, "l", 1_000)
		first, _ := m.ok(cmdExpire(a))
		m.failsWith(cmdAcquire(b, "l", false, 0), fsm.ErrBusy)
		_, evs := m.ok(cmdEndDelay("l", first.Revision))
		if len(evs) != 0 {
			t.Fatalf("events %v", evs)
		}
		if m.s.LockCount() != 0 {
			t.Fatal("a lock with no holder, waiter or delay is kept")
		}
		m.acquire(b, "l", 1_000)
		// A second expiry starts a new generation (even though the lock was
		// removed and created again in between); the first no longer ends it.
		second, _ := m.ok(cmdExpire(b))
		if d := m.s.Delays(); len(d) != 1 || d[0].Generation != second.Revision || second.Revision <= first.Revision {
			t.Fatalf("delays %+v", d)
		}
		m.apply(cmdEndDelay("l", first.Revision))
		if !m.s.Lock("l").Delayed {
			t.Fatal("stale generation ended the delay")
		}
	})

	explicit := []struct {
		name string
		end  func(m *machine, sess uint64, tok, acqRev uint64) *fsmpb.Command
	}{
		{"close", func(_ *machine, s, _, _ uint64) *fsmpb.Command { return cmdClose(s) }},
		{"release", func(_ *machine, s, tok, _ uint64) *fsmpb.Command { return cmdRelease(s, "l", tok) }},
		{"cancel", func(_ *machine, s, _, acq uint64) *fsmpb.Command { return cmdCancel(s, "l", acq) }},
	}
	for _, tc := range explicit {
		t.Run(tc.name+" does not delay", func(t *testing.T) {
			m := newMachine(t)
			a, b := m.session("a"), m.session("b")
			tok := m.acquire(a, "l", 5_000)
			rb := m.queue(b, "l", 0)
			r, evs := m.ok(tc.end(m, a, tok, tok))
			for _, e := range evs {
				if e.Kind == fsm.EventDelayStarted {
					t.Fatalf("explicit %s started a delay: %+v", tc.name, evs)
				}
			}
			if g := grantedEvents(evs); len(g) != 1 || g[0].Session != b || g[0].AcquireRevision != rb.AcquireRevision {
				t.Fatalf("events %+v, want one grant to %d", evs, b)
			}
			m.wantHolder("l", b, r.Revision)
			if m.s.Lock("l").Delayed {
				t.Fatal("lock delayed")
			}
		})
	}

	t.Run("expiry with zero delay hands off at once", func(t *testing.T) {
		m := newMachine(t)
		a, b := m.session("a"), m.session("b")
		m.acquire(a, "l", 0)
		m.queue(b, "l", 0)
		r, evs := m.ok(cmdExpire(a))
		if g := grantedEvents(evs); len(g) != 1 || g[0].Session != b {
			t.Fatalf("events %+v", evs)
		}
		m.wantHolder("l", b, r.Revision)
	})

	t.Run("the waiter's own delay applies once it holds", func(t *testing.T) {
		m := newMachine(t)
		a, b := m.session("a"), m.session("b")
		tok := m.acquire(a, "l", 0)
		m.queue(b, "l", 2_000)
		m.ok(cmdRelease(a, "l", tok))
		_, evs := m.ok(cmdExpire(b))
		if len(evs) != 2 || evs[0].Kind != fsm.EventDelayStarted || evs[0].DelayMs != 2_000 {
			t.Fatalf("events %+v", evs)
		}
	})
}

func TestCancelAcquire(t *testing.T) {
	t.Run("queued waiter is removed", func(t *testing.T) {
		m := newMachine(t)
		a, b, c := m.session("a"), m.session("b"), m.session("c")
		tok := m.acquire(a, "l", 0)
		rb := m.queue(b, "l", 0)
		rc := m.queue(c, "l", 0)

		m.failsWith(cmdCancel(b, "l", rb.AcquireRevision+1000), fsm.ErrNotHeld)
		m.failsWith(cmdCancel(c, "l", rb.AcquireRevision), fsm.ErrNotHeld) // someone else's acquisition
		r, evs := m.ok(cmdCancel(b, "l", rb.AcquireRevision))
		if len(evs) != 0 {
			t.Fatalf("cancel of a waiter emitted %v", evs)
		}
		if w := m.s.Lock("l").Waiters; len(w) != 1 || w[0].Session != c {
			t.Fatalf("waiters %+v", w)
		}
		if v := m.s.Sessions(); len(v[1].Waiting) != 0 {
			t.Fatalf("session b still waits: %+v", v[1])
		}
		if r.Revision != rc.Revision+1 {
			t.Fatalf("cancel did not bump the revision: %d after %d", r.Revision, rc.Revision)
		}
		// A retried cancel is harmless.
		m.failsWith(cmdCancel(b, "l", rb.AcquireRevision), fsm.ErrNotHeld)
		// The next release goes to c.
		_, evs = m.ok(cmdRelease(a, "l", tok))
		if g := grantedEvents(evs); len(g) != 1 || g[0].Session != c {
			t.Fatalf("events %+v", evs)
		}
	})

	t.Run("granted acquisition is released", func(t *testing.T) {
		m := newMachine(t)
		a, b := m.session("a"), m.session("b")
		tokA := m.acquire(a, "l", 0)
		rb := m.queue(b, "l", 0)
		// b's acquisition is granted before b's cancel is applied.
		m.ok(cmdRelease(a, "l", tokA))
		r, evs := m.ok(cmdCancel(b, "l", rb.AcquireRevision))
		if len(evs) != 0 {
			t.Fatalf("events %v", evs)
		}
		m.wantHolder("l", 0, 0)
		h := m.s.History("l")
		if last := h[len(h)-1]; last.Session != b || last.Ended != "released" || last.EndedRevision != r.Revision {
			t.Fatalf("history %+v", h)
		}
		// The granted lock of a cancelled acquisition goes to the next waiter.
		tokA = m.acquire(a, "l", 0)
		rb = m.queue(b, "l", 0)
		c := m.session("c")
		rc := m.queue(c, "l", 0)
		m.ok(cmdRelease(a, "l", tokA))
		_, evs = m.ok(cmdCancel(b, "l", rb.AcquireRevision))
		if g := grantedEvents(evs); len(g) != 1 || g[0].Session != c || g[0].AcquireRevision != rc.AcquireRevision {
			t.Fatalf("events %+v", evs)
		}
	})

	t.Run("a direct grant is identified by its token", func(t *testing.T) {
		m := newMachine(t)
		a := m.session("a")
		tok := m.acquire(a, "l", 0)
		m.failsWith(cmdCancel(a, "l", tok-1), fsm.ErrNotHeld)
		m.ok(cmdCancel(a, "l", tok))
		m.wantHolder("l", 0, 0)
		// An old acquisition never cancels a newer one of the same session.
		tok2 := m.acquire(a, "l", 0)
		m.failsWith(cmdCancel(a, "l", tok), fsm.ErrNotHeld)
		m.wantHolder("l", a, tok2)
	})

	t.Run("unknown session", func(t *testing.T) {
		m := newMachine(t)
		m.failsWith(cmdCancel(7, "l", 1), fsm.ErrSessionNotFound)
	})
}

func TestGrantHistory(t *testing.T) {
	m := newMachine(t)
	a, b := m.session("a"), m.session("b")

	tok1 := m.acquire(a, "l", 0)
	h := m.s.History("l")
	if len(h) != 1 || h[0] != (fsm.GrantView{Owner: "a", Session: a, Token: tok1, GrantedRevision: tok1, Ended: "held"}) {
		t.Fatalf("history %+v", h)
	}
	rel, _ := m.ok(cmdRelease(a, "l", tok1))
	tok2 := m.acquire(b, "l", 1_000)
	exp, _ := m.ok(cmdExpire(b))
	want := []fsm.GrantView{
		{Owner: "a", Session: a, Token: tok1, GrantedRevision: tok1, Ended: "released", EndedRevision: rel.Revision},
		{Owner: "b", Session: b, Token: tok2, GrantedRevision: tok2, Ended: "expired", EndedRevision: exp.Revision},
	}
	if got := m.s.History("l"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("history\n got %+v\nwant %+v", got, want)
	}
	if m.s.History("never") != nil {
		t.Fatal("history of an unknown lock")
	}

	// Bounded by HistoryLimit, keeping the newest.
	m.ok(cmdEndDelay("l", exp.Revision))
	var toks []uint64
	for i := 0; i < fsm.HistoryLimit+5; i++ {
		tok := m.acquire(a, "l", 0)
		toks = append(toks, tok)
		if i < fsm.HistoryLimit+4 {
			m.ok(cmdRelease(a, "l", tok))
		}
	}
	h = m.s.History("l")
	if len(h) != fsm.HistoryLimit {
		t.Fatalf("history has %d records, want %d", len(h), fsm.HistoryLimit)
	}
	for i, rec := range h {
		wantTok := toks[len(toks)-fsm.HistoryLimit+i]
		wantEnded := "released"
		if i == len(h)-1 {
			wantEnded = "held"
		}
		if rec.Token != wantTok || rec.Ended != wantEnded {
			t.Fatalf("record %d = %+v, want token %d ended %q", i, rec, wantTok, wantEnded)
		}
	}
	// Ending the current grant still finds its record after trimming.
	m.ok(cmdClose(a))
	if h = m.s.History("l"); h[len(h)-1].Ended != "released" {
		t.Fatalf("last record %+v", h[len(h)-1])
	}
}

func TestFencedPut(t *testing.T) {
	t.Run("validation", func(t *testing.T) {
		m := newMachine(t)
		cases := []struct {
			name string
			cmd  *fsmpb.Command
		}{
			{"token zero", cmdPut("k", "v", 0, "")},
			{"token zero with op id", cmdPut("k", "v", 0, "op")},
			{"empty key", cmdPut("", "v", 1, "")},
			{"value too large", cmdPut("k", string(make([]byte, fsm.MaxValueLen+1)), 1, "")},
			{"op id too long", cmdPut("k", "v", 1, string(bytes.Repeat([]byte("o"), fsm.MaxOpIDLen+1)))},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				m.tb = t
				m.failsWith(tc.cmd, fsm.ErrInvalid)
				if m.s.Register("k").Found {
					t.Fatal("rejected put created the register")
				}
			})
		}
	})

	// Every token below is issued: the state starts at revision 1000.
	t.Run("token order", func(t *testing.T) {
		m := newMachineAt(t, 1000)
		steps := []struct {
			token    uint64
			value    string
			out      fsm.PutOutcome
			accepted uint64
			stored   string
		}{
			{5, "a", fsm.PutAccepted, 5, "a"},
			{5, "b", fsm.PutAccepted, 5, "b"}, // equal token: the same holder writes again
			{7, "c", fsm.PutAccepted, 7, "c"},
			{6, "d", fsm.PutStale, 7, "c"},
			{1, "e", fsm.PutStale, 7, "c"},
			{8, "f", fsm.PutAccepted, 8, "f"},
		}
		for i, st := range steps {
			before := m.s.Revision()
			r, _ := m.ok(cmdPut("k", st.value, st.token, ""))
			if r.Put != st.out || r.AcceptedToken != st.accepted || r.Duplicate {
				t.Fatalf("step %d put token %d: %+v, want %v accepted %d", i, st.token, r, st.out, st.accepted)
			}
			reg := m.s.Register("k")
			if !reg.Found || string(reg.Value) != st.stored || reg.Token != st.accepted {
				t.Fatalf("step %d register %+v", i, reg)
			}
			if st.out == fsm.PutAccepted && (r.Revision != before+1 || reg.ModRevision != r.Revision) {
				t.Fatalf("step %d accepted put: revision %d mod %d, before %d", i, r.Revision, reg.ModRevision, before)
			}
			if st.out == fsm.PutStale && r.Revision != before {
				t.Fatalf("step %d stale put without op id changed the revision", i)
			}
		}
		if m.s.Register("other").Found {
			t.Fatal("unknown register found")
		}
	})

	t.Run("the stored value is a copy", func(t *testing.T) {
		m := newMachineAt(t, 1000)
		cmd := cmdPut("k", "abc", 1, "")
		m.ok(cmd)
		cmd.GetFencedPut().Value[0] = 'X'
		v := m.s.Register("k")
		v.Value[1] = 'Y'
		if got := string(m.s.Register("k").Value); got != "abc" {
			t.Fatalf("register value %q", got)
		}
	})

	t.Run("duplicate operation", func(t *testing.T) {
		m := newMachineAt(t, 1000)
		first, _ := m.ok(cmdPut("k", "one", 5, "op-1"))
		if first.Put != fsm.PutAccepted || first.Duplicate {
			t.Fatalf("first put %+v", first)
		}
		snap := exportBytes(t, m.s)
		// The replay, even with another value and token, changes nothing.
		for _, replay := range []*fsmpb.Command{
			cmdPut("k", "one", 5, "op-1"),
			cmdPut("k", "two", 9, "op-1"),
			cmdPut("k", "three", 1, "op-1"),
		} {
			r, _ := m.ok(replay)
			if !r.Duplicate || r.Put != fsm.PutAccepted || r.AcceptedToken != 5 || r.Revision != first.Revision {
				t.Fatalf("replay %v: %+v", replay, r)
			}
			if !bytes.Equal(snap, exportBytes(t, m.s)) {
				t.Fatalf("replay %v changed the state", replay)
			}
		}
		// A stale first result is replayed as stale, even with a token that
		// would now be accepted.
		m.ok(cmdPut("k", "new", 9, "op-2"))
		stale, _ := m.ok(cmdPut("k", "old", 6, "op-3"))
		if stale.Put != fsm.PutStale || stale.AcceptedToken != 9 {
			t.Fatalf("stale put %+v", stale)
		}
		r, _ := m.ok(cmdPut("k", "old", 100, "op-3"))
		if !r.Duplicate || r.Put != fsm.PutStale || r.AcceptedToken != 9 {
			t.Fatalf("replay of stale op: %+v", r)
		}
		if got := m.s.Register("k"); string(got.Value) != "new" || got.Token != 9 {
			t.Fatalf("register %+v", got)
		}
		// Operation ids are per register.
		r, _ = m.ok(cmdPut("other", "x", 1, "op-1"))
		if r.Duplicate || r.Put != fsm.PutAccepted {
			t.Fatalf("op id of another register: %+v", r)
		}
	})

	t.Run("op memory is bounded", func(t *testing.T) {
		m := newMachineAt(t, 1000)
		m.ok(cmdPut("k", "v0", 1, "op-0"))
		for i := 1; i < fsm.OpMemory; i++ {
			m.ok(cmdPut("k", fmt.Sprint("v", i), 1, fmt.Sprint("op-", i)))
		}
		// op-0 is the oldest of exactly OpMemory remembered ids: still a duplicate.
		if r, _ := m.ok(cmdPut("k", "again", 1, "op-0")); !r.Duplicate {
			t.Fatalf("op-0 forgotten too early: %+v", r)
		}
		// One more operation evicts op-0; op-1 is still remembered.
		m.ok(cmdPut("k", "vN", 1, fmt.Sprint("op-", fsm.OpMemory)))
		if r, _ := m.ok(cmdPut("k", "again", 1, "op-1")); !r.Duplicate {
			t.Fatalf("op-1 forgotten too early: %+v", r)
		}
		r, _ := m.ok(cmdPut("k", "again", 1, "op-0"))
		if r.Duplicate || r.Put != fsm.PutAccepted || string(m.s.Register("k").Value) != "again" {
			t.Fatalf("op-0 older than OpMemory operations was not applied as new: %+v", r)
		}
		ops := m.s.Export().GetRegisters()[0].GetOps()
		if len(ops) != fsm.OpMemory {
			t.Fatalf("%d ops remembered, want %d", len(ops), fsm.OpMemory)
		}
		// Oldest first: op-2 .. op-OpMemory, then op-0 again.
		if ops[0].GetOperationId() != "op-2" || ops[len(ops)-1].GetOperationId() != "op-0" {
			t.Fatalf("ops run from %q to %q", ops[0].GetOperationId(), ops[len(ops)-1].GetOperationId())
		}
	})

	t.Run("puts without op id are never duplicates", func(t *testing.T) {
		m := newMachineAt(t, 1000)
		m.ok(cmdPut("k", "a", 3, ""))
		r, _ := m.ok(cmdPut("k", "b", 3, ""))
		if r.Duplicate || string(m.s.Register("k").Value) != "b" {
			t.Fatalf("%+v", r)
		}
	})
}

// TestUnknownCommandStops: a command this build does not know (no
// operation it knows, as a newer release's command decodes) is a
// FormatError, never an ErrInvalid that leaves the revision and lets the
// log go on (version.go).
func TestUnknownCommandStops(t *testing.T) {
	m := newMachine(t)
	r := m.s.Apply(&fsmpb.Command{}, nil)
	var fe *fsm.FormatError
	if !errors.As(r.Err, &fe) || errors.Is(r.Err, fsm.ErrInvalid) {
		t.Fatalf("apply of an unknown command: %v, want a FormatError", r.Err)
	}
}

func TestTokensIncreaseAcrossLocks(t *testing.T) {
	m := newMachine(t)
	a, b := m.session("a"), m.session("b")
	var last uint64
	for i := 0; i < 10; i++ {
		for _, name := range []string{"x", "y"} {
			for _, s := range []uint64{a, b} {
				tok := m.acquire(s, name+fmt.Sprint(s), 0)
				if tok <= last {
					t.Fatalf("token %d after %d", tok, last)
				}
				last = tok
				m.ok(cmdRelease(s, name+fmt.Sprint(s), tok))
			}
		}
	}
}

// TestBatchEqualsCommandsOneByOne: a batch entry applies its commands in
// order with the same results, events and final state as separate entries.
func TestBatchEqualsCommandsOneByOne(t *testing.T) {
	cmds := []*fsmpb.Command{
		cmdCreate("a", 5000), cmdCreate("b", 5000),
		cmdAcquire(1, "l", true, 0), cmdAcquire(2, "l", true, 0),
		cmdRelease(1, "l", 3), cmdRelease(1, "l", 3), // second is stale
		cmdPut("k", "v", 4, "op"), cmdPut("k", "w", 2, "op2"),
	}
	one := fsm.NewState()
	var oneEvents []fsm.Event
	var oneResults []fsm.Result
	for _, c := range cmds {
		oneResults = append(oneResults, one.Apply(c, func(e fsm.Event) { oneEvents = append(oneEvents, e) }))
	}
	batched := fsm.NewState()
	var batchEvents []fsm.Event
	r := batched.Apply(&fsmpb.Command{Op: &fsmpb.Command_Batch{Batch: &fsmpb.Batch{Commands: cmds}}}, func(e fsm.Event) { batchEvents = append(batchEvents, e) })
	if len(r.Batch) != len(cmds) {
		t.Fatalf("%d results for %d commands", len(r.Batch), len(cmds))
	}
	for i := range cmds {
		if !sameResult(r.Batch[i], oneResults[i]) {
			t.Fatalf("command %d: batched %+v, alone %+v", i, r.Batch[i], oneResults[i])
		}
	}
	if fmt.Sprint(batchEvents) != fmt.Sprint(oneEvents) {
		t.Fatalf("events differ:\n%v\n%v", batchEvents, oneEvents)
	}
	if !bytes.Equal(exportBytes(t, one), exportBytes(t, batched)) {
		t.Fatal("state differs")
	}
	nested := batched.Apply(&fsmpb.Command{Op: &fsmpb.Command_Batch{Batch: &fsmpb.Batch{Commands: []*fsmpb.Command{
		{Op: &fsmpb.Command_Batch{Batch: &fsmpb.Batch{}}},
	}}}}, nil)
	if !errors.Is(nested.Batch[0].Err, fsm.ErrInvalid) {
		t.Fatalf("nested batch: %v", nested.Batch[0].Err)
	}
}

// TestResumeReattachesWithoutChange: an acquire with resume answers the
// session's existing grant or queue place and changes nothing.
func TestResumeReattachesWithoutChange(t *testing.T) {
	m := newMachine(t)
	a, b, c := m.session("a"), m.session("b"), m.session("c")
	token := m.acquire(a, "l", 0)
	qb := m.queue(b, "l", 0)
	qc := m.queue(c, "l", 0)
	rev := m.s.Revision()
	resume := func(sess uint64) fsm.Result {
		return m.s.Apply(&fsmpb.Command{Op: &fsmpb.Command_Acquire{Acquire: &fsmpb.Acquire{Session: sess, Name: "l", Wait: true, Resume: true}}}, nil)
	}
	if r := resume(a); r.Err != nil || !r.Granted || r.Token != token {
		t.Fatalf("resume by holder: %+v, want grant %d", r, token)
	}
	if r := resume(c); r.Err != nil || !r.Queued || r.Position != 2 || r.AcquireRevision != qc.AcquireRevision {
		t.Fatalf("resume by second waiter: %+v, want position 2 rev %d", r, qc.AcquireRevision)
	}
	if r := resume(b); r.Err != nil || r.Position != 1 || r.AcquireRevision != qb.AcquireRevision {
		t.Fatalf("resume by first waiter: %+v", r)
	}
	if m.s.Revision() != rev {
		t.Fatal("resume changed the state")
	}
}
