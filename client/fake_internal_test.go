package client

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tenure-io/tenure/api/tenurepb"
)

// fakeTenure is a scripted Tenure server on loopback for the client's own
// tests (the tests against the real server live in the server's module,
// internal/clienttest): it opens sessions, confirms keepalives, grants or
// queues acquires, and answers "not the leader" to everything while it is
// not the leader.
type fakeTenure struct {
	pb.UnimplementedTenureServer
	addr string
	stop func() // stops serving (also at the end of the test)

	// mu guards the fields below.
	mu       sync.Mutex
	leader   bool
	queue    bool   // acquires wait in line until grantQueued
	token    uint64 // the last token granted
	acquires int    // acquire requests received
	closes   int    // close requests answered
	waiting  []queuedAcquire
	hint     string       // the leader's address named in "not the leader"
	members  []*pb.Member // MemberList's answer
}

type queuedAcquire struct {
	srv    pb.Tenure_SessionsServer
	stream uint64
	id     uint64
	sendMu *sync.Mutex
}

// startFake serves a fakeTenure on a random loopback port until the test
// ends; opts are the gRPC server's options.
func startFake(t *testing.T, leader bool, opts ...grpc.ServerOption) *fakeTenure {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeTenure{addr: lis.Addr().String(), leader: leader, token: 100}
	gs := grpc.NewServer(opts...)
	pb.RegisterTenureServer(gs, f)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = gs.Serve(lis)
	}()
	var once sync.Once
	f.stop = func() {
		once.Do(func() {
			gs.Stop()
			<-done
		})
	}
	t.Cleanup(f.stop)
	return f
}

func (f *fakeTenure) setLeader(v bool) {
	f.mu.Lock()
	f.leader = v
	f.mu.Unlock()
}

func (f *fakeTenure) setQueue(v bool) {
	f.mu.Lock()
	f.queue = v
	f.mu.Unlock()
}

func (f *fakeTenure) counts() (acquires, closes int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.acquires, f.closes
}

// grantQueued grants the acquires waiting in line and reports how many.
func (f *fakeTenure) grantQueued() int {
	f.mu.Lock()
	waiting := f.waiting
	f.waiting = nil
	grants := make([]uint64, len(waiting))
	for i := range waiting {
		f.token++
		grants[i] = f.token
	}
	f.mu.Unlock()
	for i, q := range waiting {
		q.sendMu.Lock()
		_ = q.srv.Send(&pb.SessionReplies{Replies: []*pb.SessionReply{{Stream: q.stream, Response: &pb.SessionResponse{Id: q.id, Result: &pb.SessionResponse_Granted{Granted: &pb.LockGranted{Token: grants[i]}}}}}})
		q.sendMu.Unlock()
	}
	return len(waiting)
}

func (f *fakeTenure) set(fn func(f *fakeTenure)) {
	f.mu.Lock()
	fn(f)
	f.mu.Unlock()
}

// notLeaderLocked is the fake's "not the leader" answer on a session
// stream, naming the leader it was told of.
func (f *fakeTenure) notLeaderLocked() *pb.SessionResponse {
	return &pb.SessionResponse{Result: &pb.SessionResponse_Error{Error: &pb.Error{Reason: pb.ErrorReason_ERROR_REASON_NOT_LEADER, Code: uint32(codes.Unavailable), Message: "not the leader", LeaderAddr: f.hint}}}
}

// MemberList implements pb.TenureServer.
func (f *fakeTenure) MemberList(context.Context, *pb.MemberListRequest) (*pb.MemberListResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &pb.MemberListResponse{Members: f.members}, nil
}

// FencedGet implements pb.TenureServer: nothing is stored; a follower
// answers "not the leader" as the service does (the detail, with the
// leader's address).
func (f *fakeTenure) FencedGet(_ context.Context, req *pb.FencedGetRequest) (*pb.FencedGetResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.leader {
		st, err := status.New(codes.Unavailable, "not the leader").WithDetails(&pb.Error{Reason: pb.ErrorReason_ERROR_REASON_NOT_LEADER, Code: uint32(codes.Unavailable), LeaderAddr: f.hint})
		if err != nil {
			return nil, err
		}
		return nil, st.Err()
	}
	return &pb.FencedGetResponse{Key: req.GetKey()}, nil
}

// Sessions implements pb.TenureServer.
func (f *fakeTenure) Sessions(srv pb.Tenure_SessionsServer) error {
	var sendMu sync.Mutex
	for {
		in, err := srv.Recv()
		if err != nil {
			return nil
		}
		var out []*pb.SessionReply
		for _, fr := range in.GetFrames() {
			req := fr.GetRequest()
			if fr.GetEnd() || req == nil {
				continue
			}
			if end := f.refuseOpen(req); end != nil {
				end.Stream = fr.GetStream()
				out = append(out, end)
				continue
			}
			resp := f.answer(srv, &sendMu, fr.GetStream(), req)
			if resp == nil {
				continue
			}
			resp.Id = req.GetId()
			out = append(out, &pb.SessionReply{Stream: fr.GetStream(), Response: resp})
		}
		if len(out) == 0 {
			continue
		}
		sendMu.Lock()
		err = srv.Send(&pb.SessionReplies{Replies: out})
		sendMu.Unlock()
		if err != nil {
			return nil
		}
	}
}

// refuseOpen is the end of a session stream whose open a follower
// refuses, as the service ends it: NOT_LEADER, naming the leader it was
// told of (nil: req is no open, or the fake leads).
func (f *fakeTenure) refuseOpen(req *pb.SessionRequest) *pb.SessionReply {
	f.mu.Lock()
	defer f.mu.Unlock()
	if req.GetOpen() == nil || f.leader {
		return nil
	}
	return &pb.SessionReply{End: true, Code: uint32(codes.Unavailable), Reason: pb.ErrorReason_ERROR_REASON_NOT_LEADER, Message: "not the leader", LeaderAddr: f.hint}
}

// answer is the fake's answer to req (nil: none now).
func (f *fakeTenure) answer(srv pb.Tenure_SessionsServer, sendMu *sync.Mutex, stream uint64, req *pb.SessionRequest) *pb.SessionResponse {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, cancel := req.GetOp().(*pb.SessionRequest_Cancel); !f.leader && !cancel {
		return f.notLeaderLocked()
	}
	switch op := req.GetOp().(type) {
	case *pb.SessionRequest_Open:
		return &pb.SessionResponse{Result: &pb.SessionResponse_Opened{Opened: &pb.SessionOpened{SessionId: 7, TtlMs: op.Open.GetTtlMs(), Secret: []byte("secret")}}}
	case *pb.SessionRequest_KeepAlive:
		return &pb.SessionResponse{Result: &pb.SessionResponse_Kept{Kept: &pb.KeepAliveAck{}}}
	case *pb.SessionRequest_Acquire:
		f.acquires++
		if f.queue {
			f.waiting = append(f.waiting, queuedAcquire{srv: srv, stream: stream, id: req.GetId(), sendMu: sendMu})
			return &pb.SessionResponse{Result: &pb.SessionResponse_Queued{Queued: &pb.LockQueued{Position: 1}}}
		}
		f.token++
		return &pb.SessionResponse{Result: &pb.SessionResponse_Granted{Granted: &pb.LockGranted{Token: f.token}}}
	case *pb.SessionRequest_Cancel:
		for i, q := range f.waiting {
			if q.stream == stream && q.id == op.Cancel.GetRequestId() {
				f.waiting = append(f.waiting[:i], f.waiting[i+1:]...)
				break
			}
		}
		return &pb.SessionResponse{Id: op.Cancel.GetRequestId(), Result: &pb.SessionResponse_Error{Error: &pb.Error{Reason: pb.ErrorReason_ERROR_REASON_CANCELLED, Code: uint32(codes.Canceled), Message: "cancelled"}}}
	case *pb.SessionRequest_Release:
		return &pb.SessionResponse{Result: &pb.SessionResponse_Released{Released: &pb.LockReleased{}}}
	case *pb.SessionRequest_Close:
		f.closes++
		return &pb.SessionResponse{Result: &pb.SessionResponse_Closed{Closed: &pb.SessionClosed{}}}
	}
	return &pb.SessionResponse{Result: &pb.SessionResponse_Error{Error: &pb.Error{Reason: pb.ErrorReason_ERROR_REASON_INVALID, Code: uint32(codes.InvalidArgument), Message: "unexpected request"}}}
}

// dialFake dials the fakes' addresses and closes the client when the test
// ends.
func dialFake(t *testing.T, fs ...*fakeTenure) *Client {
	t.Helper()
	addrs := ""
	for i, f := range fs {
		if i > 0 {
			addrs += ","
		}
		addrs += f.addr
	}
	c, err := Dial(context.Background(), addrs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// testCtx is a context for one test's requests.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
