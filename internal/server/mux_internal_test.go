package server

import (
	"context"
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
