package server_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/testutil"
)

// sessionsRPC is a raw Sessions stream and what it has received so far.
type sessionsRPC struct {
	t   *testing.T
	st  pb.Tenure_SessionsClient
	got []*pb.SessionReply
}

// startSessionsRPC starts a server and opens a Sessions RPC on it; both
// end with the test.
func startSessionsRPC(t *testing.T) *sessionsRPC {
	t.Helper()
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	conn, err := grpc.NewClient(srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	st, err := pb.NewTenureClient(conn).Sessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &sessionsRPC{t: t, st: st}
}

func (r *sessionsRPC) send(frames ...*pb.SessionFrame) {
	r.t.Helper()
	if err := r.st.Send(&pb.SessionFrames{Frames: frames}); err != nil {
		r.t.Fatal(err)
	}
}

// await receives until it has a reply on stream that satisfies ok, and
// returns it (replies on other streams are kept for later awaits).
func (r *sessionsRPC) await(stream uint64, ok func(*pb.SessionReply) bool) *pb.SessionReply {
	r.t.Helper()
	for {
		for i, rep := range r.got {
			if rep.GetStream() == stream && ok(rep) {
				r.got = append(r.got[:i], r.got[i+1:]...)
				return rep
			}
		}
		in, err := r.st.Recv()
		if err != nil {
			r.t.Fatalf("waiting on stream %d: %v", stream, err)
		}
		r.got = append(r.got, in.GetReplies()...)
	}
}

func req(stream, id uint64, op any) *pb.SessionFrame {
	r := &pb.SessionRequest{Id: id}
	switch o := op.(type) {
	case *pb.OpenSession:
		r.Op = &pb.SessionRequest_Open{Open: o}
	case *pb.AcquireLock:
		r.Op = &pb.SessionRequest_Acquire{Acquire: o}
	case *pb.ReleaseLock:
		r.Op = &pb.SessionRequest_Release{Release: o}
	case *pb.KeepAlive:
		r.Op = &pb.SessionRequest_KeepAlive{KeepAlive: o}
	case *pb.CloseSession:
		r.Op = &pb.SessionRequest_Close{Close: o}
	}
	return &pb.SessionFrame{Stream: stream, Request: r}
}

func anyReply(*pb.SessionReply) bool { return true }

// TestSessionsCarriesIndependentSessionStreams: session streams sharing one
// Sessions RPC are each opened, served and ended on their own, and a
// malformed or abandoned one does not disturb the others.
func TestSessionsCarriesIndependentSessionStreams(t *testing.T) {
	r := startSessionsRPC(t)

	// Two opens and a frame with neither request nor end, in one message.
	r.send(req(1, 1, &pb.OpenSession{Owner: "a", TtlMs: 10_000}), req(2, 1, &pb.OpenSession{Owner: "b", TtlMs: 10_000}), &pb.SessionFrame{Stream: 3})
	a := r.await(1, anyReply).GetResponse().GetOpened()
	b := r.await(2, anyReply).GetResponse().GetOpened()
	if a == nil || b == nil || a.GetSessionId() == b.GetSessionId() {
		t.Fatalf("opened %v and %v, want two sessions", a, b)
	}
	if bad := r.await(3, anyReply); !bad.GetEnd() || codes.Code(bad.GetCode()) != codes.InvalidArgument {
		t.Fatalf("malformed frame: %v, want the stream ended with INVALID_ARGUMENT", bad)
	}

	// Both want the same lock: the first is granted, the second queued.
	r.send(req(1, 2, &pb.AcquireLock{Name: "L", Wait: true}))
	granted := r.await(1, anyReply).GetResponse().GetGranted()
	if granted == nil {
		t.Fatal("the first acquire was not granted")
	}
	r.send(req(2, 2, &pb.AcquireLock{Name: "L", Wait: true}))
	if q := r.await(2, anyReply).GetResponse().GetQueued(); q == nil || q.GetPosition() != 1 {
		t.Fatalf("the second acquire: %v, want queued at position 1", q)
	}

	// Stream 1 is left: its session and hold stay. Stream 2 is still
	// served.
	r.send(&pb.SessionFrame{Stream: 1, End: true}, req(2, 3, &pb.KeepAlive{}))
	if k := r.await(2, func(rep *pb.SessionReply) bool { return rep.GetResponse().GetKept() != nil }); k == nil {
		t.Fatal("no keepalive answer")
	}

	// Session a cannot be resumed without its secret: the stream ends
	// with PERMISSION_DENIED, and nothing changes.
	r.send(req(5, 1, &pb.OpenSession{SessionId: a.GetSessionId(), TtlMs: 10_000}))
	if bad := r.await(5, anyReply); !bad.GetEnd() || codes.Code(bad.GetCode()) != codes.PermissionDenied || bad.GetReason() != pb.ErrorReason_ERROR_REASON_PERMISSION_DENIED {
		t.Fatalf("resume without the secret: %v, want the stream ended with PERMISSION_DENIED and its reason", bad)
	}
	// Session a, resumed on a new stream with its secret, releases; b gets the lock.
	r.send(req(4, 1, &pb.OpenSession{SessionId: a.GetSessionId(), TtlMs: 10_000, Secret: a.GetSecret()}))
	if r.await(4, anyReply).GetResponse().GetOpened() == nil {
		t.Fatal("resuming session a failed")
	}
	r.send(req(4, 2, &pb.ReleaseLock{Name: "L", Token: granted.GetToken()}))
	if r.await(4, anyReply).GetResponse().GetReleased() == nil {
		t.Fatal("release failed")
	}
	if g := r.await(2, func(rep *pb.SessionReply) bool { return rep.GetResponse().GetId() == 2 }).GetResponse().GetGranted(); g == nil || g.GetToken() <= granted.GetToken() {
		t.Fatalf("b's grant: %v, want a larger token than %d", g, granted.GetToken())
	}

	// Closing b ends its stream normally, after the answer.
	r.send(req(2, 4, &pb.CloseSession{}))
	if r.await(2, anyReply).GetResponse().GetClosed() == nil {
		t.Fatal("close was not answered")
	}
	if end := r.await(2, anyReply); !end.GetEnd() || end.GetCode() != 0 {
		t.Fatalf("after close: %v, want a normal end", end)
	}
}

// TestSessionsServesPipelinedRequestsInOrder: requests sent right behind
// the open, before it is answered, are all served, and a close ends the
// stream after the answers of what came before it.
func TestSessionsServesPipelinedRequestsInOrder(t *testing.T) {
	r := startSessionsRPC(t)
	r.send(req(1, 1, &pb.OpenSession{Owner: "a", TtlMs: 10_000}), req(1, 2, &pb.AcquireLock{Name: "P", Wait: true}), req(1, 3, &pb.KeepAlive{}), req(1, 4, &pb.CloseSession{}), req(1, 5, &pb.KeepAlive{}))
	if r.await(1, anyReply).GetResponse().GetOpened() == nil {
		t.Fatal("the first answer is not the open's")
	}
	seen := map[uint64]*pb.SessionResponse{}
	for {
		rep := r.await(1, anyReply)
		if rep.GetEnd() {
			if rep.GetCode() != 0 {
				t.Fatalf("the stream ended with code %d: %s", rep.GetCode(), rep.GetMessage())
			}
			break
		}
		seen[rep.GetResponse().GetId()] = rep.GetResponse()
		if rep.GetResponse().GetClosed() != nil && (seen[2].GetGranted() == nil || seen[3].GetKept() == nil) {
			t.Fatalf("closed before the acquire and the keepalive were answered: %v", seen)
		}
	}
	if seen[4].GetClosed() == nil {
		t.Fatalf("the close was not answered: %v", seen)
	}
	if _, ok := seen[5]; ok {
		t.Fatal("a request sent after the close was served")
	}
}
