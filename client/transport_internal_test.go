package client

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

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

// TestSendKeepsTheRequestAsSent: a request is encoded after send returns,
// so changing the message afterwards (a retry gives it a new id) must not
// change what goes out.
func TestSendKeepsTheRequestAsSent(t *testing.T) {
	f := &fakeSessions{sent: make(chan *pb.SessionFrames, 4), done: make(chan struct{})}
	defer close(f.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &sessionsRPC{cs: f, ctx: ctx, cancel: cancel, streams: make(map[uint64]*stream), wake: make(chan struct{}, 1)}
	st := &stream{rpc: r, id: 1, done: make(chan struct{})}
	r.streams[1] = st
	req := &pb.SessionRequest{Id: 7, Op: &pb.SessionRequest_KeepAlive{KeepAlive: &pb.KeepAlive{}}}
	if err := st.send(req); err != nil {
		t.Fatal(err)
	}
	req.Id = 8 // as a retry does, before the sender loop has run
	go r.sendLoop()
	got := (<-f.sent).GetFrames()
	if len(got) != 1 || got[0].GetRequest().GetId() != 7 {
		t.Fatalf("sent %v, want the request with id 7", got)
	}
	// A stream the client left tells the server so, and sends nothing more.
	st.leave()
	if got := (<-f.sent).GetFrames(); len(got) != 1 || !got[0].GetEnd() || got[0].GetStream() != 1 {
		t.Fatalf("leaving sent %v, want the stream's end", got)
	}
	if err := st.send(req); err != errDisconnected {
		t.Fatalf("a send after leaving: %v, want errDisconnected", err)
	}
}

// TestCutFramesBoundsAMessage: queued frames go out in messages of at most
// maxBatchBytes, in order, every frame exactly once; a frame larger than
// the bound goes alone.
func TestCutFramesBoundsAMessage(t *testing.T) {
	frame := func(n int) *pb.SessionFrame {
		return &pb.SessionFrame{Stream: 1, Request: &pb.SessionRequest{Op: &pb.SessionRequest_Proclaim{Proclaim: &pb.ProclaimValue{Name: "l", Value: make([]byte, n)}}}}
	}
	var out []*pb.SessionFrame
	for range 5 {
		out = append(out, frame(maxBatchBytes/3))
	}
	out = append(out, frame(maxBatchBytes+1), frame(10))
	var got []*pb.SessionFrame
	for rest := out; len(rest) > 0; {
		var batch []*pb.SessionFrame
		batch, rest = cutFrames(rest)
		if len(batch) == 0 {
			t.Fatal("an empty message")
		}
		if size := proto.Size(&pb.SessionFrames{Frames: batch}); len(batch) > 1 && size > maxBatchBytes+64 {
			t.Fatalf("a message of %d frames and %d bytes, bound %d", len(batch), size, maxBatchBytes)
		}
		got = append(got, batch...)
	}
	if len(got) != len(out) {
		t.Fatalf("%d frames sent, %d queued", len(got), len(out))
	}
	for i := range out {
		if got[i] != out[i] {
			t.Fatalf("frame %d out of order", i)
		}
	}
}
