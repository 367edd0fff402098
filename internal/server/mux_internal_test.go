package server

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tenure-io/tenure/api/tenurepb"
)

// TestSessionStreamBacklogIsBounded: a client that keeps sending on a
// session stream the server does not read has that stream ended with
// RESOURCE_EXHAUSTED instead of growing the server's memory.
func TestSessionStreamBacklogIsBounded(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	vs := &muxSessionStream{ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1)}
	for range maxMuxBacklog {
		vs.deliver(&pb.SessionRequest{})
	}
	if vs.failed != nil || ctx.Err() != nil {
		t.Fatalf("ended after %d requests: %v", maxMuxBacklog, vs.failed)
	}
	vs.deliver(&pb.SessionRequest{})
	if status.Code(vs.failed) != codes.ResourceExhausted || ctx.Err() == nil {
		t.Fatalf("after %d requests: %v, want the stream ended with RESOURCE_EXHAUSTED", maxMuxBacklog+1, vs.failed)
	}
	// What was accepted is still read, in order, before the end.
	for range maxMuxBacklog {
		if _, err := vs.Recv(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSessionsStopsReadingWhileAnswersPileUp: with maxQueuedReplies
// answers waiting to be sent, the server reads no further requests (it
// waits, here until its context ends) until the sender has taken some.
func TestSessionsStopsReadingWhileAnswersPileUp(t *testing.T) {
	m := &muxServer{room: make(chan struct{}, 1)}
	m.out = make([]*pb.SessionReply, maxQueuedReplies)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if err := m.waitRoom(ended); !errors.Is(err, context.Canceled) {
		t.Fatalf("with %d answers queued: %v, want it to wait (until its context ended)", maxQueuedReplies, err)
	}
	m.out = m.out[:maxQueuedReplies-1]
	if err := m.waitRoom(context.Background()); err != nil {
		t.Fatalf("with room: %v", err)
	}
}

// TestRepliesAreCutIntoBoundedMessages: a long queue of replies leaves in
// messages of at most maxRepliesPerMessage, in order.
func TestRepliesAreCutIntoBoundedMessages(t *testing.T) {
	out := make([]*pb.SessionReply, maxRepliesPerMessage+1)
	for i := range out {
		out[i] = &pb.SessionReply{Stream: uint64(i)}
	}
	batch, rest := cutReplies(out)
	if len(batch) != maxRepliesPerMessage || len(rest) != 1 || rest[0].GetStream() != maxRepliesPerMessage {
		t.Fatalf("cut into %d and %d", len(batch), len(rest))
	}
	if batch, rest = cutReplies(rest); len(batch) != 1 || rest != nil {
		t.Fatalf("the rest cut into %d and %d", len(batch), len(rest))
	}
}
