package server

// The session transport: the Sessions RPC.
//
// A client carries the sessions it has on an endpoint over one Sessions
// RPC. Every frame names its session stream, an id the client picks; a
// session stream attaches one session to the RPC. Its first request opens
// the session (creates it, or resumes it with its secret) and every
// request after it acts as that session: the stream proved the secret
// when it was opened.
//
// The goroutine that reads the RPC handles each request as it arrives and
// never blocks: a command is proposed with ProposeAsync and answered from
// the node's answering goroutine, and what has to wait (an open, a queued
// acquire, a keepalive behind a leadership check, a close, a grant's
// proof) goes to a worker. Answers are queued, and one sender goroutine
// sends them: those queued while it was sending leave together in the
// next message, so the sessions of a busy connection share messages.

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// Bounds of one Sessions RPC.
const (
	// maxStreamBacklog bounds the requests a session stream may receive
	// while its open is being served; a client that sends more has that
	// session stream ended with RESOURCE_EXHAUSTED.
	maxStreamBacklog = 4096
	// maxQueuedReplies is how many answers may wait to be sent before the
	// server stops reading requests: a client that sends without reading
	// the answers is then held back by gRPC's flow control.
	maxQueuedReplies = 10_000
	// maxRepliesPerMessage bounds one message. A reply carries at most a
	// lock name (--max-name-len, at most 512 bytes), a fence proof and an
	// error message, so 1,024 of them stay far below the client's default
	// 4 MiB receive limit, without measuring each one.
	maxRepliesPerMessage = 1024
)

// Sessions implements pb.TenureServer.
func (s *Server) Sessions(stream pb.Tenure_SessionsServer) error {
	c := &sessionConn{srv: s, stream: stream, ctx: stream.Context(), streams: make(map[uint64]*sessionStream),
		wake: make(chan struct{}, 1), room: make(chan struct{}, 1), stop: make(chan struct{})}
	sent := make(chan struct{})
	if !s.workers.start(func() { defer close(sent); c.sendLoop() }) {
		return status.Error(codes.Unavailable, "server: closed")
	}
	defer func() {
		c.mu.Lock()
		c.closed = true // nothing more is queued
		streams := make([]*sessionStream, 0, len(c.streams))
		for _, ss := range c.streams {
			streams = append(streams, ss)
		}
		c.mu.Unlock()
		for _, ss := range streams {
			ss.finish() // as if the client had left each session stream
		}
		c.work.Wait()
		close(c.stop) // the sender sends what is queued, then stops
		<-sent
	}()
	for {
		// A client that sends without reading the answers is not read
		// from either: gRPC's flow control then holds it back, and the
		// queue of answers stays bounded.
		if err := c.waitRoom(); err != nil {
			return err
		}
		in, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		for _, f := range in.GetFrames() {
			c.frame(f)
		}
	}
}

// sessionConn is one Sessions RPC.
type sessionConn struct {
	srv    *Server
	stream pb.Tenure_SessionsServer
	ctx    context.Context
	wake   chan struct{}  // replies were queued
	room   chan struct{}  // queued replies were taken for sending
	stop   chan struct{}  // closed when no more replies will be queued
	work   sync.WaitGroup // opens and closes being served

	// mu guards the fields below.
	mu      sync.Mutex
	streams map[uint64]*sessionStream
	closed  bool // the RPC is over: replies are dropped
	out     []*pb.SessionReply
	sendErr error

	// authMu guards authSec and authCaller: the RPC's caller as resolved
	// under the ACLs authSec (again when they change).
	authMu     sync.Mutex
	authSec    *fsm.Security
	authCaller caller
}

// frame serves one frame, on the reader goroutine.
func (c *sessionConn) frame(f *pb.SessionFrame) {
	id := f.GetStream()
	c.mu.Lock()
	ss := c.streams[id]
	opening := ss == nil && !f.GetEnd() && f.GetRequest().GetOpen() != nil
	if opening {
		ss = c.newStreamLocked(id)
	}
	c.mu.Unlock()
	switch {
	case f.GetEnd():
		if ss != nil {
			ss.finish() // the client left: its session lives on
		}
	case ss == nil:
		c.end(id, status.Error(codes.InvalidArgument, "the first request on a session stream must be open"))
	case f.GetRequest() == nil:
		ss.end(status.Error(codes.InvalidArgument, "a session frame needs a request or end"))
	case opening:
		req := f.GetRequest()
		c.goWork(func() { ss.open(req.GetId(), req.GetOpen()) })
	default:
		ss.deliver(f.GetRequest())
	}
}

func (c *sessionConn) newStreamLocked(id uint64) *sessionStream {
	ss := &sessionStream{conn: c, sid: id}
	ss.done.rpc = c.ctx
	c.streams[id] = ss
	return ss
}

// goWork runs fn on a worker; the RPC ends only after it.
func (c *sessionConn) goWork(fn func()) {
	c.work.Add(1)
	if !c.srv.workers.Go(streamWork, func() {
		defer c.work.Done()
		fn()
	}) {
		c.work.Done() // the server is closed
	}
}

// end tells the client that session stream id is over, with err's code
// and reason (nil: it ended normally).
func (c *sessionConn) end(id uint64, err error) {
	r := &pb.SessionReply{Stream: id, End: true}
	if err != nil {
		code, reason := classify(err)
		msg := err.Error()
		if st, ok := status.FromError(err); ok {
			code, reason, msg = st.Code(), pb.ErrorReason_ERROR_REASON_UNSPECIFIED, st.Message()
		}
		r.Code, r.Reason, r.Message = uint32(code), reason, msg
		if reason == pb.ErrorReason_ERROR_REASON_NOT_LEADER {
			r.LeaderAddr = c.srv.leaderClientAddr() // clientaddr.go
		}
		c.srv.refused("Sessions", code, msg)
	}
	c.send(r)
}

// send queues r for the sender; it never blocks.
func (c *sessionConn) send(r *pb.SessionReply) {
	c.mu.Lock()
	if c.closed || c.sendErr != nil {
		c.mu.Unlock()
		return
	}
	c.out = append(c.out, r)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// waitRoom returns once fewer than maxQueuedReplies answers wait to be
// sent (or sending failed, so none will pile up), or when the RPC ends.
func (c *sessionConn) waitRoom() error {
	for {
		c.mu.Lock()
		ok := len(c.out) < maxQueuedReplies || c.sendErr != nil
		c.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-c.room:
		case <-c.ctx.Done():
			return c.ctx.Err()
		}
	}
}

// cutReplies splits queued replies into the next message and the rest.
func cutReplies(out []*pb.SessionReply) (batch, rest []*pb.SessionReply) {
	if len(out) <= maxRepliesPerMessage {
		return out, nil
	}
	return out[:maxRepliesPerMessage], out[maxRepliesPerMessage:]
}

// sendLoop sends the queued replies in as few messages as possible: the
// replies queued while a message was being sent go together in the next.
// It also has the session streams checked again whenever the ACLs
// change (sweep).
func (c *sessionConn) sendLoop() {
	acl := c.srv.hub.acl.changed()
	for {
		stopping := false
		select {
		case <-c.wake:
		case <-c.stop:
			stopping = true
		case <-acl:
			acl = c.srv.hub.acl.changed() // before the sweep reads the ACLs
			c.srv.workers.Go(streamWork, c.sweep)
			continue
		}
		c.mu.Lock()
		batch, rest := cutReplies(c.out)
		c.out = rest
		c.mu.Unlock()
		select {
		case c.room <- struct{}{}:
		default:
		}
		if len(rest) > 0 {
			stopping = false // send the rest first
			select {
			case c.wake <- struct{}{}:
			default:
			}
		}
		if len(batch) > 0 {
			if err := c.stream.Send(&pb.SessionReplies{Replies: batch}); err != nil {
				c.mu.Lock()
				c.sendErr = err
				c.out = nil
				c.mu.Unlock()
				<-c.stop
				return
			}
		}
		if stopping {
			return
		}
	}
}

// revoked returns the PERMISSION_DENIED that ends the stream of session
// id when the RPC's caller no longer has session write on the session's
// owner, or one of more (a grant's lock write), under this node's current
// ACLs (revoke.go); nil while it has them, or while nothing is enforced.
func (c *sessionConn) revoked(id uint64, more ...right) error {
	sec := c.srv.acls()
	if !c.srv.enforcedBy(sec) {
		return nil
	}
	var owner string
	var exists bool
	c.srv.node.Read(func(st *fsm.State) { _, exists = st.SessionIdentity(id); owner = st.SessionOwner(id) })
	if exists {
		more = append([]right{write(fsm.KindSession, owner)}, more...)
	}
	c.authMu.Lock()
	if c.authSec != sec {
		c.authSec, c.authCaller = sec, callerOf(c.ctx, sec)
	}
	who := c.authCaller
	c.authMu.Unlock()
	return c.srv.revoked(who, sec, "Sessions", more...)
}

// sweep ends, with PERMISSION_DENIED, every session stream of the RPC
// whose caller lost its right to the session, or to a lock it waits for
// (the ACLs changed).
func (c *sessionConn) sweep() {
	c.mu.Lock()
	streams := make([]*sessionStream, 0, len(c.streams))
	for _, ss := range c.streams {
		streams = append(streams, ss)
	}
	c.mu.Unlock()
	for _, ss := range streams {
		ss.inMu.Lock()
		serving, id := ss.state == streamServing, ss.id
		ss.inMu.Unlock()
		if !serving {
			continue // an open checks the rights itself; a closing stream ends anyway
		}
		var locks []right // the rights of the acquires waiting in line
		ss.mu.Lock()
		ss.eachPendingLocked(func(p *pendingAcquire) { locks = append(locks, write(fsm.KindLock, p.name)) })
		ss.mu.Unlock()
		if err := c.revoked(id, locks...); err != nil {
			ss.end(err)
		}
	}
}

// streamState is where a session stream is in its life.
type streamState int

const (
	streamOpening streamState = iota // its open is being served; requests wait in the backlog
	streamServing
	streamClosing // a close is being served; later requests are dropped
	streamOver
)

// sessionStream is one session attached to a Sessions RPC.
type sessionStream struct {
	conn *sessionConn // and its srv, the server
	sid  uint64       // the session stream's id on its RPC
	// done is the session stream's context (&done): it ends when the
	// session stream is over.
	done streamContext
	// over is set once the stream is over: nothing more is sent on it.
	over atomic.Bool
	// wg counts the keepalives waiting for a leadership check.
	wg sync.WaitGroup

	// inMu serialises the handling of requests, in order, and guards the
	// fields below it. Lock order: inMu, then mu; inMu, then the hub's.
	inMu    sync.Mutex
	state   streamState
	backlog []*pb.SessionRequest
	// id and ttlMs are the session's, set by open before the stream
	// serves and never changed after.
	id    uint64
	ttlMs int64

	// mu guards the pending acquires (their set and their phases) and
	// stopped. Lock order: mu, then the connection's; the hub's lock is
	// never held with it.
	mu sync.Mutex
	// pending: the acquires not answered yet, by request id; one in
	// first (a waiter has one), the others in more, made when needed
	// (most sessions of a large fleet hold nothing).
	first   *pendingAcquire
	more    map[uint64]*pendingAcquire
	stopped bool // pending acquires put in line from now on are dropped

	// signing counts the immediate grants whose answers a worker signs
	// and sends (proof.go); every Add happens on the node's answering
	// goroutine before the answer of a later command of the stream, so
	// close, which waits for its own command's answer first, may Wait.
	signing sync.WaitGroup
}

// streamContext is a session stream's context: it carries its RPC's
// values and deadline, and it ends when the stream is over (finish), as
// every stream is before its RPC returns. Unlike a context.WithCancel of
// the RPC's context, it costs no allocation of its own, no entry in the
// RPC's context, and no channel until something waits for it.
type streamContext struct {
	rpc context.Context
	// mu guards done and over.
	mu   sync.Mutex
	done chan struct{} // made by the first Done
	over bool
}

// Deadline implements context.Context: the RPC's.
func (c *streamContext) Deadline() (time.Time, bool) { return c.rpc.Deadline() }

// Value implements context.Context: the RPC's values.
func (c *streamContext) Value(key any) any { return c.rpc.Value(key) }

// Done implements context.Context.
func (c *streamContext) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.over {
			close(c.done)
		}
	}
	return c.done
}

// Err implements context.Context: context.Canceled once the stream is over.
func (c *streamContext) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.over {
		return context.Canceled
	}
	return nil
}

// end ends the context; once is enough, more are harmless.
func (c *streamContext) end() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.over {
		c.over = true
		if c.done != nil {
			close(c.done)
		}
	}
}

// pendingAcquire is an acquire request of this stream not answered yet.
// It costs no goroutine while it waits in line: the hub wakes it with its
// acquisition's grant or end, and that answers it. Only an explicit Cancel
// withdraws it from the queue: when the stream merely ends, the
// acquisition stays queued (or granted) for the session, and the client
// re-attaches to it with a resumed acquire.
type pendingAcquire struct {
	ss    *sessionStream
	id    uint64    // the request's
	name  string    // the lock's
	start time.Time // when the request arrived (the wait's metric)
	// The request's, as far as its answer needs them (not the whole
	// request, which costs more to keep).
	permits                        uint32
	shared, election, quiet, proof bool

	// Guarded by ss.mu.
	phase    acquirePhase
	withdraw bool        // the client asked to cancel it
	acqRev   uint64      // its acquisition's revision, once queued
	early    []fsm.Event // the events that came while it was committing
}

// acquirePhase is where a pending acquire is. Exactly one of committed,
// wake, a Cancel and the stream's stop moves it to acquireSettled, and
// that one answers it (or, for stop, drops it): a grant is answered once.
type acquirePhase uint8

const (
	acquireCommitting acquirePhase = iota // its command is being committed
	acquireQueued                         // in line: the hub's events answer it
	acquireSettled                        // answered, being withdrawn, or dropped
)

// open serves the stream's open request id, on a worker: it creates or
// resumes the session, then serves the requests that came meanwhile.
func (ss *sessionStream) open(id uint64, open *pb.OpenSession) {
	sid, ttlMs, secret, err := ss.conn.srv.openSession(&ss.done, open)
	if err != nil {
		ss.end(err)
		return
	}
	ss.inMu.Lock()
	defer ss.inMu.Unlock()
	if ss.state != streamOpening {
		return // the client left meanwhile; a session created lives on until its TTL
	}
	ss.id, ss.ttlMs = sid, ttlMs
	ss.conn.srv.hub.attach(ss.id, ss)
	ss.send(&pb.SessionResponse{Id: id, Result: &pb.SessionResponse_Opened{Opened: &pb.SessionOpened{SessionId: sid, TtlMs: ttlMs, Owner: open.GetOwner(), Secret: secret}}})
	ss.state = streamServing
	for len(ss.backlog) > 0 && ss.state == streamServing {
		req := ss.backlog[0]
		ss.backlog[0] = nil
		ss.backlog = ss.backlog[1:]
		ss.handleLocked(req)
	}
	ss.backlog = nil
}

// openSession creates a session (id 0) or resumes one after checking its
// secret, and returns its id and TTL, and a new session's secret (the
// client learns it once).
func (s *Server) openSession(ctx context.Context, open *pb.OpenSession) (id uint64, ttlMs int64, secret []byte, err error) {
	identity, err := s.authorizeOpen(ctx, open)
	if err != nil {
		return 0, 0, nil, err
	}
	if open.GetSessionId() != 0 {
		// The capability first: a wrong secret must not even renew.
		if err := s.checkSession(open.GetSessionId(), open.GetSecret()); err != nil {
			return 0, 0, nil, err
		}
		ttl, err := s.node.KeepAlive(ctx, open.GetSessionId())
		if err != nil {
			return 0, 0, nil, err
		}
		return open.GetSessionId(), ttl.Milliseconds(), nil, nil
	}
	if err := fsm.ValidateSession(open.GetOwner(), open.GetTtlMs()); err != nil {
		return 0, 0, nil, err
	}
	secret = make([]byte, fsm.SecretBytes)
	if _, err := rand.Read(secret); err != nil {
		return 0, 0, nil, fmt.Errorf("drawing a session secret: %w", err)
	}
	res, err := s.proposeDetached(&fsmpb.CreateSession{Owner: open.GetOwner(), TtlMs: open.GetTtlMs(), SecretHash: fsm.HashSecret(secret), Identity: identity})
	if err != nil {
		return 0, 0, nil, err
	}
	return res.Session, open.GetTtlMs(), secret, nil
}

// deliver serves a request that arrived on the stream, on the reader
// goroutine: at once, or after the open if that is still being served.
func (ss *sessionStream) deliver(req *pb.SessionRequest) {
	ss.inMu.Lock()
	switch ss.state {
	case streamOpening:
		if len(ss.backlog) >= maxStreamBacklog {
			ss.inMu.Unlock()
			ss.end(status.Errorf(codes.ResourceExhausted, "more than %d requests sent on a session stream before its open was answered", maxStreamBacklog))
			return
		}
		ss.backlog = append(ss.backlog, req)
	case streamServing:
		ss.handleLocked(req)
	}
	ss.inMu.Unlock()
}

// finish makes the stream over without a word to the client (it left, or
// the RPC ended): pending requests are cancelled and the session is
// detached, and it lives on. It reports whether the stream was not over
// already.
func (ss *sessionStream) finish() bool {
	ss.inMu.Lock()
	if ss.state == streamOver {
		ss.inMu.Unlock()
		return false
	}
	ss.state = streamOver
	ss.over.Store(true)
	ss.backlog = nil
	id := ss.id
	ss.inMu.Unlock()
	ss.done.end()
	ss.stop()
	if id != 0 {
		ss.conn.srv.hub.detach(id, ss)
	}
	ss.conn.mu.Lock()
	if ss.conn.streams[ss.sid] == ss {
		delete(ss.conn.streams, ss.sid)
	}
	ss.conn.mu.Unlock()
	return true
}

// end makes the stream over and tells the client so, with err (nil: a
// normal end).
func (ss *sessionStream) end(err error) {
	if ss.finish() {
		ss.conn.end(ss.sid, err)
	}
}

// stop drops the acquires waiting in line (their places in line are kept
// for a resume; those being withdrawn are settled already, and those still
// committing are dropped once queued) and waits for the keepalives being
// served.
func (ss *sessionStream) stop() {
	var dropped []*pendingAcquire
	ss.mu.Lock()
	ss.stopped = true
	ss.eachPendingLocked(func(p *pendingAcquire) {
		if p.phase == acquireQueued {
			p.phase = acquireSettled
			dropped = append(dropped, p)
		}
	})
	for _, p := range dropped {
		ss.removePendingLocked(p)
	}
	ss.mu.Unlock()
	for _, p := range dropped {
		ss.conn.srv.hub.unregister(p.key(), p)
	}
	ss.wg.Wait()
}

func (ss *sessionStream) send(r *pb.SessionResponse) {
	if e := r.GetError(); e != nil {
		ss.conn.srv.refused("Sessions", codes.Code(e.GetCode()), e.GetMessage())
		ss.conn.srv.hintLeaderProto(e) // clientaddr.go
	}
	if ss.over.Load() {
		return
	}
	ss.conn.send(&pb.SessionReply{Stream: ss.sid, Response: r})
}

func errResponse(id uint64, err error) *pb.SessionResponse {
	return &pb.SessionResponse{Id: id, Result: &pb.SessionResponse_Error{Error: toProto(err)}}
}

func (ss *sessionStream) sendErr(id uint64, err error) {
	ss.send(errResponse(id, err))
}

// sessionEnded tells the client, unasked, that its session has ended. It
// is called from the state machine's apply path and does not block: it
// only queues the answer.
func (ss *sessionStream) sessionEnded(expired bool) {
	err := fmt.Errorf("%w (closed)", fsm.ErrSessionNotFound)
	if expired {
		err = fmt.Errorf("%w (expired)", fsm.ErrSessionNotFound)
	}
	ss.sendErr(0, err)
}

// handleLocked serves one request without blocking (what waits goes to a
// worker); ss.inMu is held and the stream serves.
func (ss *sessionStream) handleLocked(req *pb.SessionRequest) {
	id := req.GetId()
	if err := ss.conn.srv.authorizeSession(&ss.done, req); err != nil {
		ss.sendErr(id, err)
		return
	}
	switch op := req.GetOp().(type) {
	case *pb.SessionRequest_KeepAlive:
		if ss.conn.srv.node.LeadershipConfirmed() {
			ss.keepAlive(id) // answered at once
			return
		}
		ss.wg.Add(1) // after a barrier
		if !ss.conn.srv.workers.Go(leafWork, func() {
			defer ss.wg.Done()
			ss.keepAlive(id)
		}) {
			ss.wg.Done() // the server is closed
		}
	case *pb.SessionRequest_Acquire:
		ss.acquire(id, op.Acquire)
	case *pb.SessionRequest_Release:
		r := op.Release
		ss.conn.srv.proposeAsync((&fsmpb.Release{Session: ss.id, Name: r.GetName(), Token: r.GetToken()}), func(_ fsm.Result, err error) {
			ss.answer(id, err, &pb.SessionResponse{Id: id, Result: &pb.SessionResponse_Released{Released: &pb.LockReleased{}}})
		})
	case *pb.SessionRequest_Proclaim:
		p := op.Proclaim
		ss.conn.srv.proposeAsync((&fsmpb.Proclaim{Session: ss.id, Name: p.GetName(), Token: p.GetToken(), Value: p.GetValue()}), func(_ fsm.Result, err error) {
			ss.answer(id, err, &pb.SessionResponse{Id: id, Result: &pb.SessionResponse_Proclaimed{Proclaimed: &pb.ValueProclaimed{}}})
		})
	case *pb.SessionRequest_Cancel:
		ss.mu.Lock()
		p := ss.pendingLocked(op.Cancel.GetRequestId())
		inLine := p != nil && p.phase == acquireQueued
		if p != nil {
			p.withdraw = true // one still committing is withdrawn once committed
		}
		if inLine {
			p.phase = acquireSettled
		}
		ss.mu.Unlock()
		if inLine {
			p.forget()
			p.withdrawAcquisition(p.acqRev)
		}
	case *pb.SessionRequest_Close:
		ss.state = streamClosing // nothing after the close is served
		ss.conn.goWork(func() { ss.close(id) })
	case *pb.SessionRequest_Open:
		ss.sendErr(id, fmt.Errorf("%w: the stream is already open", fsm.ErrInvalid))
	default:
		ss.sendErr(id, fmt.Errorf("%w: unknown request", fsm.ErrInvalid))
	}
}

// keepAlive renews the session and answers request id. The node confirms
// a renewal only while its leadership is confirmed (node.KeepAlive).
func (ss *sessionStream) keepAlive(id uint64) {
	ttl, err := ss.conn.srv.node.KeepAlive(&ss.done, ss.id)
	if err != nil {
		ss.sendErr(id, err)
		return
	}
	ss.send(&pb.SessionResponse{Id: id, Result: &pb.SessionResponse_Kept{Kept: &pb.KeepAliveAck{TtlMs: ttl.Milliseconds()}}})
}

// close ends the session for close request id, answers it, and then ends
// the stream normally.
func (ss *sessionStream) close(id uint64) {
	ss.stop()
	ss.conn.srv.hub.detach(ss.id, ss) // the closer learns from the answer, not a push
	_, err := ss.conn.srv.proposeDetached(&fsmpb.CloseSession{Session: ss.id})
	ss.signing.Wait() // the grants committed before the close are answered first
	ss.answer(id, err, &pb.SessionResponse{Id: id, Result: &pb.SessionResponse_Closed{Closed: &pb.SessionClosed{}}})
	ss.end(nil)
}

// acquire serves acquire request id without a goroutine: its answer is
// sent from the node's answering goroutine when the command is committed,
// or, when it waits in line, from the state machine's apply path when the
// hub wakes it with its acquisition's grant or end (wake). Only
// withdrawing an acquisition, and signing a grant's proof, go to a worker.
func (ss *sessionStream) acquire(id uint64, a *pb.AcquireLock) {
	if err := ss.conn.srv.checkName("lock name", a.GetName()); err != nil {
		ss.sendErr(id, err)
		return
	}
	p := &pendingAcquire{ss: ss, id: id, name: a.GetName(), start: time.Now(), permits: a.GetPermits(), shared: a.GetShared(), election: a.GetElection(), quiet: a.GetQuiet(), proof: a.GetProof()}
	ss.mu.Lock()
	ss.addPendingLocked(p)
	ss.mu.Unlock()
	// Registered before the command is proposed, so that no event of
	// the acquisition can be missed.
	ss.conn.srv.hub.register(p.key(), p)
	ss.conn.srv.proposeAsync(acquireCommand(ss.id, a), p.committed)
}

func acquireCommand(session uint64, a *pb.AcquireLock) *fsmpb.Acquire {
	return &fsmpb.Acquire{Session: session, Name: a.GetName(), Wait: a.GetWait(), LockDelayMs: a.GetLockDelayMs(), Resume: a.GetResume(), Permits: a.GetPermits(), Shared: a.GetShared(), Election: a.GetElection(), Value: a.GetValue()}
}

// committed serves p's command's outcome, on the node's answering
// goroutine: it answers a refusal or a grant, withdraws an acquisition the
// client gave up on meanwhile, or puts p in line (answered "queued" unless
// the request is quiet).
func (p *pendingAcquire) committed(res fsm.Result, err error) {
	ss := p.ss
	ss.mu.Lock()
	if err != nil || (res.Granted && !p.withdraw) {
		// Refused, or granted to a request nobody withdrew (when it was
		// checked: a withdrawal from now on meets the grant in the client,
		// which releases it). Only sends: a proposal (as a withdrawal
		// makes) would wait here for its own answer.
		p.phase = acquireSettled
		ss.mu.Unlock()
		p.forget()
		if err != nil {
			ss.sendErr(p.id, err)
			return
		}
		ss.sendGrant(p, res.Token)
		return
	}
	if res.Granted { // the client gave up while we committed
		p.phase = acquireSettled
		ss.mu.Unlock()
		p.forget()
		p.withdrawAcquisition(res.AcquireRevision)
		return
	}
	// Queued. Sent with ss.mu held, so that no grant overtakes it.
	if !p.quiet {
		ss.send(&pb.SessionResponse{Id: p.id, Result: &pb.SessionResponse_Queued{Queued: &pb.LockQueued{Position: res.Position, QueuedRevision: res.AcquireRevision}}})
	}
	var ended *fsm.Event // the acquisition's grant or end, come meanwhile
	for i := range p.early {
		if p.early[i].AcquireRevision == res.AcquireRevision {
			ended = &p.early[i]
			break
		}
	}
	p.early = nil
	switch {
	case p.withdraw:
		p.phase = acquireSettled
		ss.mu.Unlock()
		p.forget()
		p.withdrawAcquisition(res.AcquireRevision)
	case ended != nil:
		p.phase = acquireSettled
		ss.mu.Unlock()
		p.answerEvent(*ended)
	case ss.stopped:
		p.phase = acquireSettled
		ss.mu.Unlock()
		p.forget() // the stream ended: the place in line is kept for a resume
	default:
		p.phase, p.acqRev = acquireQueued, res.AcquireRevision
		ss.mu.Unlock()
	}
}

// wake serves an event of the session's acquisition of p's lock, on the
// state machine's apply path (Hub.Sink): it answers p with its
// acquisition's grant or end, and keeps what comes while p's command is
// being committed for committed to look at. It never blocks.
func (p *pendingAcquire) wake(e fsm.Event) {
	ss := p.ss
	ss.mu.Lock()
	switch {
	case p.phase == acquireCommitting:
		// Few: each is the grant or end of one acquisition of this
		// session's for this lock, of which there is one at a time.
		p.early = append(p.early, e)
		ss.mu.Unlock()
		return
	case p.phase != acquireQueued || e.AcquireRevision != p.acqRev:
		ss.mu.Unlock()
		return // answered already, or another acquisition's
	}
	p.phase = acquireSettled
	ss.mu.Unlock()
	p.answerEvent(e)
}

// answerEvent answers settled p with its acquisition's grant or end.
func (p *pendingAcquire) answerEvent(e fsm.Event) {
	p.forget()
	if e.Kind == fsm.EventGranted {
		p.ss.sendGrant(p, e.Token)
		return
	}
	p.ss.sendErr(p.id, fsm.ErrSessionNotFound)
}

// key is what the hub knows p by.
func (p *pendingAcquire) key() waitKey { return waitKey{p.ss.id, p.name} }

// forget removes settled p from the hub and from its stream's pending
// requests.
func (p *pendingAcquire) forget() {
	ss := p.ss
	ss.conn.srv.hub.unregister(p.key(), p)
	ss.mu.Lock()
	ss.removePendingLocked(p)
	ss.mu.Unlock()
}

// pendingLocked returns the pending acquire of request id, or nil.
func (ss *sessionStream) pendingLocked(id uint64) *pendingAcquire {
	if ss.first != nil && ss.first.id == id {
		return ss.first
	}
	return ss.more[id]
}

// addPendingLocked adds p, in place of a pending acquire of the same
// request id (a client that reuses an id has its earlier request go
// unanswered).
func (ss *sessionStream) addPendingLocked(p *pendingAcquire) {
	if ss.first == nil || ss.first.id == p.id {
		ss.first = p
		return
	}
	if ss.more == nil {
		ss.more = make(map[uint64]*pendingAcquire)
	}
	ss.more[p.id] = p
}

// removePendingLocked removes p if it is pending.
func (ss *sessionStream) removePendingLocked(p *pendingAcquire) {
	if ss.first == p {
		ss.first = nil
		return
	}
	if ss.more[p.id] == p {
		delete(ss.more, p.id)
	}
}

// eachPendingLocked calls fn with every pending acquire.
func (ss *sessionStream) eachPendingLocked(fn func(p *pendingAcquire)) {
	if ss.first != nil {
		fn(ss.first)
	}
	for _, p := range ss.more {
		fn(p)
	}
}

// withdrawAcquisition withdraws (or releases) settled p's acquisition
// acqRev on a worker, and answers p with the outcome (cancelAcquire).
func (p *pendingAcquire) withdrawAcquisition(acqRev uint64) {
	ss := p.ss
	ss.conn.srv.workers.Go(leafWork, func() { ss.sendErr(p.id, ss.cancelAcquire(p.name, acqRev)) })
}

// sendGrant answers p with its grant of token, signing its proof on a
// worker if it asked for one (off the goroutines that apply and answer
// commands). Every signing.Add happens there before the answer of a later
// command of the stream (see signing).
//
// Where the ACLs are enforced, every grant goes through a worker: there
// it checks that the stream's caller still has its right to the session
// and to the lock (which reads the state: not on the goroutines that
// apply and answer commands). A grant made after the caller lost one is
// not sent: the stream ends with PERMISSION_DENIED instead (the ACLs then
// hold every change committed before the grant; revoke.go), and the
// session keeps the grant until it ends.
func (ss *sessionStream) sendGrant(p *pendingAcquire, token uint64) {
	srv := ss.conn.srv
	enforced := srv.enforcedBy(srv.acls())
	if !p.proof && !enforced {
		ss.send(ss.granted(p, token))
		return
	}
	ss.signing.Add(1)
	started := srv.workers.Go(grantWork, func() {
		defer ss.signing.Done()
		if enforced {
			if err := ss.conn.revoked(ss.id, write(fsm.KindLock, p.name)); err != nil {
				ss.end(err)
				return
			}
		}
		ss.send(ss.granted(p, token))
	})
	if !started {
		ss.signing.Done() // the server is closed
	}
}

// cancelAcquire withdraws a queued acquisition, or releases it if it was
// granted meanwhile; the state machine decides which, atomically. It
// returns the answer for the withdrawn request: errCancelled once the
// withdrawal is committed, else why it was not (not the leader, outcome
// unknown, the session ended), so that the client does not take an
// acquisition for withdrawn while it may still be queued.
func (ss *sessionStream) cancelAcquire(name string, acqRev uint64) error {
	if _, err := ss.conn.srv.proposeDetached(&fsmpb.CancelAcquire{Session: ss.id, Name: name, AcquireRevision: acqRev}); err != nil {
		return err
	}
	return errCancelled
}

// answer sends ok, or the error if there is one.
func (ss *sessionStream) answer(id uint64, err error, ok *pb.SessionResponse) {
	if err != nil {
		ss.sendErr(id, err)
		return
	}
	ss.send(ok)
}
