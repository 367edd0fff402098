package server_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestServerLeavesNoGoroutine: a server that served sessions, locks, a
// watch and a queue's dequeues, once stopped, leaves no goroutine behind
// (Server.Close joins its workers before the node closes; before it, idle
// workers outlived the server).
func TestServerLeavesNoGoroutine(t *testing.T) {
	// Registered first, so it runs after every other cleanup (the
	// clients' connections are closed by then).
	before := goleak.IgnoreCurrent()
	// The client's keeper of a session whose server went away outlives
	// Client.Close (the client's own concern, not the server's).
	client := goleak.IgnoreTopFunction("github.com/tenure-io/tenure/client.(*Session).keeper")
	t.Cleanup(func() { goleak.VerifyNone(t, before, client) })
	func() {
		srv := testutil.Start(t, "", nil)
		defer srv.Stop(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c := testutil.Dial(t, srv.Addr())
		api := testutil.API(t, srv.Addr())

		// A watch, open while the server stops.
		wctx, wcancel := context.WithCancel(ctx)
		defer wcancel()
		w, err := api.KVWatch(wctx, &pb.KVWatchRequest{Key: "leak/", Prefix: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := api.KVPut(ctx, &pb.KVPutRequest{Key: "leak/a", Value: []byte("1")}); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Recv(); err != nil {
			t.Fatal(err)
		}

		// Sessions and locks: one held and released, then its session
		// closed; one held when the server stops.
		s1, err := c.NewSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m, err := s1.Mutex("leak-lock")
		if err != nil {
			t.Fatal(err)
		}
		h, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := s1.Close(ctx); err != nil {
			t.Fatal(err)
		}
		s2, err := c.NewSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := s2.Mutex("leak-held")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m2.Lock(ctx); err != nil {
			t.Fatal(err)
		}

		// A queue: an item dequeued, and a dequeue waiting when the
		// server stops.
		if _, err := api.QueueEnqueue(ctx, &pb.QueueEnqueueRequest{Queue: "leak-q", Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		if r, err := api.QueueDequeue(ctx, &pb.QueueDequeueRequest{Queue: "leak-q", VisibilityMs: 60_000}); err != nil || r.GetItem() == nil {
			t.Fatalf("dequeue: %v, %v", r, err)
		}
		waiting := make(chan error, 1)
		go func() {
			_, err := api.QueueDequeue(wctx, &pb.QueueDequeueRequest{Queue: "leak-q", VisibilityMs: 60_000, Wait: true})
			waiting <- err
		}()
		testutil.WaitFor(t, "a waiting dequeue", 10*time.Second, func() bool { return srv.Hub.QueueWaiting("leak-q") == 1 })

		srv.Stop(t)
		wcancel()
		<-waiting
	}()
}
