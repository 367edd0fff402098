package client

import (
	"context"
	"io"
	"runtime"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/tenure-io/tenure/api/tenurepb"
)

// sessionConn is one session stream: a Session RPC of its own, or one
// stream of the endpoint's shared Sessions RPC.
type sessionConn interface {
	Send(*pb.SessionRequest) error
	Recv() (*pb.SessionResponse, error)
	// Context ends when the stream is over.
	Context() context.Context
}

// pushConn is a sessionConn that can deliver its responses by calling
// back instead of through Recv: no goroutine of its own per session.
type pushConn interface {
	// push makes the stream call onResp for every response from now on
	// (starting with those not yet received), in order, and then onEnd
	// once, when the stream is over. Recv must not be called after push.
	push(onResp func(*pb.SessionResponse), onEnd func(error))
}

// sessionMux carries the session streams of every session on one endpoint
// over one Sessions RPC, so that requests (and responses) that are ready
// together travel in one gRPC message, and one goroutine reads for all of
// them. When that RPC breaks, every stream on it breaks, as they would on
// a broken connection, and the next stream opened starts a new RPC.
type sessionMux struct {
	api pb.TenureClient

	// mu guards cur and nextID.
	mu     sync.Mutex
	cur    *muxConn
	nextID uint64
}

// open starts a session stream that lasts until ctx ends, the server ends
// it, or the Sessions RPC breaks.
func (sm *sessionMux) open(ctx context.Context) (sessionConn, error) {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	mc := sm.cur
	if mc == nil || mc.broken() {
		var err error
		if mc, err = sm.dial(ctx); err != nil {
			return nil, err
		}
		sm.cur = mc
	}
	sm.nextID++
	return mc.add(ctx, sm.nextID), nil
}

// dial starts a Sessions RPC; ctx bounds only the start, not the RPC.
func (sm *sessionMux) dial(ctx context.Context) (*muxConn, error) {
	mctx, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, cancel)
	cs, err := sm.api.Sessions(mctx)
	if !stop() || err != nil {
		cancel()
		if err == nil {
			err = ctx.Err()
		}
		return nil, err
	}
	mc := &muxConn{cs: cs, ctx: mctx, cancel: cancel, streams: make(map[uint64]*muxStream), wake: make(chan struct{}, 1)}
	go mc.recvLoop()
	go mc.sendLoop()
	return mc, nil
}

// close ends the current Sessions RPC.
func (sm *sessionMux) close() {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	if sm.cur != nil {
		sm.cur.cancel()
	}
}

// muxConn is one Sessions RPC.
type muxConn struct {
	cs     pb.Tenure_SessionsClient
	ctx    context.Context
	cancel context.CancelFunc
	wake   chan struct{} // frames were queued

	// mu guards streams, err and out.
	mu      sync.Mutex
	streams map[uint64]*muxStream
	err     error // why the RPC broke; nil while it works
	out     []*pb.SessionFrame
}

func (mc *muxConn) broken() bool {
	mc.mu.Lock()
	defer mc.mu.Unlock()
	return mc.err != nil
}

func (mc *muxConn) add(ctx context.Context, id uint64) *muxStream {
	sctx, cancel := context.WithCancel(ctx)
	ms := &muxStream{mc: mc, id: id, ctx: sctx, cancel: cancel, wake: make(chan struct{}, 1)}
	mc.mu.Lock()
	err := mc.err
	if err == nil {
		mc.streams[id] = ms
	}
	mc.mu.Unlock()
	if err != nil {
		ms.end(err)
	}
	// Leaving a stream the server has not ended tells the server so.
	context.AfterFunc(sctx, func() {
		mc.mu.Lock()
		_, open := mc.streams[id]
		delete(mc.streams, id)
		mc.mu.Unlock()
		if open {
			mc.send(&pb.SessionFrame{Stream: id, End: true})
		}
		ms.end(status.FromContextError(sctx.Err()).Err())
	})
	return ms
}

func (mc *muxConn) recvLoop() {
	for {
		in, err := mc.cs.Recv()
		if err != nil {
			if err == io.EOF {
				err = status.Error(codes.Unavailable, "the server ended the sessions stream")
			}
			mc.mu.Lock()
			mc.err = err
			streams := mc.streams
			mc.streams = map[uint64]*muxStream{}
			mc.mu.Unlock()
			mc.cancel()
			for _, ms := range streams {
				ms.end(err)
			}
			return
		}
		for _, r := range in.GetReplies() {
			mc.mu.Lock()
			ms := mc.streams[r.GetStream()]
			if ms != nil && r.GetEnd() {
				delete(mc.streams, r.GetStream())
			}
			mc.mu.Unlock()
			switch {
			case ms == nil:
			case r.GetEnd():
				var err error = io.EOF
				if c := codes.Code(r.GetCode()); c != codes.OK {
					err = status.Error(c, r.GetMessage())
				}
				ms.end(err)
			default:
				ms.deliver(r.GetResponse())
			}
		}
	}
}

// send queues f for the sender loop.
func (mc *muxConn) send(f *pb.SessionFrame) bool {
	mc.mu.Lock()
	if mc.err != nil {
		mc.mu.Unlock()
		return false
	}
	mc.out = append(mc.out, f)
	mc.mu.Unlock()
	mc.poke()
	return true
}

func (mc *muxConn) poke() {
	select {
	case mc.wake <- struct{}{}:
	default:
	}
}

// maxBatchBytes bounds one message of a Sessions RPC, far below gRPC's
// default 4 MiB receive limit.
const maxBatchBytes = 1 << 20

// cutFrames splits queued frames into the next message (at least one
// frame, at most maxBatchBytes unless that one frame is larger) and the
// rest. Frames are measured: a request may carry a value of many KiB.
func cutFrames(frames []*pb.SessionFrame) (batch, rest []*pb.SessionFrame) {
	n := 0
	for i, f := range frames {
		if n += proto.Size(f); n > maxBatchBytes && i > 0 {
			return frames[:i], frames[i:]
		}
	}
	return frames, nil
}

// sendLoop sends the queued frames, as few messages as possible: frames
// queued while a message is being sent go together in the next one.
func (mc *muxConn) sendLoop() {
	for {
		select {
		case <-mc.wake:
		case <-mc.ctx.Done():
			return
		}
		runtime.Gosched() // let the other senders that were woken with us queue too
		mc.mu.Lock()
		batch, rest := cutFrames(mc.out)
		mc.out = rest
		mc.mu.Unlock()
		if len(rest) > 0 {
			mc.poke()
		}
		if len(batch) == 0 {
			continue
		}
		if err := mc.cs.Send(&pb.SessionFrames{Frames: batch}); err != nil {
			mc.cancel() // recvLoop gets the reason and breaks every stream
			return
		}
	}
}

// muxStream is one session stream of a Sessions RPC.
type muxStream struct {
	mc     *muxConn
	id     uint64
	ctx    context.Context
	cancel context.CancelFunc
	wake   chan struct{}

	// mu guards the fields below; responses are delivered under it, so in
	// order.
	mu     sync.Mutex
	inbox  []*pb.SessionResponse
	done   error
	onResp func(*pb.SessionResponse)
	onEnd  func(error)
}

func (ms *muxStream) deliver(r *pb.SessionResponse) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.onResp != nil {
		ms.onResp(r)
		return
	}
	ms.inbox = append(ms.inbox, r)
	select {
	case ms.wake <- struct{}{}:
	default:
	}
}

// end ends the stream with err (io.EOF: a normal end).
func (ms *muxStream) end(err error) {
	ms.mu.Lock()
	first := ms.done == nil
	if first {
		ms.done = err
	}
	onEnd := ms.onEnd
	if first && onEnd != nil {
		onEnd(err)
	}
	ms.mu.Unlock()
	ms.cancel()
}

func (ms *muxStream) push(onResp func(*pb.SessionResponse), onEnd func(error)) {
	ms.mu.Lock()
	backlog, done := ms.inbox, ms.done
	ms.inbox = nil
	ms.onResp, ms.onEnd = onResp, onEnd
	if len(backlog) == 0 && done == nil {
		ms.mu.Unlock()
		return
	}
	// The caller may hold locks the callbacks take: deliver the backlog
	// from another goroutine, holding mu so that later responses wait.
	go func() {
		defer ms.mu.Unlock()
		for _, r := range backlog {
			onResp(r)
		}
		if done != nil {
			onEnd(done)
		}
	}()
}

func (ms *muxStream) Context() context.Context { return ms.ctx }

// Send queues r; it is encoded later, by the sender loop. A gRPC stream's
// Send encodes before it returns, and callers count on that: a retried
// request is the same message with a new id. So the frame takes a copy of
// the top level (the id); the operation inside is never changed after a
// send.
func (ms *muxStream) Send(r *pb.SessionRequest) error {
	r = &pb.SessionRequest{Id: r.GetId(), Op: r.Op}
	if ms.ctx.Err() != nil || !ms.mc.send(&pb.SessionFrame{Stream: ms.id, Request: r}) {
		return io.EOF // as a gRPC stream's Send: Recv tells why
	}
	return nil
}

// Recv returns the next response; after the end, the error the stream
// ended with (io.EOF for a normal end), as a gRPC stream's Recv would.
func (ms *muxStream) Recv() (*pb.SessionResponse, error) {
	for {
		ms.mu.Lock()
		if len(ms.inbox) > 0 {
			r := ms.inbox[0]
			ms.inbox[0] = nil
			ms.inbox = ms.inbox[1:]
			ms.mu.Unlock()
			return r, nil
		}
		done := ms.done
		ms.mu.Unlock()
		if done != nil {
			return nil, done
		}
		select {
		case <-ms.wake:
		case <-ms.ctx.Done():
			ms.mu.Lock()
			done, pending := ms.done, len(ms.inbox) > 0
			ms.mu.Unlock()
			if pending {
				continue
			}
			if done != nil {
				return nil, done
			}
			return nil, status.FromContextError(ms.ctx.Err()).Err()
		}
	}
}
