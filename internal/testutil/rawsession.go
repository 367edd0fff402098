package testutil

import (
	"context"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tenure-io/tenure/api/tenurepb"
)

// RawSession is one session stream on a Sessions RPC of its own, for
// tests that speak the wire protocol: Send a request, Recv the answers in
// order. The end of the session stream comes back from Recv as an error:
// its status (with the server's reason as a pb.Error detail), or io.EOF
// for a normal end. As on a gRPC stream, one goroutine may Send while
// another receives.
type RawSession struct {
	rpc  pb.Tenure_SessionsClient
	in   []*pb.SessionResponse // received, not yet returned
	done error                 // why the stream is over
}

// rawStream is the session stream a RawSession speaks on.
const rawStream = 1

// OpenRawSession starts a Sessions RPC on api that lasts until ctx ends.
func OpenRawSession(ctx context.Context, api pb.TenureClient) (*RawSession, error) {
	rpc, err := api.Sessions(ctx)
	if err != nil {
		return nil, err
	}
	return &RawSession{rpc: rpc}, nil
}

// Send sends req on the session stream.
func (r *RawSession) Send(req *pb.SessionRequest) error {
	return r.rpc.Send(&pb.SessionFrames{Frames: []*pb.SessionFrame{{Stream: rawStream, Request: req}}})
}

// Recv returns the next answer, or the error the stream ended with.
func (r *RawSession) Recv() (*pb.SessionResponse, error) {
	for len(r.in) == 0 {
		if r.done != nil {
			return nil, r.done
		}
		msg, err := r.rpc.Recv()
		if err != nil {
			r.done = err
			return nil, err
		}
		for _, rep := range msg.GetReplies() {
			switch {
			case rep.GetStream() != rawStream || r.done != nil:
			case rep.GetEnd():
				r.done = endStatus(rep)
			default:
				r.in = append(r.in, rep.GetResponse())
			}
		}
	}
	resp := r.in[0]
	r.in = r.in[1:]
	return resp, nil
}

// endStatus is the error of a session stream's end.
func endStatus(rep *pb.SessionReply) error {
	code := codes.Code(rep.GetCode())
	if code == codes.OK {
		return io.EOF
	}
	st := status.New(code, rep.GetMessage())
	if rep.GetReason() != pb.ErrorReason_ERROR_REASON_UNSPECIFIED {
		if d, err := st.WithDetails(&pb.Error{Reason: rep.GetReason(), Code: rep.GetCode(), Message: rep.GetMessage()}); err == nil {
			st = d
		}
	}
	return st.Err()
}
