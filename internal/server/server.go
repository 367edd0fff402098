// Package server implements Tenure's gRPC API on top of a node.
package server

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/node"
)

// cleanupTimeout bounds the proposals made after a client went away
// (cancelling a queued acquire).
const cleanupTimeout = 10 * time.Second

// Server serves the Tenure API. It is safe for concurrent use.
type Server struct {
	pb.UnimplementedTenureServer
	node    *node.Node
	hub     *Hub
	log     *slog.Logger
	limits  Limits
	workers workers
	watches watchSlots // open KVWatch and Observe streams (watchlimit.go)
	// restores admits restore streams within limits.Restore (cluster.go).
	restores restoreGate
	// refusals bounds the refusals logged (observe.go).
	refusals refusalBudget
	// auth: the ACLs are enforced (auth.go).
	auth      bool
	signers   signerCache // proof.go
	verifiers verifierCache
}

// New returns a server for n; hub must be the one whose Sink n delivers
// events to.
func New(n *node.Node, hub *Hub, limits Limits, opts ...Option) *Server {
	s := &Server{node: n, hub: hub, log: n.Logger(), limits: limits.withDefaults(), workers: workers{work: make(chan func())}}
	for _, o := range opts {
		o(s)
	}
	s.configureKV()
	n.OnDemote(s.hub.queues.wakeAll) // blocked dequeues move to the new leader
	return s
}

func cmdOf(op any) *fsmpb.Command {
	switch o := op.(type) {
	case *fsmpb.CreateSession:
		return &fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: o}}
	case *fsmpb.CloseSession:
		return &fsmpb.Command{Op: &fsmpb.Command_CloseSession{CloseSession: o}}
	case *fsmpb.Acquire:
		return &fsmpb.Command{Op: &fsmpb.Command_Acquire{Acquire: o}}
	case *fsmpb.CancelAcquire:
		return &fsmpb.Command{Op: &fsmpb.Command_CancelAcquire{CancelAcquire: o}}
	case *fsmpb.Release:
		return &fsmpb.Command{Op: &fsmpb.Command_Release{Release: o}}
	case *fsmpb.FencedPut:
		return &fsmpb.Command{Op: &fsmpb.Command_FencedPut{FencedPut: o}}
	case *fsmpb.FencedDelete:
		return &fsmpb.Command{Op: &fsmpb.Command_FencedDelete{FencedDelete: o}}
	case *fsmpb.Proclaim:
		return &fsmpb.Command{Op: &fsmpb.Command_Proclaim{Proclaim: o}}
	}
	panic(fmt.Sprintf("server: no command for %T", op))
}

// propose commits op with a context detached from the client's: once a
// command is sent its outcome must be known, so it is not abandoned halfway.
func (s *Server) propose(op any) (fsm.Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	return s.node.Propose(ctx, cmdOf(op))
}

// Session implements pb.TenureServer.
func (s *Server) Session(stream pb.Tenure_SessionServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	open := first.GetOpen()
	if open == nil {
		return status.Error(codes.InvalidArgument, "the first message on a Session stream must be open")
	}
	identity, err := s.authorizeOpen(stream.Context(), open)
	if err != nil {
		return toStatus(err)
	}
	_, queues := stream.(*muxSessionStream)
	ss := &sessionStream{srv: s, stream: stream, sendQueues: queues, pending: make(map[uint64]*pendingAcquire), ended: make(chan bool, 1), quit: make(chan struct{})}
	var secret []byte // only for a new session: the client learns it once
	if open.GetSessionId() == 0 {
		if err := fsm.ValidateSession(open.GetOwner(), open.GetTtlMs()); err != nil {
			return toStatus(err)
		}
		secret = make([]byte, fsm.SecretBytes)
		if _, err := rand.Read(secret); err != nil {
			return status.Errorf(codes.Internal, "drawing a session secret: %v", err)
		}
		res, err := s.propose(&fsmpb.CreateSession{Owner: open.GetOwner(), TtlMs: open.GetTtlMs(), SecretHash: fsm.HashSecret(secret), Identity: identity})
		if err != nil {
			return toStatus(err)
		}
		ss.id, ss.ttlMs = res.Session, open.GetTtlMs()
	} else {
		// The capability first: a wrong secret must not even renew.
		if err := s.checkSession(open.GetSessionId(), open.GetSecret()); err != nil {
			return toStatus(err)
		}
		ttl, err := s.node.KeepAlive(stream.Context(), open.GetSessionId())
		if err != nil {
			return toStatus(err)
		}
		ss.id, ss.ttlMs = open.GetSessionId(), ttl.Milliseconds()
	}
	s.hub.attach(ss.id, ss)
	defer s.hub.detach(ss.id, ss)
	ss.goHandle(ss.pushEnd)
	ss.send(&pb.SessionResponse{Id: first.GetId(), Result: &pb.SessionResponse_Opened{Opened: &pb.SessionOpened{SessionId: ss.id, TtlMs: ss.ttlMs, Owner: open.GetOwner(), Secret: secret}}})
	err = ss.serve()
	ss.stop()
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// checkSession verifies that secret is session id's capability; the
// secret never changes and ids are never reused, so a check before a
// proposal stays true when the command is applied (the session may have
// ended by then, which the state machine answers).
func (s *Server) checkSession(id uint64, secret []byte) error {
	var err error
	s.node.Read(func(st *fsm.State) { err = st.CheckSession(id, secret) })
	return err
}

// sessionStream is one client stream attached to a session. Every request
// on it acts as that session: the stream proved the session's secret when
// it was opened.
type sessionStream struct {
	srv    *Server
	stream pb.Tenure_SessionServer
	id     uint64
	ttlMs  int64
	wg     sync.WaitGroup

	// sendMu serialises Send.
	sendMu sync.Mutex
	// sendQueues: Send only queues the response (a session stream of a
	// Sessions RPC), so answers may be sent from any goroutine, also one
	// that must not block.
	sendQueues bool

	// ended receives (expired) when the session ends; quit stops pushEnd.
	ended    chan bool
	quit     chan struct{}
	stopOnce sync.Once

	// mu guards pending.
	mu      sync.Mutex
	pending map[uint64]*pendingAcquire

	// signing counts the immediate grants whose answers a worker signs
	// and sends (proof.go); every Add happens on the node's answering
	// goroutine before the answer of a later command of the stream, so
	// close, which waits for its own command's answer first, may Wait.
	signing sync.WaitGroup
}

// pendingAcquire is a queued acquire of this stream. Only an explicit
// Cancel withdraws it from the queue: when the stream merely breaks, the
// acquisition stays queued (or granted) for the session, and the client
// re-attaches to it with a resumed acquire.
type pendingAcquire struct {
	cancel   context.CancelFunc
	start    time.Time // when the request arrived (the wait's metric)
	withdraw bool      // guarded by sessionStream.mu
}

func (ss *sessionStream) send(r *pb.SessionResponse) {
	if e := r.GetError(); e != nil {
		ss.srv.refused("Session", codes.Code(e.GetCode()), e.GetMessage())
	}
	ss.sendMu.Lock()
	defer ss.sendMu.Unlock()
	_ = ss.stream.Send(r) // a broken stream is noticed by Recv
}

func errResponse(id uint64, err error) *pb.SessionResponse {
	return &pb.SessionResponse{Id: id, Result: &pb.SessionResponse_Error{Error: toProto(err)}}
}

func (ss *sessionStream) sendErr(id uint64, err error) {
	ss.send(errResponse(id, err))
}

// sessionEnded is called from the state machine's apply path: it must
// never block, so it only signals pushEnd, which does the sending.
func (ss *sessionStream) sessionEnded(expired bool) {
	select {
	case ss.ended <- expired:
	default:
	}
}

// pushEnd tells the client, unasked, that its session has ended.
func (ss *sessionStream) pushEnd() {
	select {
	case expired := <-ss.ended:
		err := fmt.Errorf("%w (closed)", fsm.ErrSessionNotFound)
		if expired {
			err = fmt.Errorf("%w (expired)", fsm.ErrSessionNotFound)
		}
		ss.sendErr(0, err)
	case <-ss.quit:
	}
}

func (ss *sessionStream) goHandle(fn func()) {
	ss.wg.Add(1)
	ss.srv.workers.Go(func() {
		defer ss.wg.Done()
		fn()
	})
}

// workerIdle is how long an idle worker waits for more work before it ends.
const workerIdle = 10 * time.Second

// workers runs request handlers on goroutines kept for reuse: a request
// does not pay for a new goroutine and for growing its stack again. There
// is no bound: a handler that finds no idle worker gets a new one.
type workers struct{ work chan func() }

// Go runs fn on an idle worker, or on a new one.
func (w *workers) Go(fn func()) {
	select {
	case w.work <- fn:
	default:
		go w.run(fn)
	}
}

func (w *workers) run(fn func()) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		fn()
		fn = nil // an idle worker must not keep the finished request alive
		idle.Reset(workerIdle)
		select {
		case fn = <-w.work:
		case <-idle.C:
			return
		}
	}
}

// stop cancels every pending request and waits for their handlers.
func (ss *sessionStream) stop() {
	ss.stopOnce.Do(func() { close(ss.quit) })
	ss.mu.Lock()
	for _, p := range ss.pending {
		p.cancel()
	}
	ss.mu.Unlock()
	ss.wg.Wait()
}

func (ss *sessionStream) serve() error {
	ctx := ss.stream.Context()
	if vs, ok := ss.stream.(*muxSessionStream); ok {
		return ss.serveDirect(ctx, vs)
	}
	for {
		req, err := ss.stream.Recv()
		if err != nil {
			return err
		}
		if ss.handle(ctx, req) {
			return ss.close(req.GetId())
		}
	}
}

// serveDirect serves a session stream of a Sessions RPC: its requests are
// handled as they arrive, on the goroutine that reads the Sessions RPC
// (handle does not block), and this goroutine only waits for the end.
func (ss *sessionStream) serveDirect(ctx context.Context, vs *muxSessionStream) error {
	closing := make(chan uint64, 1)
	vs.handleDirect(func(req *pb.SessionRequest) bool {
		if ss.handle(ctx, req) {
			closing <- req.GetId()
			return false // nothing after close is served
		}
		return true
	})
	select {
	case id := <-closing:
		vs.stopDirect()
		return ss.close(id)
	case <-ctx.Done():
		vs.stopDirect() // no request is being handled once this returns
		return status.FromContextError(ctx.Err()).Err()
	}
}

// handle serves one request without blocking (slow work goes to a
// worker); it reports a close request, which the caller serves.
func (ss *sessionStream) handle(ctx context.Context, req *pb.SessionRequest) (closing bool) {
	id := req.GetId()
	if err := ss.srv.authorizeSession(ctx, req); err != nil {
		ss.sendErr(id, err)
		return false
	}
	switch op := req.GetOp().(type) {
	case *pb.SessionRequest_KeepAlive:
		if ss.srv.node.LeadershipConfirmed() {
			ss.keepAlive(ctx, id) // answered at once
			return false
		}
		ss.goHandle(func() { ss.keepAlive(ctx, id) }) // after a barrier
	case *pb.SessionRequest_Acquire:
		actx, cancel := context.WithCancel(ctx)
		p := &pendingAcquire{cancel: cancel, start: time.Now()}
		ss.mu.Lock()
		ss.pending[id] = p
		ss.mu.Unlock()
		done := func() {
			cancel()
			ss.mu.Lock()
			delete(ss.pending, id)
			ss.mu.Unlock()
		}
		if ss.sendQueues {
			ss.acquireAsync(actx, id, op.Acquire, p, done)
			return false
		}
		ss.goHandle(func() {
			defer done()
			ss.acquire(actx, id, op.Acquire, p)
		})
	case *pb.SessionRequest_Release:
		r := op.Release
		ss.commit(&fsmpb.Release{Session: ss.id, Name: r.GetName(), Token: r.GetToken()}, func(_ fsm.Result, err error) {
			ss.answer(id, err, &pb.SessionResponse{Id: id, Result: &pb.SessionResponse_Released{Released: &pb.LockReleased{}}})
		})
	case *pb.SessionRequest_Proclaim:
		p := op.Proclaim
		ss.commit(&fsmpb.Proclaim{Session: ss.id, Name: p.GetName(), Token: p.GetToken(), Value: p.GetValue()}, func(_ fsm.Result, err error) {
			ss.answer(id, err, &pb.SessionResponse{Id: id, Result: &pb.SessionResponse_Proclaimed{Proclaimed: &pb.ValueProclaimed{}}})
		})
	case *pb.SessionRequest_Cancel:
		ss.mu.Lock()
		if p := ss.pending[op.Cancel.GetRequestId()]; p != nil {
			p.withdraw = true
			p.cancel()
		}
		ss.mu.Unlock()
	case *pb.SessionRequest_Close:
		return true
	case *pb.SessionRequest_Open:
		ss.sendErr(id, fmt.Errorf("%w: the stream is already open", fsm.ErrInvalid))
	default:
		ss.sendErr(id, fmt.Errorf("%w: unknown request", fsm.ErrInvalid))
	}
	return false
}

// keepAlive renews the session and answers request id. The node confirms
// a renewal only while its leadership is confirmed (node.KeepAlive).
func (ss *sessionStream) keepAlive(ctx context.Context, id uint64) {
	ttl, err := ss.srv.node.KeepAlive(ctx, ss.id)
	if err != nil {
		ss.sendErr(id, err)
		return
	}
	ss.send(&pb.SessionResponse{Id: id, Result: &pb.SessionResponse_Kept{Kept: &pb.KeepAliveAck{TtlMs: ttl.Milliseconds()}}})
}

// close ends the session for a close request and answers it.
func (ss *sessionStream) close(id uint64) error {
	ss.stop()
	ss.srv.hub.detach(ss.id, ss) // the closer learns from the answer, not a push
	_, err := ss.srv.propose(&fsmpb.CloseSession{Session: ss.id})
	ss.signing.Wait() // the grants committed before the close are answered first
	if err != nil {
		ss.sendErr(id, err)
		return nil
	}
	ss.send(&pb.SessionResponse{Id: id, Result: &pb.SessionResponse_Closed{Closed: &pb.SessionClosed{}}})
	return nil
}

// withdrawing reports whether the client asked to cancel p.
func (ss *sessionStream) withdrawing(p *pendingAcquire) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return p.withdraw
}

func (ss *sessionStream) acquire(ctx context.Context, id uint64, a *pb.AcquireLock, p *pendingAcquire) {
	ch, ok := ss.admitAcquire(id, a)
	if !ok {
		return
	}
	res, err := ss.srv.propose(acquireCommand(ss.id, a))
	ss.finishAcquire(waitKey{ss.id, a.GetName()}, ch, ss.acquired(ctx, id, a, p, ch, res, err))
}

// acquireAsync is acquire without a goroutine of its own while nothing
// blocks: the answer is sent from the node's answering goroutine, which
// only a stream whose Send never blocks may do (sendQueues). Waiting in
// line, and withdrawing a grant the client gave up on, go to a worker.
// done runs once the acquisition is over.
func (ss *sessionStream) acquireAsync(ctx context.Context, id uint64, a *pb.AcquireLock, p *pendingAcquire, done func()) {
	ch, ok := ss.admitAcquire(id, a)
	if !ok {
		done()
		return
	}
	key := waitKey{ss.id, a.GetName()}
	ss.srv.node.ProposeAsync(cmdOf(acquireCommand(ss.id, a)), func(res fsm.Result, err error) {
		if err == nil && (!res.Granted || ss.withdrawing(p)) {
			// Not on ss.wg: the stream may already be stopping, and ctx
			// ends this wait then.
			ss.srv.workers.Go(func() {
				defer done()
				ss.finishAcquire(key, ch, ss.acquired(ctx, id, a, p, ch, res, err))
			})
			return
		}
		// Refused, or granted to a request nobody withdrew (when it was
		// checked: a withdrawal from now on meets the grant in the client,
		// which releases it). Only sends: this runs on the node's answering
		// goroutine, where a proposal (as a withdrawal makes) would wait
		// for its own answer. A grant's proof is signed on a worker, off
		// that goroutine (proof.go).
		if err != nil || !a.GetProof() {
			var resp *pb.SessionResponse
			if err != nil {
				resp = errResponse(id, err)
			} else {
				resp = ss.granted(id, a, p, res.Token)
			}
			ss.finishAcquire(key, ch, resp)
			done()
			return
		}
		ss.signing.Add(1)
		ss.srv.workers.Go(func() {
			defer ss.signing.Done()
			defer done()
			ss.finishAcquire(key, ch, ss.granted(id, a, p, res.Token))
		})
	})
}

func acquireCommand(session uint64, a *pb.AcquireLock) *fsmpb.Acquire {
	return &fsmpb.Acquire{Session: session, Name: a.GetName(), Wait: a.GetWait(), LockDelayMs: a.GetLockDelayMs(), Resume: a.GetResume(), Permits: a.GetPermits(), Shared: a.GetShared(), Election: a.GetElection(), Value: a.GetValue()}
}

// admitAcquire checks an acquire request against the limits and takes its
// slot in the hub, so that no grant for it can be missed; it answers the
// request itself when it refuses it (ok false).
func (ss *sessionStream) admitAcquire(id uint64, a *pb.AcquireLock) (ch chan fsm.Event, ok bool) {
	if err := ss.srv.checkName("lock name", a.GetName()); err != nil {
		ss.sendErr(id, err)
		return nil, false
	}
	ch, ok = ss.srv.hub.register(waitKey{ss.id, a.GetName()}, a.GetResume())
	if !ok {
		ss.sendErr(id, fsm.ErrAlreadyHeld)
		return nil, false
	}
	return ch, true
}

// acquired returns an acquire request's final answer once its command is
// committed; for a queued one it sends "queued" (unless the request is
// quiet) and waits for the grant (or the end of the wait). Nil: no answer,
// the stream broke and the place in line is kept for a resume.
func (ss *sessionStream) acquired(ctx context.Context, id uint64, a *pb.AcquireLock, p *pendingAcquire, ch chan fsm.Event, res fsm.Result, err error) *pb.SessionResponse {
	if err != nil {
		return errResponse(id, err)
	}
	if res.Granted {
		if ss.withdrawing(p) { // the client gave up while we committed
			return errResponse(id, ss.cancelAcquire(a.GetName(), res.AcquireRevision))
		}
		return ss.granted(id, a, p, res.Token)
	}
	if !a.GetQuiet() {
		ss.send(&pb.SessionResponse{Id: id, Result: &pb.SessionResponse_Queued{Queued: &pb.LockQueued{Position: res.Position, QueuedRevision: res.AcquireRevision}}})
	}
	for {
		select {
		case e := <-ch:
			if e.AcquireRevision != res.AcquireRevision {
				continue
			}
			if e.Kind == fsm.EventGranted {
				return ss.granted(id, a, p, e.Token)
			}
			return errResponse(id, fsm.ErrSessionNotFound)
		case <-ctx.Done():
			if !ss.withdrawing(p) {
				return nil // the stream broke: the place in line is kept for a resume
			}
			return errResponse(id, ss.cancelAcquire(a.GetName(), res.AcquireRevision))
		}
	}
}

// finishAcquire ends an acquire request: it frees the request's slot in the
// hub, then sends its final answer, if any. In that order: the client may
// ask for the same lock again as soon as it has the answer, and a slot
// still taken would refuse it as a duplicate.
func (ss *sessionStream) finishAcquire(key waitKey, ch chan fsm.Event, resp *pb.SessionResponse) {
	ss.srv.hub.unregister(key, ch)
	if resp == nil {
		return
	}
	ss.send(resp)
	if hook := acquireAnsweredHook.Load(); hook != nil {
		(*hook)()
	}
}

// acquireAnsweredHook, when a test sets it, runs after finishAcquire has
// sent an answer.
var acquireAnsweredHook atomic.Pointer[func()]

// cancelAcquire withdraws a queued acquisition, or releases it if it was
// granted meanwhile; the state machine decides which, atomically. It
// returns the answer for the withdrawn request: errCancelled once the
// withdrawal is committed, else why it was not (not the leader, outcome
// unknown, the session ended), so that the client does not take an
// acquisition for withdrawn while it may still be queued.
func (ss *sessionStream) cancelAcquire(name string, acqRev uint64) error {
	if _, err := ss.srv.propose(&fsmpb.CancelAcquire{Session: ss.id, Name: name, AcquireRevision: acqRev}); err != nil {
		return err
	}
	return errCancelled
}

// commit proposes op and hands the outcome to then. On a stream whose Send
// only queues (sendQueues) then runs on the node's answering goroutine, with
// no goroutine of the request's own; otherwise a worker waits for the
// commit and runs then.
func (ss *sessionStream) commit(op any, then func(fsm.Result, error)) {
	if ss.sendQueues {
		ss.srv.node.ProposeAsync(cmdOf(op), then)
		return
	}
	ss.goHandle(func() { then(ss.srv.propose(op)) })
}

// answer sends ok, or the error if there is one.
func (ss *sessionStream) answer(id uint64, err error, ok *pb.SessionResponse) {
	if err != nil {
		ss.sendErr(id, err)
		return
	}
	ss.send(ok)
}

// Observe implements pb.TenureServer.
func (s *Server) Observe(req *pb.ObserveRequest, stream pb.Tenure_ObserveServer) error {
	if err := s.checkName("election name", req.GetName()); err != nil {
		return toStatus(err)
	}
	release, err := s.watches.take(stream.Context())
	if err != nil {
		return toStatus(err)
	}
	defer release()
	ob := s.hub.observe(req.GetName())
	defer s.hub.unobserve(req.GetName(), ob)
	ctx := stream.Context()
	if err := s.node.LinearizableRead(ctx); err != nil {
		return toStatus(err)
	}
	first := &pb.LeaderEvent{}
	s.node.Read(func(st *fsm.State) {
		first.Revision = st.Revision()
		for h := range st.LockHolders(req.GetName(), 0) { // the first: the leader
			first.Owner, first.Session, first.Token, first.Value = h.Owner, h.Session, h.Token, h.Value
			break
		}
	})
	if err := stream.Send(first); err != nil {
		return err
	}
	for {
		select {
		case e := <-ob.ch:
			if e.Revision <= first.Revision {
				continue // already reflected in the first answer
			}
			if err := stream.Send(&pb.LeaderEvent{Owner: e.Owner, Session: e.Session, Token: e.Token, Value: e.Value, Revision: e.Revision}); err != nil {
				return err
			}
		case <-ob.lost:
			return status.Errorf(codes.ResourceExhausted, "observer fell more than %d changes behind; observe again", observerBuffer)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// read runs fn on the state: after a linearizable barrier (the default),
// or on this node's local, possibly stale, state when serializable.
func (s *Server) read(ctx context.Context, serializable bool, fn func(*fsm.State)) error {
	if !serializable {
		if err := s.node.LinearizableRead(ctx); err != nil {
			return toStatus(err)
		}
	}
	s.node.Read(fn)
	return nil
}

// LockHistory implements pb.TenureServer.
func (s *Server) LockHistory(ctx context.Context, req *pb.LockHistoryRequest) (*pb.LockHistoryResponse, error) {
	if err := fsm.ValidateName("lock name", req.GetName()); err != nil {
		return nil, toStatus(err)
	}
	out := &pb.LockHistoryResponse{Name: req.GetName()}
	err := s.read(ctx, req.GetSerializable(), func(st *fsm.State) {
		for _, g := range st.History(req.GetName()) {
			out.Grants = append(out.Grants, &pb.GrantRecord{Owner: g.Owner, Session: g.Session, Token: g.Token, GrantedRevision: g.GrantedRevision, Ended: g.Ended, EndedRevision: g.EndedRevision})
		}
	})
	return out, err
}

// FencedPut implements pb.TenureServer. A stale token is a normal answer
// (PUT_RESULT_STALE), not an error; a token that was never issued is
// INVALID_ARGUMENT with an UnissuedToken detail.
func (s *Server) FencedPut(ctx context.Context, req *pb.FencedPutRequest) (*pb.FencedPutResponse, error) {
	if err := s.checkFenced(req.GetKey(), req.GetLock()); err != nil {
		return nil, toStatus(err)
	}
	if err := s.checkProof(req.GetKey(), req.GetLock(), req.GetProof(), req.GetToken()); err != nil {
		return nil, toStatus(err)
	}
	if n := len(req.GetValue()); n > s.limits.MaxRegisterValueBytes {
		return nil, toStatus(fmt.Errorf("%w: value is %d bytes, the limit is %d (--max-register-value-len)", fsm.ErrInvalid, n, s.limits.MaxRegisterValueBytes))
	}
	res, err := s.node.Propose(ctx, cmdOf(&fsmpb.FencedPut{Key: req.GetKey(), Value: req.GetValue(), Token: req.GetToken(), OperationId: req.GetOperationId(), Lock: req.GetLock()}))
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.FencedPutResponse{Result: pb.PutResult(res.Put), Duplicate: res.Duplicate, Token: res.AcceptedToken, Revision: res.Revision}, nil
}

// FencedDelete implements pb.TenureServer, with the answers of FencedPut.
func (s *Server) FencedDelete(ctx context.Context, req *pb.FencedDeleteRequest) (*pb.FencedDeleteResponse, error) {
	if err := s.checkFenced(req.GetKey(), req.GetLock()); err != nil {
		return nil, toStatus(err)
	}
	if err := s.checkProof(req.GetKey(), req.GetLock(), req.GetProof(), req.GetToken()); err != nil {
		return nil, toStatus(err)
	}
	res, err := s.node.Propose(ctx, cmdOf(&fsmpb.FencedDelete{Key: req.GetKey(), Token: req.GetToken(), Lock: req.GetLock(), OperationId: req.GetOperationId()}))
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.FencedDeleteResponse{Result: pb.PutResult(res.Put), Duplicate: res.Duplicate, Token: res.AcceptedToken, Revision: res.Revision}, nil
}

// checkFenced checks the names of a fenced write: its register key and,
// if it names one, its lock.
func (s *Server) checkFenced(key, lock string) error {
	if err := s.checkName("register key", key); err != nil {
		return err
	}
	if lock != "" {
		return s.checkName("lock name", lock)
	}
	return nil
}

// FencedGet implements pb.TenureServer.
func (s *Server) FencedGet(ctx context.Context, req *pb.FencedGetRequest) (*pb.FencedGetResponse, error) {
	if err := fsm.ValidateName("register key", req.GetKey()); err != nil {
		return nil, toStatus(err)
	}
	out := &pb.FencedGetResponse{Key: req.GetKey()}
	err := s.read(ctx, req.GetSerializable(), func(st *fsm.State) {
		r := st.Register(req.GetKey())
		out.Value, out.Token, out.Found, out.ModRevision = r.Value, r.Token, r.Found, r.ModRevision
	})
	return out, err
}

// Status implements pb.TenureServer.
func (s *Server) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	st := s.node.Status()
	out := &pb.StatusResponse{Node: st.Node, Leader: st.Leader, Term: st.Term, Revision: st.Revision, Voters: st.Voters, AppliedIndex: st.AppliedIndex, StorageError: st.StorageError}
	s.watchStatus(out)
	s.healthStatus(out)
	return out, nil
}
