package client

import (
	"context"
	"errors"
	"io"
	"runtime"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/tenure-io/tenure/api/tenurepb"
)

// The session transport. Every session on an endpoint is carried by one
// Sessions RPC of that endpoint: a session attaches to it as a session
// stream (an id this client picks), and its requests and answers travel
// as frames naming that stream. One goroutine reads the RPC and hands
// each answer to its session; one goroutine sends, and the frames queued
// while it was sending go together in the next message. When the RPC
// breaks, every session stream on it breaks, and the next session stream
// opened starts a new RPC.

// transport is an endpoint's Sessions RPC, started when a session first
// needs it and again after it broke.
type transport struct {
	api pb.TenureClient
	// hint is given the header of each Sessions RPC (its leader hint,
	// prefer.go).
	hint func(metadata.MD)

	// mu guards cur and nextID.
	mu     sync.Mutex
	cur    *sessionsRPC
	nextID uint64
	closed bool
}

// attach starts a session stream for s on endpoint ep. ctx bounds only the
// start of a new RPC, not the stream.
func (t *transport) attach(ctx context.Context, s *Session, ep uint32) (*stream, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, ErrClosed
	}
	r := t.cur
	if r == nil || r.broken() {
		var err error
		if r, err = t.dial(ctx); err != nil {
			return nil, err
		}
		t.cur = r
	}
	t.nextID++
	st := &stream{rpc: r, id: t.nextID, ep: ep, s: s, first: make(chan openAnswer, 1), done: make(chan struct{})}
	r.mu.Lock()
	err := r.err
	if err == nil {
		r.streams[st.id] = st
	}
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return st, nil
}

// dial starts a Sessions RPC; ctx bounds only the start, not the RPC.
func (t *transport) dial(ctx context.Context) (*sessionsRPC, error) {
	rctx, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, cancel)
	cs, err := t.api.Sessions(rctx)
	if !stop() || err != nil {
		cancel()
		if err == nil {
			err = ctx.Err()
		}
		return nil, err
	}
	r := &sessionsRPC{cs: cs, ctx: rctx, cancel: cancel, streams: make(map[uint64]*stream), wake: make(chan struct{}, 1), hint: t.hint}
	go r.recvLoop()
	go r.sendLoop()
	return r, nil
}

// close ends the current Sessions RPC; no other starts after it.
func (t *transport) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	if t.cur != nil {
		t.cur.cancel()
	}
}

// sessionsRPC is one Sessions RPC.
type sessionsRPC struct {
	cs     pb.Tenure_SessionsClient
	ctx    context.Context
	cancel context.CancelFunc
	wake   chan struct{} // frames were queued
	hint   func(metadata.MD)

	// mu guards the fields below.
	mu      sync.Mutex
	streams map[uint64]*stream // the session streams open on the server
	err     error              // why the RPC broke; nil while it works
	out     []*pb.SessionFrame
}

func (r *sessionsRPC) broken() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err != nil
}

func (r *sessionsRPC) recvLoop() {
	for first := true; ; first = false {
		in, err := r.cs.Recv()
		if first && err == nil && r.hint != nil {
			// The header came before the first message: no wait.
			if md, herr := r.cs.Header(); herr == nil {
				r.hint(md)
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = status.Error(codes.Unavailable, "the server ended the sessions stream")
			}
			r.mu.Lock()
			r.err = err
			streams := r.streams
			r.streams = map[uint64]*stream{}
			r.out = nil
			r.mu.Unlock()
			r.cancel()
			for _, st := range streams {
				st.ended(err)
			}
			return
		}
		for _, rep := range in.GetReplies() {
			r.mu.Lock()
			st := r.streams[rep.GetStream()]
			if st != nil && rep.GetEnd() {
				delete(r.streams, rep.GetStream())
			}
			r.mu.Unlock()
			switch {
			case st == nil: // a stream this client has left
			case rep.GetEnd():
				st.ended(endError(rep))
			default:
				st.received(rep.GetResponse())
			}
		}
	}
}

// endError is why the server ended a session stream.
func endError(rep *pb.SessionReply) error {
	code := codes.Code(rep.GetCode())
	if code == codes.OK {
		return status.Error(codes.Unavailable, "the server ended the session stream")
	}
	return withLeader(fromReason(rep.GetReason(), code, rep.GetMessage()), rep.GetLeaderAddr())
}

// queue adds f to the frames to send, unless the stream is no longer
// open on the server (left, ended, or the RPC broke).
func (r *sessionsRPC) queue(stream uint64, f *pb.SessionFrame) bool {
	r.mu.Lock()
	_, open := r.streams[stream]
	if open {
		r.out = append(r.out, f)
	}
	r.mu.Unlock()
	if open {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
	return open
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

// sendLoop sends the queued frames in as few messages as possible: the
// frames queued while a message was being sent go together in the next.
func (r *sessionsRPC) sendLoop() {
	for {
		select {
		case <-r.wake:
		case <-r.ctx.Done():
			return
		}
		// Yield once before collecting. The frames of a round come from
		// many goroutines (one per session, each woken by its answer),
		// and the one that wakes this loop hands it its processor at
		// once: without the yield the loop would send each frame alone
		// while the others are still runnable behind it. (The server's
		// answers need no yield: the node's answering goroutine queues
		// a committed batch's answers in one loop before the sender
		// runs.) Measured: about 15 % less client CPU per lock+unlock
		// cycle (docs/benchmarks.md).
		runtime.Gosched()
		r.mu.Lock()
		batch, rest := cutFrames(r.out)
		r.out = rest
		r.mu.Unlock()
		if len(rest) > 0 {
			select {
			case r.wake <- struct{}{}:
			default:
			}
		}
		if len(batch) == 0 {
			continue
		}
		if err := r.cs.Send(&pb.SessionFrames{Frames: batch}); err != nil {
			r.cancel() // recvLoop gets the reason and breaks every stream
			return
		}
	}
}

// stream is one session stream: a session's attachment to a Sessions RPC.
type stream struct {
	rpc *sessionsRPC
	id  uint64
	ep  uint32 // the index of its endpoint
	s   *Session
	// first receives the answer to the open (or why the stream ended
	// before one came); answered says it was taken. Every later answer
	// goes to the session.
	first    chan openAnswer
	answered atomic.Bool
	// done is closed when the stream is over.
	done     chan struct{}
	doneOnce sync.Once
}

type openAnswer struct {
	resp *pb.SessionResponse
	err  error
}

// send queues req on the stream. It is encoded later, by the sender loop,
// so the frame takes a copy of the top level (the id: a retried request
// is the same message with a new id); the operation inside is never
// changed after a send. It fails with errDisconnected when the stream is
// over.
func (st *stream) send(req *pb.SessionRequest) error {
	f := &pb.SessionFrame{Stream: st.id, Request: &pb.SessionRequest{Id: req.GetId(), Op: req.Op}}
	if !st.rpc.queue(st.id, f) {
		return errDisconnected
	}
	return nil
}

// received hands an answer on, on the RPC's reader goroutine.
func (st *stream) received(resp *pb.SessionResponse) {
	if st.answered.CompareAndSwap(false, true) {
		st.first <- openAnswer{resp: resp}
		return
	}
	st.s.dispatch(st, resp)
}

// ended is called once the server ended the stream, or the RPC broke.
func (st *stream) ended(err error) {
	st.doneOnce.Do(func() { close(st.done) })
	if st.answered.CompareAndSwap(false, true) {
		st.first <- openAnswer{err: err}
		return
	}
	st.s.streamBroken(st)
}

// leave ends the stream from this side: the server is told (the session
// lives on there), and nothing more is delivered from it. It never
// blocks.
func (st *stream) leave() {
	r := st.rpc
	r.mu.Lock()
	_, open := r.streams[st.id]
	if open {
		delete(r.streams, st.id)
		r.out = append(r.out, &pb.SessionFrame{Stream: st.id, End: true})
	}
	r.mu.Unlock()
	if open {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
	st.doneOnce.Do(func() { close(st.done) })
}
