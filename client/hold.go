package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	pb "github.com/tenure-io/tenure/api/tenurepb"
)

// State is where a hold is in its ownership life cycle.
type State int

// Ownership states. A hold moves only along the edges of transitions:
//
//	acquiring → held | suspect | lost | released
//	held      → suspect | lost | released
//	suspect   → held | lost | released
//
// Lost and Released are terminal.
const (
	// Acquiring: the acquire is in flight (sent, or waiting in line on
	// the server); nothing is held yet, the Token is 0 and the Context is
	// cancelled. A hold is seen in this state only through OnAcquiring:
	// Lock returns it once granted. It moves to Held (or Suspect, if its
	// session is suspect when the grant arrives), to Released when the
	// acquire ends without a grant (refused, or withdrawn when its
	// context ended), or to Lost with its session.
	Acquiring State = iota
	// Held: the hold is confirmed until the session's safe deadline.
	Held
	// Suspect: ownership can no longer be proven (a renewal was not
	// confirmed in time, or the connection broke). Stop the work: the
	// hold's Context is already cancelled.
	Suspect
	// Lost: the hold is gone for good; its token must never be used again.
	Lost
	// Released: the hold was given up by Unlock or Session.Close.
	Released
)

// transitions is the hold's state machine, the one documented above and in
// docs/architecture.md: for each state, the states it may move to.
// setState refuses every other move.
var transitions = [...][]State{
	Acquiring: {Held, Suspect, Lost, Released},
	Held:      {Suspect, Lost, Released},
	Suspect:   {Held, Lost, Released},
	Lost:      nil,
	Released:  nil,
}

// canMove reports whether a hold in state from may move to state to.
func canMove(from, to State) bool {
	if from < 0 || int(from) >= len(transitions) {
		return false
	}
	for _, t := range transitions[from] {
		if t == to {
			return true
		}
	}
	return false
}

// terminal reports whether no state follows s.
func (s State) terminal() bool { return s == Lost || s == Released }

func (s State) String() string {
	switch s {
	case Acquiring:
		return "acquiring"
	case Held:
		return "held"
	case Suspect:
		return "suspect"
	case Lost:
		return "lost"
	case Released:
		return "released"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Mutex is a named lock used through a session. A Mutex is a cheap handle;
// it is safe for concurrent use, but one session holds or waits for a name
// at most once at a time (a second Lock returns ErrAlreadyHeld).
type Mutex struct {
	s       *Session
	name    string
	delay   time.Duration
	permits uint32
	proof   bool // the client's WithFenceProofs
}

// MutexOption configures a Mutex.
type MutexOption func(*Mutex) error

// WithLockDelay: if a grant of this mutex ends because its session
// expired (not on Unlock), the server does not grant the lock again until d
// has passed (0..1m; default 0). A safety net for resources that cannot
// check fencing tokens; it lowers the odds of overlap, it does not remove
// them.
func WithLockDelay(d time.Duration) MutexOption {
	return func(m *Mutex) error {
		if d < 0 || d > time.Minute {
			return fmt.Errorf("%w: lock delay %v is outside 0..1m", ErrInvalid, d)
		}
		m.delay = d
		return nil
	}
}

// WithPermits makes the lock a semaphore: up to n sessions hold it at once
// (1..10000; default 1, a mutex). The first acquire of a name fixes its
// number of permits; an acquire naming another number fails with
// ErrInvalid. Every permit's grant has its own fencing token.
func WithPermits(n int) MutexOption {
	return func(m *Mutex) error {
		if n < 1 || n > 10000 {
			return fmt.Errorf("%w: %d permits is outside 1..10000", ErrInvalid, n)
		}
		m.permits = uint32(n)
		return nil
	}
}

// Semaphore returns a handle on the semaphore called name with n permits:
// Lock takes one permit (waiting in FIFO order), and the hold's Unlock
// gives it back. It is Mutex with WithPermits(n).
func (s *Session) Semaphore(name string, n int, opts ...MutexOption) (*Mutex, error) {
	return s.Mutex(name, append([]MutexOption{WithPermits(n)}, opts...)...)
}

// Mutex returns a handle on the lock called name.
func (s *Session) Mutex(name string, opts ...MutexOption) (*Mutex, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: lock name must not be empty", ErrInvalid)
	}
	m := &Mutex{s: s, name: name, proof: s.c.proofs}
	for _, o := range opts {
		if err := o(m); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Name is the lock's name.
func (m *Mutex) Name() string { return m.name }

// LockOption configures one Lock call.
type LockOption func(*lockCall)

type lockCall struct {
	onQueued    func(position int)
	onAcquiring func(*Hold)
	shared      bool
	election    bool
	value       []byte
}

// OnQueued calls fn with the 1-based queue position when the request has
// to wait. Without it the server is asked not to send the position at all
// (a quiet acquire): one message less per wait.
func OnQueued(fn func(position int)) LockOption {
	return func(c *lockCall) { c.onQueued = fn }
}

// OnAcquiring calls fn, before the acquire is sent, with the hold it is
// for: in state Acquiring until the grant, when Lock returns it Held (or
// Suspect); it ends Released when the acquire ends without a grant, and
// Lost with its session. Its Changes report each move. fn runs on the
// caller's goroutine and must not block.
func OnAcquiring(fn func(h *Hold)) LockOption {
	return func(c *lockCall) { c.onAcquiring = fn }
}

// Lock waits, in FIFO order, until the lock is granted or ctx ends. On
// success the hold carries a fencing token larger than every token granted
// before it. If ctx ends first the queued request is withdrawn (and, if it
// was granted meanwhile, released).
func (m *Mutex) Lock(ctx context.Context, opts ...LockOption) (*Hold, error) {
	var lc lockCall
	for _, o := range opts {
		o(&lc)
	}
	return m.acquire(ctx, true, lc)
}

// TryLock takes the lock if it is free and returns ErrLocked otherwise.
func (m *Mutex) TryLock(ctx context.Context) (*Hold, error) {
	return m.acquire(ctx, false, lockCall{})
}

// RLock waits, in FIFO order, until the lock is granted as a reader: many
// readers hold it at once, never together with a writer (Lock). A reader
// arriving behind a waiting writer waits for it, so writers are not
// starved. Only for locks of one permit.
func (m *Mutex) RLock(ctx context.Context, opts ...LockOption) (*Hold, error) {
	lc := lockCall{shared: true}
	for _, o := range opts {
		o(&lc)
	}
	return m.acquire(ctx, true, lc)
}

// TryRLock takes the lock as a reader if that is possible at once, and
// returns ErrLocked otherwise.
func (m *Mutex) TryRLock(ctx context.Context) (*Hold, error) {
	return m.acquire(ctx, false, lockCall{shared: true})
}

func (m *Mutex) request(wait bool, lc lockCall) *pb.SessionRequest {
	// Every acquire is sent with resume: a re-sent request (after a broken
	// connection or a leader change) finds the session's place in line or
	// its grant instead of queueing again. The session itself makes sure a
	// name is acquired once at a time (reserve). Without an OnQueued
	// callback nothing needs the queue position: the request is quiet.
	return &pb.SessionRequest{Op: &pb.SessionRequest_Acquire{Acquire: &pb.AcquireLock{Name: m.name, Wait: wait, LockDelayMs: m.delay.Milliseconds(), Resume: true, Permits: m.permits, Shared: lc.shared, Election: lc.election, Value: lc.value, Quiet: lc.onQueued == nil, Proof: m.proof}}}
}

// retryable reports whether a request failed only because its node could
// not serve it (not the leader, or it lost leadership while committing):
// re-sent with resume, the request is safe to repeat on the new leader.
func retryable(err error) bool {
	return errors.Is(err, errDisconnected) || errors.Is(err, ErrUnavailable) || errors.Is(err, ErrUnknownOutcome)
}

// acquire reserves the name for this session (one acquisition of a name
// at a time), then asks until the server answers (Session.do). The name
// stays reserved while the hold lives, or, when ctx ends while the server
// may hold a place in line, until withdraw has settled that in the
// background. The hold exists, Acquiring, from the first send.
func (m *Mutex) acquire(ctx context.Context, wait bool, lc lockCall) (*Hold, error) {
	s := m.s
	if !s.reserve(m.name) {
		return nil, ErrAlreadyHeld
	}
	h, err := s.newHold(m.name)
	if err != nil {
		s.unreserve(m.name)
		return nil, err
	}
	if lc.onAcquiring != nil {
		lc.onAcquiring(h)
	}
	x := exchange{keep: true}
	if lc.onQueued != nil {
		x.interim = func(r *pb.SessionResponse) { lc.onQueued(int(r.GetQueued().GetPosition())) }
	}
	o, err := s.do(ctx, m.request(wait, lc), x)
	if err == nil {
		if g := o.resp.GetGranted(); g != nil {
			h.granted(g.GetToken(), g.GetProof())
			return h, nil
		}
		err = fmt.Errorf("%w: unexpected answer to an acquire", ErrUnknownOutcome)
		if e := o.resp.GetError(); e != nil {
			err = fromProto(e)
		}
	}
	h.end(Released, err, false)
	if o.pending != nil || (o.sent > 0 && ctx.Err() != nil && errors.Is(err, ctx.Err())) {
		// The server may still hold our place in line (or a grant):
		// withdraw it before the name is free again.
		s.goBG(func() { m.withdraw(o.pending) })
		return nil, ctx.Err()
	}
	s.unreserve(m.name)
	return nil, err
}

// withdraw settles an acquisition given up on, then frees the name: it
// cancels c (the request still pending, if any) and, until that is
// settled, re-attaches to this session's acquisition of the lock (if any)
// and cancels it. The server answers every acquire exactly once more
// (granted or cancelled); a grant that raced with the cancellation is
// released, so no lock is left held by nobody. It gives up when the
// session is over (the server dropped everything then).
func (m *Mutex) withdraw(c *call) {
	s := m.s
	defer s.unreserve(m.name)
	for {
		if c != nil && m.cancelAndSettle(c) {
			return
		}
		var err error
		// resume finds the acquisition, whatever its kind
		if c, err = s.send(s.ctx, m.request(true, lockCall{})); err != nil {
			return
		}
	}
}

// cancelAndSettle sends Cancel for c and waits for the acquire's final
// answer, releasing a grant. It reports whether the acquisition is
// settled: withdrawn, released, or gone with the session. It is not when
// the stream broke first, when the node answered that it could not commit
// the withdrawal (not the leader, outcome unknown), or when no answer came
// within sessionTimeout; the stream is then given up (the session moves
// to a node that answers), and the caller withdraws again.
func (m *Mutex) cancelAndSettle(c *call) bool {
	s := m.s
	defer s.finish(c)
	if err := c.st.send(&pb.SessionRequest{Op: &pb.SessionRequest_Cancel{Cancel: &pb.CancelRequest{RequestId: c.id}}}); err != nil {
		return false
	}
	t := s.clk.NewTimer(sessionTimeout)
	defer t.Stop()
	for {
		select {
		case r := <-c.ch:
			if r.err != nil {
				return !errors.Is(r.err, errDisconnected)
			}
			if g := r.resp.GetGranted(); g != nil {
				// A grant that raced with the cancellation: release it.
				// If that may not have happened, the next attempt finds
				// the grant again (or nothing).
				ctx, cancel := context.WithTimeout(s.ctx, sessionTimeout)
				o, err := s.do(ctx, &pb.SessionRequest{Op: &pb.SessionRequest_Release{Release: &pb.ReleaseLock{Name: m.name, Token: g.GetToken()}}}, exchange{})
				cancel()
				if err == nil && o.resp.GetError() != nil {
					err = fromProto(o.resp.GetError())
				}
				return err == nil || !retryable(err) // ErrNotHeld: released already
			}
			if r.resp.GetQueued() != nil {
				continue
			}
			e := r.resp.GetError()
			if e.GetReason() == pb.ErrorReason_ERROR_REASON_CANCELLED {
				return true // the server committed the withdrawal
			}
			if e != nil && retryable(fromProto(e)) {
				s.streamBroken(c.st) // this node cannot commit it: find the leader
				return false
			}
			return true
		case <-t.C():
			s.streamBroken(c.st)
			return false
		case <-s.ctx.Done():
			return true
		}
	}
}

// Hold is one grant of a lock: the proof of ownership to pass to the
// resource (Token) and the context to run the work under (Context). Its
// State moves only along the documented transitions. It is safe for
// concurrent use.
type Hold struct {
	s    *Session
	name string

	// mu guards the fields below. Lock order: Session.mu before Hold.mu.
	mu     sync.Mutex
	token  uint64 // set once, at the grant
	proof  string // set once, at the grant
	state  State
	err    error
	ctx    context.Context
	cancel context.CancelFunc
	subs   []chan State
	done   chan struct{}
}

// maxLag is how many changes a Changes receiver may fall behind before its
// channel is closed (see Changes).
const maxLag = 16

// newHold makes the hold of an acquire about to be sent: Acquiring, in
// the session's holds (so that it ends with the session), with a
// cancelled Context. It fails with the session's error when the session
// is over.
func (s *Session) newHold(name string) (*Hold, error) {
	h := &Hold{s: s, name: name, state: Acquiring, done: make(chan struct{})}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	h.cancel() // nothing is held yet
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state >= sessLost {
		return nil, s.err
	}
	s.holds[h] = struct{}{}
	return h, nil
}

// granted moves an acquiring hold to the state its session's grant gives
// it: Held, or Suspect while the session is suspect (Lost if the session
// ended meanwhile: the hold already is).
func (h *Hold) granted(token uint64, proof string) {
	s := h.s
	s.mu.Lock()
	defer s.mu.Unlock()
	h.mu.Lock()
	h.token, h.proof = token, proof
	h.mu.Unlock()
	switch s.state {
	case sessAlive:
		h.setState(Held, nil)
	case sessSuspect:
		h.setState(Suspect, nil)
	}
}

// sessionMoved moves the hold with its session (Session.setStateLocked):
// a hold still acquiring holds nothing, so only the session's end reaches
// it.
func (h *Hold) sessionMoved(st State, err error) {
	h.mu.Lock()
	acquiring := h.state == Acquiring
	h.mu.Unlock()
	if acquiring && !st.terminal() {
		return
	}
	h.setState(st, err)
}

// Name is the lock's name.
func (h *Hold) Name() string { return h.name }

// Token is the fencing token of this grant: pass it with every effect and
// let the resource reject anything lower than what it already accepted.
// It is 0 while the hold is Acquiring.
func (h *Hold) Token() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.token
}

// Proof is the cluster's signature of this grant (package fenceproof):
// one URL-safe base64 string that a resource with the cluster's public
// keys verifies offline, so that it can tell this token from one nobody
// was granted (see docs/fencing.md). It is empty if the server signed
// none (a cluster without a signing key yet), or while the hold is
// Acquiring.
func (h *Hold) Proof() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.proof
}

// SessionID is the lease id of the grant.
func (h *Hold) SessionID() uint64 { return h.s.id }

// State is the hold's current ownership state.
func (h *Hold) State() State {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.state
}

// Err is why the hold is Lost (nil otherwise).
func (h *Hold) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// Context is cancelled the moment the hold stops being Held (Suspect, Lost
// or Released). After Suspect → Held a new context is returned: work
// stopped under the old one must start again under the new one.
func (h *Hold) Context() context.Context {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ctx
}

// Done is closed when the hold reaches Lost or Released.
func (h *Hold) Done() <-chan struct{} { return h.done }

// Changes returns a channel that receives every later state change, in
// order, and is closed after the terminal state (then Err tells why).
// Nothing is dropped: a receiver that falls 16 changes behind gets every
// change up to that point, and then its channel is closed although the
// hold lives on (State is then neither Lost nor Released): the overflow is
// reported by that close, and Changes may be called again.
func (h *Hold) Changes() <-chan State {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := make(chan State, maxLag)
	if h.state.terminal() {
		ch <- h.state
		close(ch)
		return ch
	}
	h.subs = append(h.subs, ch)
	return ch
}

// Progress tells the session's progress watchdog that work advances.
func (h *Hold) Progress() { h.s.Progress() }

// setState moves the hold to st if transitions allows it, and reports
// whether it moved; any other move (from a terminal state, back to
// Acquiring, or to the state it is in) changes nothing.
func (h *Hold) setState(st State, err error) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !canMove(h.state, st) {
		return false
	}
	if h.state == Held {
		h.cancel()
	}
	if st == Held {
		h.ctx, h.cancel = context.WithCancel(context.Background())
	}
	h.state = st
	if st == Lost {
		h.err = err
		if h.err == nil {
			h.err = ErrSessionExpired
		}
	}
	// Only this goroutine sends (under mu) and receivers only take, so
	// a channel with room keeps it: the send never blocks. A channel
	// whose receiver is maxLag behind takes this change in its last slot
	// and is closed: the overflow is reported, nothing is dropped.
	subs := h.subs[:0]
	for _, ch := range h.subs {
		ch <- st
		if st.terminal() || len(ch) == cap(ch) {
			close(ch)
			continue
		}
		subs = append(subs, ch)
	}
	clear(h.subs[len(subs):])
	h.subs = subs
	if st.terminal() {
		h.cancel()
		close(h.done)
	}
	return true
}

// Unlock releases the grant. It returns ErrNotHeld if the grant had
// already ended (the hold is then Lost), or while the hold is still
// Acquiring (nothing changes); a retried Unlock after success returns
// nil. It never releases a later holder: the server checks the
// exact (session, token) handle.
func (h *Hold) Unlock(ctx context.Context) error {
	h.mu.Lock()
	switch h.state {
	case Released:
		h.mu.Unlock()
		return nil
	case Lost:
		err := h.err
		h.mu.Unlock()
		return fmt.Errorf("%w: %v", ErrNotHeld, err)
	case Acquiring:
		h.mu.Unlock()
		return fmt.Errorf("%w: the acquire is still in flight (end its context to withdraw it)", ErrNotHeld)
	}
	token := h.token
	h.mu.Unlock()
	o, err := h.s.do(ctx, &pb.SessionRequest{Op: &pb.SessionRequest_Release{Release: &pb.ReleaseLock{Name: h.name, Token: token}}}, exchange{})
	if err != nil {
		return err
	}
	if e := o.resp.GetError(); e != nil {
		err := fromProto(e)
		if errors.Is(err, ErrNotHeld) && o.sent > 1 {
			// An earlier attempt reached the server before its stream
			// broke: the grant is gone either way.
			err = nil
		}
		if err != nil {
			h.end(Lost, err, true)
			return err
		}
	}
	h.end(Released, nil, true)
	return nil
}

// end takes the hold out of its session and moves it to st (terminal);
// free also frees its lock's name for the session's next acquire.
func (h *Hold) end(st State, err error, free bool) {
	h.s.mu.Lock()
	delete(h.s.holds, h)
	if free {
		delete(h.s.inUse, h.name)
	}
	h.s.mu.Unlock()
	h.setState(st, err)
}
