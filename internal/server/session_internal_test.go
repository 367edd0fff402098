package server

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"google.golang.org/grpc/codes"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/fsm"
)

// TestSessionStreamBacklogIsBounded: a client that keeps sending on a
// session stream whose open is not answered yet has that stream ended
// with RESOURCE_EXHAUSTED instead of growing the server's memory.
func TestSessionStreamBacklogIsBounded(t *testing.T) {
	c := &sessionConn{srv: &Server{log: slog.New(slog.DiscardHandler)}, ctx: context.Background(), streams: make(map[uint64]*sessionStream), wake: make(chan struct{}, 1)}
	ss := c.newStreamLocked(1)
	for range maxStreamBacklog {
		ss.deliver(&pb.SessionRequest{})
	}
	if ss.state != streamOpening || len(ss.backlog) != maxStreamBacklog || len(c.out) != 0 {
		t.Fatalf("after %d requests: state %v, %d kept, %d replies", maxStreamBacklog, ss.state, len(ss.backlog), len(c.out))
	}
	ss.deliver(&pb.SessionRequest{})
	if ss.state != streamOver || ss.ctx.Err() == nil || len(ss.backlog) != 0 || c.streams[1] != nil {
		t.Fatalf("after %d requests: state %v, %d kept, want the stream over", maxStreamBacklog+1, ss.state, len(ss.backlog))
	}
	if len(c.out) != 1 || !c.out[0].GetEnd() || codes.Code(c.out[0].GetCode()) != codes.ResourceExhausted {
		t.Fatalf("replies %v, want the stream ended with RESOURCE_EXHAUSTED", c.out)
	}
}

// TestSessionsStopsReadingWhileAnswersPileUp: with maxQueuedReplies
// answers waiting to be sent, the server reads no further requests (it
// waits, here until its context ends) until the sender has taken some.
func TestSessionsStopsReadingWhileAnswersPileUp(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	c := &sessionConn{ctx: ended, room: make(chan struct{}, 1)}
	c.out = make([]*pb.SessionReply, maxQueuedReplies)
	if err := c.waitRoom(); !errors.Is(err, context.Canceled) {
		t.Fatalf("with %d answers queued: %v, want it to wait (until its context ended)", maxQueuedReplies, err)
	}
	c.out = c.out[:maxQueuedReplies-1]
	if err := c.waitRoom(); err != nil {
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

// TestHubRoutesAGrantToItsRequestOnly: a grant wakes the requests waiting
// on its session's acquisition of its lock, and no other (no herd).
func TestHubRoutesAGrantToItsRequestOnly(t *testing.T) {
	h := NewHub()
	mine := h.register(waitKey{1, "L"})
	otherSession := h.register(waitKey{2, "L"})
	otherLock := h.register(waitKey{1, "M"})
	h.Sink(fsm.Event{Kind: fsm.EventGranted, Session: 1, Name: "L", Token: 7, AcquireRevision: 5})
	if e := <-mine; e.Token != 7 || e.AcquireRevision != 5 {
		t.Fatalf("the waiting request got %+v", e)
	}
	for what, ch := range map[string]chan fsm.Event{"another session's request": otherSession, "a request for another lock": otherLock} {
		select {
		case e := <-ch:
			t.Fatalf("%s was woken by %+v", what, e)
		default:
		}
	}
	// A request that resumed the acquisition (its first request's stream
	// ended) is woken too; an unregistered one is not.
	resumed := h.register(waitKey{1, "L"})
	h.unregister(waitKey{1, "L"}, mine)
	h.Sink(fsm.Event{Kind: fsm.EventWaitEnded, Session: 1, Name: "L", AcquireRevision: 5})
	if e := <-resumed; e.Kind != fsm.EventWaitEnded {
		t.Fatalf("the resumed request got %+v", e)
	}
	select {
	case e := <-mine:
		t.Fatalf("an unregistered request was woken by %+v", e)
	default:
	}
	h.unregister(waitKey{1, "L"}, resumed)
	if len(h.waits[waitKey{1, "L"}]) != 0 || h.waits[waitKey{1, "L"}] != nil {
		t.Fatalf("waits left: %v", h.waits)
	}
}
