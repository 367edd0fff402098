package client

import (
	"context"
	"testing"

	"google.golang.org/grpc"

	pb "github.com/tenure-io/tenure/api/tenurepb"
)

// fakeSessions records what a Sessions RPC is sent; its Recv blocks until
// the test ends.
type fakeSessions struct {
	grpc.ClientStream
	sent chan *pb.SessionFrames
	done chan struct{}
}

func (f *fakeSessions) Send(m *pb.SessionFrames) error {
	f.sent <- m
	return nil
}

func (f *fakeSessions) Recv() (*pb.SessionReplies, error) {
	<-f.done
	return nil, context.Canceled
}

// TestMuxSendKeepsTheRequestAsSent: a request is encoded after Send
// returns, so changing the message afterwards (a retry gives it a new id)
// must not change what goes out.
func TestMuxSendKeepsTheRequestAsSent(t *testing.T) {
	f := &fakeSessions{sent: make(chan *pb.SessionFrames, 4), done: make(chan struct{})}
	defer close(f.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mc := &muxConn{cs: f, ctx: ctx, cancel: cancel, streams: make(map[uint64]*muxStream), wake: make(chan struct{}, 1)}
	ms := mc.add(ctx, 1)
	req := &pb.SessionRequest{Id: 7, Op: &pb.SessionRequest_KeepAlive{KeepAlive: &pb.KeepAlive{}}}
	if err := ms.Send(req); err != nil {
		t.Fatal(err)
	}
	req.Id = 8 // as a retry does, before the sender loop has run
	go mc.sendLoop()
	got := (<-f.sent).GetFrames()
	if len(got) != 1 || got[0].GetRequest().GetId() != 7 {
		t.Fatalf("sent %v, want the request with id 7", got)
	}
}
