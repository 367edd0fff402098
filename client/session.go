package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	pb "github.com/tenure-io/tenure/api/tenurepb"
)

// Session defaults.
const (
	DefaultTTL = 10 * time.Second
	// reconnect backoff bounds
	minBackoff = 50 * time.Millisecond
	maxBackoff = time.Second
)

// SessionOption configures NewSession. Options return an error on bad input.
type SessionOption func(*sessionConfig) error

type sessionConfig struct {
	ttl       time.Duration
	owner     string
	margin    time.Duration
	marginSet bool
	progress  time.Duration
}

// WithTTL sets the session's time to live (1s..1h; default 10s). The server
// expires the session when no keepalive arrived for this long.
func WithTTL(d time.Duration) SessionOption {
	return func(c *sessionConfig) error {
		if d < time.Second || d > time.Hour {
			return fmt.Errorf("%w: session TTL %v is outside 1s..1h", ErrInvalid, d)
		}
		c.ttl = d
		return nil
	}
}

// WithOwner names the owner (who); it shows in lock status and history.
func WithOwner(owner string) SessionOption {
	return func(c *sessionConfig) error {
		if len(owner) > 256 {
			return fmt.Errorf("%w: owner is longer than 256 bytes", ErrInvalid)
		}
		c.owner = owner
		return nil
	}
}

// WithDriftMargin sets how much earlier than sent+TTL the client stops
// trusting its hold (covers clock-rate drift between client and server).
// Default: 1% of the TTL plus 5ms. Must be less than a third of the TTL.
func WithDriftMargin(d time.Duration) SessionOption {
	return func(c *sessionConfig) error {
		if d < 0 {
			return fmt.Errorf("%w: negative drift margin", ErrInvalid)
		}
		c.margin, c.marginSet = d, true
		return nil
	}
}

// WithProgressDeadline arms the progress watchdog: if no hold of the
// session (nor the session itself) reports Progress within d, the client
// stops renewing, marks every hold lost and closes the session, so that a
// stuck owner cannot keep its locks alive forever.
func WithProgressDeadline(d time.Duration) SessionOption {
	return func(c *sessionConfig) error {
		if d <= 0 {
			return fmt.Errorf("%w: progress deadline must be positive", ErrInvalid)
		}
		c.progress = d
		return nil
	}
}

type sessState int

const (
	sessAlive sessState = iota
	sessSuspect
	sessLost
	sessClosed
)

type callResult struct {
	resp *pb.SessionResponse
	err  error
}

type call struct {
	id uint64
	ch chan callResult
	st *stream
}

// Session is a lease on the server that owns locks. It renews itself every
// TTL/3 over one stream that also carries its lock requests, and reconnects
// by itself. It is safe for concurrent use.
//
// When the session cannot confirm a renewal in time, or its connection
// breaks, every hold becomes Suspect (its Context is cancelled); with
// several endpoints, a renewal not confirmed within TTL/3 also makes it
// resume on the next endpoint, as a broken connection does. When the
// server confirms a renewal before the safe deadline, holds are Held again.
// When the safe deadline passes or the server reports the session gone,
// every hold is Lost for good and Done is closed.
type Session struct {
	c   *Client
	clk Clock
	cfg sessionConfig
	id  uint64
	// secret is the session's capability (see Secret); set once by
	// NewSession.
	secret []byte
	ctx    context.Context
	stop   context.CancelFunc
	wg     sync.WaitGroup
	wake   chan struct{}
	done   chan struct{}
	owner  string

	// mu guards everything below. Lock order: Session.mu before Hold.mu.
	mu           sync.Mutex
	state        sessState
	err          error
	safeUntil    time.Time
	st           *stream
	connected    chan struct{} // closed while st != nil
	nextID       uint64
	pending      map[uint64]*call
	kaSent       map[uint64]time.Time
	holds        map[*Hold]struct{}
	inUse        map[string]struct{} // lock names with a Lock in progress or a live hold
	lastProgress time.Time
	// skip is an endpoint that stopped answering: the next reconnect
	// passes it over once.
	skip *endpoint
	// moveTo is 1 + the endpoint the keeper moves the session to
	// (prefer.go); 0 none.
	moveTo uint32
}

// NewSession creates a session on the server.
func (c *Client) NewSession(ctx context.Context, opts ...SessionOption) (*Session, error) {
	cfg := sessionConfig{ttl: DefaultTTL}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if !cfg.marginSet {
		cfg.margin = cfg.ttl/100 + 5*time.Millisecond
	}
	if cfg.margin >= cfg.ttl/3 {
		return nil, fmt.Errorf("%w: drift margin %v must be less than a third of the TTL %v", ErrInvalid, cfg.margin, cfg.ttl)
	}
	sctx, stop := context.WithCancel(context.Background())
	s := &Session{
		c: c, clk: c.clk, cfg: cfg, ctx: sctx, stop: stop, owner: cfg.owner,
		wake: make(chan struct{}, 1), done: make(chan struct{}), connected: make(chan struct{}),
		pending: make(map[uint64]*call), kaSent: make(map[uint64]time.Time), holds: make(map[*Hold]struct{}), inUse: make(map[string]struct{}),
	}
	st, opened, sentAt, err := s.openAny(ctx, 0, nil)
	if err != nil {
		stop()
		return nil, err
	}
	s.id, s.secret = opened.GetSessionId(), opened.GetSecret()
	s.mu.Lock()
	s.lastProgress = s.clk.Now()
	s.attachLocked(st, sentAt)
	s.mu.Unlock()
	if err := c.track(s); err != nil { // the client was closed meanwhile
		s.abandon(err)
		s.mu.Lock()
		if s.st != nil {
			s.st.leave()
			s.st = nil
		}
		s.mu.Unlock()
		return nil, err
	}
	return s, nil
}

// abandon ends the session on this side only (Client.Close): it stops
// renewing, its holds are Lost with err, and its keeper returns. The
// server keeps the session until its TTL runs out.
func (s *Session) abandon(err error) {
	s.mu.Lock()
	s.setStateLocked(sessLost, err)
	s.mu.Unlock()
	s.stop()
}

// ID is the session's id on the server (the lease id of its grants). It
// is public: it shows in status and history. Acting as the session needs
// its Secret as well.
func (s *Session) ID() uint64 { return s.id }

// Secret is the session's capability: the server issued it when the
// session was created, keeps only a hash, and refuses every use of the
// session (resuming it, keys bound to it, dequeues tied to it) without it
// (ErrPermissionDenied). The client presents it by itself; give it only to
// a process you trust to act as this session (tenure lock passes it to its
// command as TENURE_SESSION_SECRET), for example with
// WithSessionCredentials. The slice must not be modified.
func (s *Session) Secret() []byte { return s.secret }

// TTL is the session's time to live.
func (s *Session) TTL() time.Duration { return s.cfg.ttl }

// Done is closed when the session is lost or closed; Err says why.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err is nil while the session lives, then the reason it ended
// (ErrSessionExpired, ErrProgressDeadline or ErrClosed).
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// SafeDeadline is the instant (on the client's monotonic clock) until which
// the session's holds are known to be valid: the send time of the last
// confirmed renewal plus the TTL minus the drift margin.
func (s *Session) SafeDeadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.safeUntil
}

// Progress tells the progress watchdog that the work is advancing.
func (s *Session) Progress() {
	s.mu.Lock()
	s.lastProgress = s.clk.Now()
	s.mu.Unlock()
}

func (s *Session) goBG(fn func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		fn()
	}()
}

func (s *Session) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// openAny opens the session (id 0: a new one) on the leader, waiting for
// one within ctx (see Client.rotate). With several endpoints, a node that
// does not answer within TTL/3 is passed over for the next, so that a
// silent one cannot use up the time left before the safe deadline; so is,
// once, the endpoint the keeper found silent (skip).
func (s *Session) openAny(ctx context.Context, id uint64, skip *endpoint) (*stream, *pb.SessionOpened, time.Time, error) {
	var st *stream
	var opened *pb.SessionOpened
	var sentAt time.Time
	err := s.c.rotate(ctx, false, func(i uint32) (err error) {
		ep := s.c.all()[i]
		if ep == skip {
			skip = nil
			return fmt.Errorf("%w: %s stopped answering", ErrUnavailable, ep.addr)
		}
		actx := ctx
		if len(s.c.all()) > 1 {
			var cancel context.CancelFunc
			actx, cancel = context.WithTimeout(ctx, s.cfg.ttl/3)
			defer cancel()
		}
		st, opened, sentAt, err = s.openOn(actx, i, id)
		if err != nil && actx.Err() != nil && ctx.Err() == nil {
			return fmt.Errorf("%w: %s did not answer within %v", ErrUnavailable, ep.addr, s.cfg.ttl/3)
		}
		return err
	})
	return st, opened, sentAt, err
}

// openOn attaches the session to endpoint i and sends Open; it returns
// when the server answered.
func (s *Session) openOn(ctx context.Context, i uint32, id uint64) (*stream, *pb.SessionOpened, time.Time, error) {
	st, err := s.c.all()[i].sessions.attach(ctx, s, i)
	if err != nil {
		return nil, nil, time.Time{}, fromStatus(err)
	}
	sentAt := s.clk.Now()
	open := &pb.OpenSession{SessionId: id, TtlMs: s.cfg.ttl.Milliseconds(), Owner: s.cfg.owner}
	if id != 0 {
		open.Secret = s.secret
	}
	_ = st.send(&pb.SessionRequest{Op: &pb.SessionRequest_Open{Open: open}}) // if the RPC broke, first says why
	var a openAnswer
	select {
	case a = <-st.first:
	case <-ctx.Done():
		st.leave()
		return nil, nil, time.Time{}, ctx.Err()
	}
	if a.err != nil {
		return nil, nil, time.Time{}, fromStatus(a.err)
	}
	opened := a.resp.GetOpened()
	if opened == nil {
		st.leave()
		if e := a.resp.GetError(); e != nil {
			return nil, nil, time.Time{}, fromProto(e)
		}
		return nil, nil, time.Time{}, fmt.Errorf("%w: unexpected answer to open", ErrUnknownOutcome)
	}
	return st, opened, sentAt, nil
}

// attachLocked makes st the session's stream; the server renewed the
// session when it answered the open that was sent at sentAt.
func (s *Session) attachLocked(st *stream, sentAt time.Time) {
	s.st = st
	close(s.connected)
	s.extendLocked(sentAt)
	select {
	case <-st.done: // it ended after the open was answered, before it was attached
		s.streamBrokenLocked(st)
	default:
	}
}

// extendLocked records a renewal confirmed for a request sent at sentAt.
func (s *Session) extendLocked(sentAt time.Time) {
	if until := sentAt.Add(s.cfg.ttl - s.cfg.margin); until.After(s.safeUntil) {
		s.safeUntil = until
	}
	if s.state == sessSuspect && s.st != nil && s.clk.Now().Before(s.safeUntil) {
		s.setStateLocked(sessAlive, nil)
	}
}

// dispatch hands an answer that came on st to its request, on the reader
// goroutine of st's RPC. Answers on a stream the session has left are
// dropped: their requests were told the stream broke.
func (s *Session) dispatch(st *stream, resp *pb.SessionResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st != s.st {
		return
	}
	id := resp.GetId()
	if sentAt, ok := s.kaSent[id]; ok {
		delete(s.kaSent, id)
		if resp.GetKept() != nil {
			s.extendLocked(sentAt)
			return
		}
		if e := resp.GetError(); e != nil {
			switch e.GetReason() {
			case pb.ErrorReason_ERROR_REASON_SESSION_EXPIRED:
				s.loseLocked(fromProto(e))
			case pb.ErrorReason_ERROR_REASON_NOT_LEADER:
				// This node stopped leading: find the new leader.
				if s.st != nil {
					s.streamBrokenLocked(s.st)
				}
			}
		}
		return
	}
	if id == 0 {
		if e := resp.GetError(); e != nil {
			s.loseLocked(fromProto(e))
		}
		return
	}
	if c := s.pending[id]; c != nil {
		select {
		case c.ch <- callResult{resp: resp}:
		default:
		}
	}
}

func (s *Session) streamBroken(st *stream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.streamBrokenLocked(st)
}

func (s *Session) streamBrokenLocked(st *stream) {
	st.leave()
	if s.st != st {
		return
	}
	s.st = nil
	s.connected = make(chan struct{})
	clear(s.kaSent)
	for _, c := range s.pending {
		if c.st == st {
			select {
			case c.ch <- callResult{err: errDisconnected}:
			default:
			}
		}
	}
	if s.state == sessAlive {
		s.setStateLocked(sessSuspect, nil)
	}
	s.poke()
}

// setStateLocked moves the session and all its holds.
func (s *Session) setStateLocked(st sessState, err error) {
	if s.state >= sessLost {
		return
	}
	s.state = st
	if err != nil {
		s.err = err
	}
	var hs State
	switch st {
	case sessAlive:
		hs = Held
	case sessSuspect:
		hs = Suspect
	case sessLost:
		hs = Lost
	case sessClosed:
		hs = Released
	}
	for h := range s.holds {
		h.sessionMoved(hs, err)
	}
	if st >= sessLost {
		close(s.done)
		for _, c := range s.pending {
			select {
			case c.ch <- callResult{err: err}:
			default:
			}
		}
		s.poke()
	}
}

func (s *Session) loseLocked(err error) {
	if !errors.Is(err, ErrSessionExpired) && !errors.Is(err, ErrProgressDeadline) {
		err = fmt.Errorf("%w: %v", ErrSessionExpired, err)
	}
	s.setStateLocked(sessLost, err)
}

// keeper renews the session, watches the safe deadline and the progress
// watchdog, and reconnects broken streams. All timing uses the injected
// clock.
func (s *Session) keeper() {
	defer s.c.untrack(s)
	renewEvery := s.cfg.ttl / 3
	nextRenew := s.clk.Now().Add(renewEvery)
	backoff := minBackoff
	var nextDial time.Time
	for {
		s.mu.Lock()
		if s.state >= sessLost {
			if s.st != nil {
				s.st.leave()
				s.st = nil
			}
			s.mu.Unlock()
			s.stop()
			return
		}
		now := s.clk.Now()
		if !now.Before(s.safeUntil) {
			s.loseLocked(fmt.Errorf("%w: no renewal confirmed before the safe deadline", ErrSessionExpired))
			s.mu.Unlock()
			continue
		}
		if s.cfg.progress > 0 && now.Sub(s.lastProgress) >= s.cfg.progress {
			s.setStateLocked(sessLost, ErrProgressDeadline)
			st := s.st
			s.mu.Unlock()
			s.letGo(st)
			continue
		}
		if j := s.moveTo; j != 0 {
			s.moveTo = 0
			if s.st != nil && s.st.ep != j-1 && s.state == sessAlive {
				s.mu.Unlock()
				s.move(j - 1) // prefer.go
				continue
			}
		}
		var kaStream *stream
		var kaID uint64
		if s.st != nil && !now.Before(nextRenew) && s.silentLocked(now, renewEvery) {
			// A renewal was not confirmed in time: the node, or the way
			// to it, has stopped answering without breaking the stream.
			// Suspect, and with other endpoints, move on as for a broken
			// stream: the session resumes on the next.
			if s.state == sessAlive {
				s.setStateLocked(sessSuspect, nil)
			}
			if st := s.st; len(s.c.all()) > 1 {
				s.skip = s.c.all()[st.ep]
				s.streamBrokenLocked(st)
			}
		}
		if s.st != nil && !now.Before(nextRenew) {
			s.nextID++
			kaID = s.nextID
			s.kaSent[kaID] = now
			kaStream = s.st
			nextRenew = now.Add(renewEvery)
		}
		dial := s.st == nil && !now.Before(nextDial)
		wait := s.safeUntil.Sub(now)
		if s.st != nil {
			wait = min(wait, nextRenew.Sub(now))
		} else if !dial {
			wait = min(wait, nextDial.Sub(now))
		}
		if s.cfg.progress > 0 {
			wait = min(wait, s.lastProgress.Add(s.cfg.progress).Sub(now))
		}
		s.mu.Unlock()

		if kaStream != nil {
			if err := kaStream.send(&pb.SessionRequest{Id: kaID, Op: &pb.SessionRequest_KeepAlive{KeepAlive: &pb.KeepAlive{}}}); err != nil {
				s.streamBroken(kaStream)
			}
		}
		if dial {
			s.reconnect()
			s.mu.Lock()
			if s.st == nil {
				nextDial = s.clk.Now().Add(backoff)
				backoff = min(backoff*2, maxBackoff)
			} else {
				backoff = minBackoff
				nextRenew = s.clk.Now().Add(renewEvery)
			}
			s.mu.Unlock()
			continue
		}
		if wait <= 0 {
			continue
		}
		t := s.clk.NewTimer(wait)
		select {
		case <-t.C():
		case <-s.wake:
			t.Stop()
		case <-s.ctx.Done():
			t.Stop()
			s.mu.Lock()
			s.setStateLocked(sessClosed, ErrClosed)
			s.mu.Unlock()
		}
	}
}

// silentLocked reports whether a keepalive sent at least d before now is
// still unconfirmed.
func (s *Session) silentLocked(now time.Time, d time.Duration) bool {
	for _, sent := range s.kaSent {
		if now.Sub(sent) >= d {
			return true
		}
	}
	return false
}

// reconnect opens a new stream resuming this session (see openAny).
func (s *Session) reconnect() {
	s.mu.Lock()
	left := s.safeUntil.Sub(s.clk.Now())
	skip := s.skip
	s.skip = nil
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(s.ctx, min(left, sessionTimeout))
	defer cancel()
	st, _, sentAt, err := s.openAny(ctx, s.id, skip)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if errors.Is(err, ErrSessionExpired) {
			s.loseLocked(err)
		}
		return
	}
	if s.state >= sessLost {
		st.leave()
		return
	}
	s.attachLocked(st, sentAt)
}

// letGo closes the session on the server after the watchdog fired, so the
// next waiter does not have to wait for the TTL.
func (s *Session) letGo(st *stream) {
	if st == nil {
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, 2*time.Second)
	defer cancel()
	stopAfter := context.AfterFunc(ctx, st.leave)
	defer stopAfter()
	_ = st.send(&pb.SessionRequest{Id: 0, Op: &pb.SessionRequest_Close{Close: &pb.CloseSession{}}})
	// The stream ends when the server has closed the session (or on timeout).
	s.mu.Lock()
	connected := s.st == st
	s.mu.Unlock()
	if connected {
		<-st.done
	}
}

// waitConnected blocks until the session has a stream.
func (s *Session) waitConnected(ctx context.Context) error {
	for {
		s.mu.Lock()
		if s.state >= sessLost {
			err := s.err
			s.mu.Unlock()
			return err
		}
		if s.st != nil {
			s.mu.Unlock()
			return nil
		}
		ch := s.connected
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.done:
		}
	}
}

// send is the one way a request reaches the session's stream: it waits
// (within ctx) until the session has a stream and sends req on it, waiting
// again when the stream breaks before req is on it. The call it returns
// receives req's answers; finish it once done with them.
func (s *Session) send(ctx context.Context, req *pb.SessionRequest) (*call, error) {
	for {
		if err := s.waitConnected(ctx); err != nil {
			return nil, err
		}
		c, err := s.start(req)
		if errors.Is(err, errDisconnected) {
			continue // broke meanwhile: wait for the next stream
		}
		return c, err
	}
}

// exchange says how do treats a request's answers.
type exchange struct {
	// interim takes the answers that are not final (Queued: a waiting
	// acquire's place in line); nil when none come.
	interim func(*pb.SessionResponse)
	// keep: when ctx ends while the request is pending, do leaves it
	// pending and returns it (outcome.pending), for the caller to
	// withdraw; otherwise it is forgotten.
	keep bool
}

// outcome is what do reports besides the error.
type outcome struct {
	// resp is the final answer; it may still carry a final error
	// (resp.GetError()).
	resp *pb.SessionResponse
	// sent counts the sends that reached a stream.
	sent int
	// pending is the request still pending when ctx ended (exchange.keep).
	pending *call
}

// do is the session's one request loop, used by every request a session
// sends (acquires, releases, proclaims, the close, the withdrawal of an
// acquire): it sends req (send), waits for its final answer, and sends it
// again after a broken stream or an answer that the node cannot serve it
// (not the leader, or it lost leadership while committing), after moving
// the session to a node that can. So req must be safe to repeat: acquires
// are sent with resume, releases name the exact grant. When ctx ends with
// req pending, the error matches ErrUnknownOutcome and ctx's error.
func (s *Session) do(ctx context.Context, req *pb.SessionRequest, x exchange) (outcome, error) {
	var o outcome
	for {
		c, err := s.send(ctx, req)
		if err != nil {
			return o, err
		}
		o.sent++
		resp, err := s.await(ctx, c, x.interim)
		switch {
		case errors.Is(err, errAbandoned):
			if x.keep {
				o.pending = c
			} else {
				s.finish(c)
			}
			return o, fmt.Errorf("%w: %w", ErrUnknownOutcome, ctx.Err())
		case errors.Is(err, errDisconnected):
			continue
		case err != nil:
			return o, err
		}
		if e := resp.GetError(); e != nil && retryable(fromProto(e)) {
			s.c.follow(fromProto(e), c.st.ep) // the leader it names, if any, next
			s.streamBroken(c.st)              // not the leader (any more): find it
			continue
		}
		o.resp = resp
		return o, nil
	}
}

// errAbandoned: ctx ended while a request was pending.
var errAbandoned = errors.New("tenure: request abandoned")

// await waits for c's final answer, handing interim answers to interim;
// errAbandoned when ctx ends first (c is then still pending).
func (s *Session) await(ctx context.Context, c *call, interim func(*pb.SessionResponse)) (*pb.SessionResponse, error) {
	for {
		select {
		case r := <-c.ch:
			if r.err != nil {
				s.finish(c)
				return nil, r.err
			}
			if interim != nil && r.resp.GetQueued() != nil {
				interim(r.resp)
				continue
			}
			s.finish(c)
			return r.resp, nil
		case <-ctx.Done():
			return nil, errAbandoned
		}
	}
}

// start sends req on the current stream, if there is one
// (errDisconnected otherwise).
func (s *Session) start(req *pb.SessionRequest) (*call, error) {
	s.mu.Lock()
	if s.state >= sessLost {
		err := s.err
		s.mu.Unlock()
		return nil, err
	}
	st := s.st
	if st == nil {
		s.mu.Unlock()
		return nil, errDisconnected
	}
	s.nextID++
	c := &call{id: s.nextID, ch: make(chan callResult, 4), st: st}
	s.pending[c.id] = c
	s.mu.Unlock()
	req.Id = c.id
	if err := st.send(req); err != nil {
		s.finish(c)
		s.streamBroken(st)
		return nil, errDisconnected
	}
	return c, nil
}

// reserve marks name as in use by this session; false if it already is.
func (s *Session) reserve(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, busy := s.inUse[name]; busy {
		return false
	}
	s.inUse[name] = struct{}{}
	return true
}

func (s *Session) unreserve(name string) {
	s.mu.Lock()
	delete(s.inUse, name)
	s.mu.Unlock()
}

func (s *Session) finish(c *call) {
	s.mu.Lock()
	delete(s.pending, c.id)
	s.mu.Unlock()
}

// Close ends the session on the server: every lock it holds is released
// and every wait it has queued is removed. Its holds become Released.
func (s *Session) Close(ctx context.Context) error {
	defer s.wg.Wait()
	defer s.stop()
	s.mu.Lock()
	if s.state >= sessLost {
		err := s.err
		s.mu.Unlock()
		if errors.Is(err, ErrClosed) {
			return nil
		}
		return err
	}
	s.mu.Unlock()
	o, err := s.do(ctx, &pb.SessionRequest{Op: &pb.SessionRequest_Close{Close: &pb.CloseSession{}}}, exchange{})
	if err == nil && o.resp.GetError() != nil {
		err = fromProto(o.resp.GetError())
	}
	s.mu.Lock()
	s.setStateLocked(sessClosed, ErrClosed)
	s.mu.Unlock()
	if errors.Is(err, ErrClosed) {
		err = nil
	}
	return err
}
