package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/tenure-io/tenure/api/tenurepb"
)

// maxMuxBacklog bounds the requests a session stream of a Sessions RPC may
// have received and not yet read; a client that sends more has that
// session stream ended with RESOURCE_EXHAUSTED (a Session RPC is bounded
// the same way by gRPC's flow control).
const maxMuxBacklog = 4096

// Sessions implements pb.TenureServer: every session stream it carries is
// served by Session, exactly as if it were its own RPC.
func (s *Server) Sessions(stream pb.Tenure_SessionsServer) error {
	m := &muxServer{stream: stream, streams: make(map[uint64]*muxSessionStream), wake: make(chan struct{}, 1), room: make(chan struct{}, 1), stop: make(chan struct{})}
	sent := make(chan struct{})
	go func() { defer close(sent); m.sendLoop() }()
	var wg sync.WaitGroup
	defer func() {
		m.mu.Lock()
		m.closed = true
		for _, vs := range m.streams {
			vs.cancel()
		}
		m.mu.Unlock()
		wg.Wait()     // every session stream has queued its end
		close(m.stop) // the sender sends what is queued, then stops
		<-sent
	}()
	for {
		// A client that sends without reading the answers is not read
		// from either, as on a Session RPC: gRPC's flow control then
		// holds it back, and the queue of answers stays bounded.
		if err := m.waitRoom(stream.Context()); err != nil {
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
			m.mu.Lock()
			vs := m.streams[f.GetStream()]
			if vs == nil && !f.GetEnd() && !m.closed {
				vs = m.start(f.GetStream())
				m.streams[f.GetStream()] = vs
				wg.Go(func() {
					err := s.Session(vs)
					if err != nil {
						s.refused("Sessions", codeOf(err), status.Convert(err).Message())
					}
					vs.cancel()
					m.end(vs, err)
				})
			}
			m.mu.Unlock()
			switch {
			case vs == nil:
			case f.GetEnd():
				vs.cancel() // the client left: as a cancelled Session RPC
			case f.GetRequest() == nil:
				vs.fail(status.Error(codes.InvalidArgument, "a session frame needs a request or end"))
			default:
				vs.deliver(f.GetRequest())
			}
		}
	}
}

// muxServer is one Sessions RPC.
type muxServer struct {
	stream pb.Tenure_SessionsServer
	wake   chan struct{} // replies were queued
	room   chan struct{} // queued replies were taken for sending
	stop   chan struct{} // closed when no more replies will be queued

	// mu guards the fields below.
	mu      sync.Mutex
	streams map[uint64]*muxSessionStream
	closed  bool
	out     []*pb.SessionReply
	sendErr error
}

func (m *muxServer) start(id uint64) *muxSessionStream {
	ctx, cancel := context.WithCancel(m.stream.Context())
	return &muxSessionStream{ServerStream: m.stream, m: m, id: id, ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1)}
}

// end tells the client that session stream vs is over, with err's status.
func (m *muxServer) end(vs *muxSessionStream, err error) {
	m.mu.Lock()
	delete(m.streams, vs.id)
	m.mu.Unlock()
	st := status.Convert(err)
	if errors.Is(err, io.EOF) {
		st = status.New(codes.OK, "")
	}
	vs.mu.Lock()
	if vs.failed != nil {
		st = status.Convert(vs.failed)
	}
	vs.mu.Unlock()
	_ = m.send(&pb.SessionReply{Stream: vs.id, End: true, Code: uint32(st.Code()), Message: st.Message()})
}

// send queues r for the sender loop.
func (m *muxServer) send(r *pb.SessionReply) error {
	m.mu.Lock()
	if m.sendErr != nil {
		err := m.sendErr
		m.mu.Unlock()
		return err
	}
	m.out = append(m.out, r)
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
	return nil
}

// maxQueuedReplies is how many answers may wait to be sent on a Sessions
// RPC before the server stops reading its requests.
const maxQueuedReplies = 10_000

// waitRoom returns once fewer than maxQueuedReplies answers wait to be
// sent (or sending failed, so none will pile up), or when ctx ends.
func (m *muxServer) waitRoom(ctx context.Context) error {
	for {
		m.mu.Lock()
		ok := len(m.out) < maxQueuedReplies || m.sendErr != nil
		m.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-m.room:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// maxRepliesPerMessage bounds one message of a Sessions RPC. A reply
// carries at most a lock name (--max-name-len, at most 512 bytes) and an
// error message, so 1,024 of them stay far below the client's default
// 4 MiB receive limit, without measuring each one.
const maxRepliesPerMessage = 1024

// cutReplies splits queued replies into the next message and the rest.
func cutReplies(out []*pb.SessionReply) (batch, rest []*pb.SessionReply) {
	if len(out) <= maxRepliesPerMessage {
		return out, nil
	}
	return out[:maxRepliesPerMessage], out[maxRepliesPerMessage:]
}

// sendLoop sends the queued replies, as few messages as possible: replies
// queued while a message is being sent go together in the next one.
func (m *muxServer) sendLoop() {
	for {
		stopping := false
		select {
		case <-m.wake:
		case <-m.stop:
			stopping = true
		}
		runtime.Gosched() // let the other senders that were woken with us queue too
		m.mu.Lock()
		batch, rest := cutReplies(m.out)
		m.out = rest
		m.mu.Unlock()
		select {
		case m.room <- struct{}{}:
		default:
		}
		if len(rest) > 0 {
			stopping = false // send the rest first
			select {
			case m.wake <- struct{}{}:
			default:
			}
		}
		if len(batch) > 0 {
			if err := m.stream.Send(&pb.SessionReplies{Replies: batch}); err != nil {
				m.mu.Lock()
				m.sendErr = err
				m.out = nil
				m.mu.Unlock()
				<-m.stop
				return
			}
		}
		if stopping {
			return
		}
	}
}

// muxSessionStream is one session stream of a Sessions RPC, seen by
// Session as its own stream.
type muxSessionStream struct {
	grpc.ServerStream // of the Sessions RPC: metadata and peer
	m                 *muxServer
	id                uint64
	ctx               context.Context
	cancel            context.CancelFunc
	wake              chan struct{}

	// mu guards the fields below; direct runs under it, so requests are
	// handled one at a time, in order.
	mu      sync.Mutex
	inbox   []*pb.SessionRequest
	failed  error
	direct  func(*pb.SessionRequest) bool // see handleDirect
	stopped bool                          // no request is handled any more
}

// handleDirect makes deliver hand every request, from now on and starting
// with those not yet received, to fn on the delivering goroutine, until fn
// returns false or stopDirect is called. Recv must not be used after it.
func (vs *muxSessionStream) handleDirect(fn func(*pb.SessionRequest) bool) {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	vs.direct = fn
	for len(vs.inbox) > 0 && !vs.stopped {
		vs.stopped = !fn(vs.popLocked())
	}
}

// popLocked takes the oldest received request; vs.mu is held and the
// inbox is not empty.
func (vs *muxSessionStream) popLocked() *pb.SessionRequest {
	r := vs.inbox[0]
	vs.inbox[0] = nil
	vs.inbox = vs.inbox[1:]
	return r
}

// stopDirect stops handleDirect's handling; once it returns, no request is
// being handled.
func (vs *muxSessionStream) stopDirect() {
	vs.mu.Lock()
	vs.stopped = true
	vs.mu.Unlock()
}

var _ pb.Tenure_SessionServer = (*muxSessionStream)(nil)

func (vs *muxSessionStream) deliver(r *pb.SessionRequest) {
	vs.mu.Lock()
	switch {
	case vs.stopped:
		vs.mu.Unlock()
		return
	case vs.direct != nil:
		vs.stopped = !vs.direct(r)
		vs.mu.Unlock()
		return
	}
	if len(vs.inbox) >= maxMuxBacklog {
		vs.mu.Unlock()
		vs.fail(status.Errorf(codes.ResourceExhausted, "more than %d requests sent on one session stream and not yet read", maxMuxBacklog))
		return
	}
	vs.inbox = append(vs.inbox, r)
	vs.mu.Unlock()
	select {
	case vs.wake <- struct{}{}:
	default:
	}
}

// fail ends the session stream with err.
func (vs *muxSessionStream) fail(err error) {
	vs.mu.Lock()
	if vs.failed == nil {
		vs.failed = err
	}
	vs.mu.Unlock()
	vs.cancel()
}

// Context implements grpc.ServerStream.
func (vs *muxSessionStream) Context() context.Context { return vs.ctx }

// Recv implements pb.Tenure_SessionServer.
func (vs *muxSessionStream) Recv() (*pb.SessionRequest, error) {
	for {
		vs.mu.Lock()
		if len(vs.inbox) > 0 {
			r := vs.popLocked()
			vs.mu.Unlock()
			return r, nil
		}
		vs.mu.Unlock()
		select {
		case <-vs.wake:
		case <-vs.ctx.Done():
			return nil, status.FromContextError(vs.ctx.Err()).Err()
		}
	}
}

// Send implements pb.Tenure_SessionServer.
func (vs *muxSessionStream) Send(r *pb.SessionResponse) error {
	if err := vs.ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	return vs.m.send(&pb.SessionReply{Stream: vs.id, Response: r})
}

// SendMsg implements grpc.ServerStream.
func (vs *muxSessionStream) SendMsg(m any) error {
	r, ok := m.(*pb.SessionResponse)
	if !ok {
		return fmt.Errorf("session stream: cannot send %T", m)
	}
	return vs.Send(r)
}

// RecvMsg implements grpc.ServerStream.
func (vs *muxSessionStream) RecvMsg(m any) error {
	dst, ok := m.(*pb.SessionRequest)
	if !ok {
		return fmt.Errorf("session stream: cannot receive into %T", m)
	}
	r, err := vs.Recv()
	if err != nil {
		return err
	}
	proto.Merge(dst, r)
	return nil
}
