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

// Ownership states. Acquiring → Held → Suspect → (Held | Lost); Held →
// Released. Lost and Released are terminal.
const (
	// Acquiring: the request is queued on the server.
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
	onQueued func(position int)
	shared   bool
	election bool
	value    []byte
}

// OnQueued calls fn with the 1-based queue position when the request has
// to wait. Without it the server is asked not to send the position at all
// (a quiet acquire): one message less per wait.
func OnQueued(fn func(position int)) LockOption {
	return func(c *lockCall) { c.onQueued = fn }
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
// at a time), then asks until the server answers. The name stays reserved
// while the hold lives, or, when ctx ends while the server may hold a
// place in line, until withdraw has settled that in the background.
func (m *Mutex) acquire(ctx context.Context, wait bool, lc lockCall) (h *Hold, err error) {
	s := m.s
	if !s.reserve(m.name) {
		return nil, ErrAlreadyHeld
	}
	sent := false     // a request reached a stream
	var pending *call // a request still pending when ctx ended
	giveUp := false   // withdraw what the server may hold
	defer func() {
		switch {
		case h != nil:
		case giveUp:
			s.goBG(func() { m.withdraw(pending) })
		default:
			s.unreserve(m.name)
		}
	}()
	for {
		if err := s.waitConnected(ctx); err != nil {
			giveUp = sent && ctx.Err() != nil // the server may still hold our place
			return nil, err
		}
		c, err := s.start(m.request(wait, lc))
		if errors.Is(err, errDisconnected) {
			continue
		}
		if err != nil {
			return nil, err
		}
		sent = true
		h, err := m.await(ctx, c, lc)
		switch {
		case err == nil:
			return h, nil
		case errors.Is(err, errAbandoned):
			pending, giveUp = c, true
			return nil, ctx.Err()
		case retryable(err):
			if !errors.Is(err, errDisconnected) {
				s.streamBroken(c.st) // this node cannot serve us: find the leader
			}
			continue
		default:
			return nil, err
		}
	}
}

var errAbandoned = errors.New("tenure: acquire abandoned")

// await waits for the final answer to acquire request c; errAbandoned:
// ctx ended first, and c is still pending.
func (m *Mutex) await(ctx context.Context, c *call, lc lockCall) (*Hold, error) {
	s := m.s
	for {
		select {
		case r := <-c.ch:
			if r.err != nil {
				s.finish(c)
				return nil, r.err
			}
			switch res := r.resp.GetResult().(type) {
			case *pb.SessionResponse_Queued:
				if lc.onQueued != nil {
					lc.onQueued(int(res.Queued.GetPosition()))
				}
			case *pb.SessionResponse_Granted:
				s.finish(c)
				return s.newHold(m.name, res.Granted.GetToken(), res.Granted.GetProof()), nil
			case *pb.SessionResponse_Error:
				s.finish(c)
				return nil, fromProto(res.Error)
			}
		case <-ctx.Done():
			return nil, errAbandoned
		}
	}
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
		if err := s.waitConnected(s.ctx); err != nil {
			return
		}
		var err error
		c, err = s.start(m.request(true, lockCall{})) // resume finds the acquisition, whatever its kind
		if errors.Is(err, errDisconnected) {
			c = nil
			continue
		}
		if err != nil {
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
				resp, _, err := s.call(ctx, &pb.SessionRequest{Op: &pb.SessionRequest_Release{Release: &pb.ReleaseLock{Name: m.name, Token: g.GetToken()}}})
				cancel()
				if err == nil && resp.GetError() != nil {
					err = fromProto(resp.GetError())
				}
				return err == nil || !retryable(err) // ErrNotHeld: released already
			}
			if r.resp.GetQueued() != nil {
				continue
			}
			if e := r.resp.GetError(); e != nil && retryable(fromProto(e)) {
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
// resource (Token) and the context to run the work under (Context). It is
// safe for concurrent use.
type Hold struct {
	s     *Session
	name  string
	token uint64
	proof string

	// mu guards the fields below.
	mu     sync.Mutex
	state  State
	err    error
	ctx    context.Context
	cancel context.CancelFunc
	subs   []chan State
	done   chan struct{}
}

func (s *Session) newHold(name string, token uint64, proof string) *Hold {
	h := &Hold{s: s, name: name, token: token, proof: proof, done: make(chan struct{})}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	s.mu.Lock()
	defer s.mu.Unlock()
	h.state = Held
	switch s.state {
	case sessSuspect:
		h.setState(Suspect, nil)
	case sessLost, sessClosed:
		h.setState(Lost, s.err)
		return h
	}
	s.holds[h] = struct{}{}
	return h
}

// Name is the lock's name.
func (h *Hold) Name() string { return h.name }

// Token is the fencing token of this grant: pass it with every effect and
// let the resource reject anything lower than what it already accepted.
func (h *Hold) Token() uint64 { return h.token }

// Proof is the cluster's signature of this grant (package fenceproof):
// one URL-safe base64 string that a resource with the cluster's public
// keys verifies offline, so that it can tell this token from one nobody
// was granted (see docs/fencing.md). It is empty if the server signed
// none (a cluster without a signing key yet).
func (h *Hold) Proof() string { return h.proof }

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
// Changes are dropped if the receiver lags more than 16 behind.
func (h *Hold) Changes() <-chan State {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := make(chan State, 16)
	if h.state == Lost || h.state == Released {
		ch <- h.state
		close(ch)
		return ch
	}
	h.subs = append(h.subs, ch)
	return ch
}

// Progress tells the session's progress watchdog that work advances.
func (h *Hold) Progress() { h.s.Progress() }

// setState moves the hold. Terminal states stick.
func (h *Hold) setState(st State, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state == Lost || h.state == Released || h.state == st {
		return
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
	for _, ch := range h.subs {
		select {
		case ch <- st:
		default:
		}
	}
	if st == Lost || st == Released {
		h.cancel()
		for _, ch := range h.subs {
			close(ch)
		}
		h.subs = nil
		close(h.done)
	}
}

// Unlock releases the grant. It returns ErrNotHeld if the grant had
// already ended (the hold is then Lost); a retried Unlock after success
// returns nil. It never releases a later holder: the server checks the
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
	}
	h.mu.Unlock()
	resp, sent, err := h.s.call(ctx, &pb.SessionRequest{Op: &pb.SessionRequest_Release{Release: &pb.ReleaseLock{Name: h.name, Token: h.token}}})
	if err != nil {
		return err
	}
	if e := resp.GetError(); e != nil {
		err := fromProto(e)
		if errors.Is(err, ErrNotHeld) && sent > 1 {
			// An earlier attempt reached the server before its stream
			// broke: the grant is gone either way.
			err = nil
		}
		if err != nil {
			h.end(Lost, err)
			return err
		}
	}
	h.end(Released, nil)
	return nil
}

func (h *Hold) end(st State, err error) {
	h.s.mu.Lock()
	delete(h.s.holds, h)
	delete(h.s.inUse, h.name)
	h.s.mu.Unlock()
	h.setState(st, err)
}
