package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/fsm"
)

// noACLs are the ACLs of a cluster that has none, enforcing nothing.
func noACLs() *fsm.Security { return fsm.NewState().Security() }

// TestSessionStreamBacklogIsBounded: a client that keeps sending on a
// session stream whose open is not answered yet has that stream ended
// with RESOURCE_EXHAUSTED instead of growing the server's memory.
func TestSessionStreamBacklogIsBounded(t *testing.T) {
	c := &sessionConn{srv: &Server{log: slog.New(slog.DiscardHandler), acls: noACLs}, ctx: context.Background(), streams: make(map[uint64]*sessionStream), wake: make(chan struct{}, 1)}
	ss := c.newStreamLocked(1)
	for range maxStreamBacklog {
		ss.deliver(&pb.SessionRequest{})
	}
	if ss.state != streamOpening || len(ss.backlog) != maxStreamBacklog || len(c.out) != 0 {
		t.Fatalf("after %d requests: state %v, %d kept, %d replies", maxStreamBacklog, ss.state, len(ss.backlog), len(c.out))
	}
	ss.deliver(&pb.SessionRequest{})
	if ss.state != streamOver || ss.done.Err() == nil || len(ss.backlog) != 0 || c.streams[1] != nil {
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
	mine := register(h, waitKey{1, "L"})
	otherSession := register(h, waitKey{2, "L"})
	otherLock := register(h, waitKey{1, "M"})
	h.Sink(fsm.Event{Kind: fsm.EventGranted, Session: 1, Name: "L", Token: 7, AcquireRevision: 5})
	if e := <-mine; e.Token != 7 || e.AcquireRevision != 5 {
		t.Fatalf("the waiting request got %+v", e)
	}
	for what, ch := range map[string]chanWaiter{"another session's request": otherSession, "a request for another lock": otherLock} {
		select {
		case e := <-ch:
			t.Fatalf("%s was woken by %+v", what, e)
		default:
		}
	}
	// A request that resumed the acquisition (its first request's stream
	// ended) is woken too; an unregistered one is not.
	resumed := register(h, waitKey{1, "L"})
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

// chanWaiter is a grantWaiter that keeps the events it is woken with.
type chanWaiter chan fsm.Event

func (c chanWaiter) wake(e fsm.Event) {
	select {
	case c <- e:
	default:
	}
}

func register(h *Hub, k waitKey) chanWaiter {
	w := make(chanWaiter, 2)
	h.register(k, w)
	return w
}

// queuedAcquire makes a pending acquire of lock L on a stream of session
// 1, registered with the hub as acquire does before proposing.
func queuedAcquire(t *testing.T) (*sessionConn, *sessionStream, *pendingAcquire) {
	t.Helper()
	srv := &Server{log: slog.New(slog.DiscardHandler), acls: noACLs, hub: NewHub()}
	c := &sessionConn{srv: srv, ctx: context.Background(), streams: make(map[uint64]*sessionStream), wake: make(chan struct{}, 1)}
	ss := c.newStreamLocked(1)
	ss.id, ss.state = 1, streamServing
	p := &pendingAcquire{ss: ss, id: 9, name: "L"}
	ss.addPendingLocked(p)
	srv.hub.register(p.key(), p)
	return c, ss, p
}

// answers lists the answers queued on c: "queued", "granted <token>" or
// the error's message.
func answers(c *sessionConn) []string {
	var out []string
	for _, r := range c.out {
		switch res := r.GetResponse().GetResult().(type) {
		case *pb.SessionResponse_Queued:
			out = append(out, "queued")
		case *pb.SessionResponse_Granted:
			out = append(out, fmt.Sprint("granted ", res.Granted.GetToken()))
		case *pb.SessionResponse_Error:
			out = append(out, res.Error.GetMessage())
		}
	}
	return out
}

// TestQueuedAcquireIsAnsweredByItsEventOnce: a queued acquire, which no
// goroutine waits for, is answered by its own acquisition's grant, once,
// in order after "queued"; a grant that came while its command was being
// committed is not lost; and once answered it is out of the hub and of the
// stream's pending requests.
func TestQueuedAcquireIsAnsweredByItsEventOnce(t *testing.T) {
	grant := func(acqRev, token uint64) fsm.Event {
		return fsm.Event{Kind: fsm.EventGranted, Session: 1, Name: "L", AcquireRevision: acqRev, Token: token}
	}
	for _, tc := range []struct {
		name   string
		before []fsm.Event // while committing
		after  []fsm.Event // once queued
		want   []string
	}{
		{"granted in line", nil, []fsm.Event{grant(4, 6), grant(5, 7), grant(5, 8)}, []string{"queued", "granted 7"}},
		{"granted while committing", []fsm.Event{grant(4, 6), grant(5, 7)}, []fsm.Event{grant(5, 8)}, []string{"queued", "granted 7"}},
		{"session ended", nil, []fsm.Event{{Kind: fsm.EventWaitEnded, Session: 1, Name: "L", AcquireRevision: 5}}, []string{"queued", fsm.ErrSessionNotFound.Error()}},
		{"still in line", []fsm.Event{grant(4, 6)}, nil, []string{"queued"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, ss, p := queuedAcquire(t)
			for _, e := range tc.before {
				ss.conn.srv.hub.Sink(e)
			}
			p.committed(fsm.Result{Queued: true, Position: 1, AcquireRevision: 5}, nil)
			for _, e := range tc.after {
				ss.conn.srv.hub.Sink(e)
			}
			if got := answers(c); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("answers %q, want %q", got, tc.want)
			}
			answered := len(tc.want) > 1
			if inHub := len(ss.conn.srv.hub.waits) > 0; inHub == answered || (ss.pendingLocked(p.id) != nil) == answered {
				t.Fatalf("answered %v, yet in the hub %v and pending %v", answered, inHub, ss.pendingLocked(p.id) != nil)
			}
		})
	}
}

// TestEndedStreamKeepsItsPlaceInLine: when a stream ends, its queued
// acquire is dropped without an answer and without a withdrawal (the
// place in line stays the session's, for a resume): a later grant reaches
// nobody, and an acquire still committing is dropped once queued.
func TestEndedStreamKeepsItsPlaceInLine(t *testing.T) {
	for _, queuedFirst := range []bool{true, false} {
		c, ss, p := queuedAcquire(t)
		if queuedFirst {
			p.committed(fsm.Result{Queued: true, Position: 1, AcquireRevision: 5}, nil)
		}
		ss.finish()
		if !queuedFirst {
			p.committed(fsm.Result{Queued: true, Position: 1, AcquireRevision: 5}, nil)
		}
		ss.conn.srv.hub.Sink(fsm.Event{Kind: fsm.EventGranted, Session: 1, Name: "L", AcquireRevision: 5, Token: 7})
		want := []string(nil)
		if queuedFirst {
			want = []string{"queued"}
		}
		if got := answers(c); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("queued first %v: answers %q, want %q", queuedFirst, got, want)
		}
		if len(ss.conn.srv.hub.waits) > 0 || ss.pendingLocked(p.id) != nil || p.phase != acquireSettled || p.withdraw {
			t.Fatalf("queued first %v: hub %v, pending %v, phase %v, withdraw %v", queuedFirst, ss.conn.srv.hub.waits, ss.pendingLocked(p.id) != nil, p.phase, p.withdraw)
		}
	}
}

// TestStreamContextEndsWithTheStream: a session stream's context carries
// its RPC's values and ends (Done closed, Err Canceled) when the stream is
// over, whether something waited on it before or only after.
func TestStreamContextEndsWithTheStream(t *testing.T) {
	type key struct{}
	rpc := context.WithValue(context.Background(), key{}, "caller")
	c := &sessionConn{srv: &Server{log: slog.New(slog.DiscardHandler), acls: noACLs, hub: NewHub()}, ctx: rpc, streams: make(map[uint64]*sessionStream), wake: make(chan struct{}, 1)}
	waited, late := c.newStreamLocked(1), c.newStreamLocked(2)
	done := waited.done.Done()
	if waited.done.Err() != nil || waited.done.Value(key{}) != "caller" {
		t.Fatalf("a serving stream's context: err %v, value %v", waited.done.Err(), waited.done.Value(key{}))
	}
	select {
	case <-done:
		t.Fatal("Done closed while the stream serves")
	default:
	}
	waited.finish()
	late.finish()
	for _, ss := range []*sessionStream{waited, late} {
		select {
		case <-ss.done.Done():
		default:
			t.Fatalf("stream %d over, its context not done", ss.sid)
		}
		if !errors.Is(ss.done.Err(), context.Canceled) {
			t.Fatalf("stream %d over, its context's Err %v", ss.sid, ss.done.Err())
		}
	}
}

// TestPendingAcquiresOfAStream: a stream's pending acquires are found by
// request id, whether it has one (kept inline) or many, and each leaves
// alone; a request id reused replaces the earlier request.
func TestPendingAcquiresOfAStream(t *testing.T) {
	ss := &sessionStream{}
	ps := make([]*pendingAcquire, 5)
	for i := range ps {
		ps[i] = &pendingAcquire{ss: ss, id: uint64(i + 1)}
		ss.addPendingLocked(ps[i])
	}
	for _, order := range [][]int{{0, 1, 2, 3, 4}, {4, 2, 0, 1, 3}} {
		for _, p := range ps {
			ss.addPendingLocked(p)
		}
		for n, i := range order {
			for j, p := range ps {
				gone := slices.Contains(order[:n], j)
				if got := ss.pendingLocked(p.id); (got == p) == gone {
					t.Fatalf("order %v, %d removed: request %d found %v", order, n, p.id, got != nil)
				}
			}
			ss.removePendingLocked(ps[i])
		}
		count := 0
		ss.eachPendingLocked(func(*pendingAcquire) { count++ })
		if count != 0 {
			t.Fatalf("order %v: %d left", order, count)
		}
	}
	again := &pendingAcquire{ss: ss, id: 1}
	ss.addPendingLocked(ps[0])
	ss.addPendingLocked(ps[1])
	ss.addPendingLocked(&pendingAcquire{ss: ss, id: 2})
	ss.addPendingLocked(again)
	if ss.pendingLocked(1) != again || ss.pendingLocked(2) == ps[1] {
		t.Fatal("a reused request id did not replace the earlier request")
	}
	ss.removePendingLocked(ps[0]) // replaced: not pending
	if ss.pendingLocked(1) != again {
		t.Fatal("removing a replaced request removed its successor")
	}
}
