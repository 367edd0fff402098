package server_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/clock"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestQueueForeignSettleIsDenied: a second client that knows the item id
// and the delivery token of another consumer's delivery (the token is the
// revision of the dequeue: easy to guess) but not its receipt can neither
// ack, nack nor extend it: PERMISSION_DENIED, and the item stays in flight.
// The real consumer's ack then succeeds; the stranger's repeat of it is
// still refused.
func TestQueueForeignSettleIsDenied(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q := testutil.Dial(t, srv.Addr()).Queue("jobs")
	if _, err := q.Enqueue(ctx, []byte("x")); err != nil {
		t.Fatal(err)
	}
	d, err := q.Dequeue(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Receipt) < 16 {
		t.Fatalf("the delivery's receipt has %d bytes, want at least 16", len(d.Receipt))
	}
	raw := testutil.API(t, srv.Addr())
	inFlight := func(what string) {
		t.Helper()
		st, err := q.Stats(ctx)
		if err != nil || st.InFlight != 1 || st.Queued != 0 {
			t.Fatalf("after %s: %+v %v, want the item still in flight", what, st, err)
		}
	}
	wrong := append([]byte(nil), d.Receipt...)
	wrong[0] ^= 1
	for _, receipt := range [][]byte{nil, wrong, d.Receipt[:len(d.Receipt)-1]} {
		req := &pb.QueueSettleRequest{Queue: "jobs", Id: d.ID, DeliveryToken: d.Token, Receipt: receipt, VisibilityMs: 1000}
		for name, call := range map[string]func(context.Context, *pb.QueueSettleRequest, ...grpc.CallOption) (*pb.QueueSettleResponse, error){
			"ack": raw.QueueAck, "nack": raw.QueueNack, "extend": raw.QueueExtend,
		} {
			resp, err := call(ctx, req)
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("%s with receipt %x by a stranger: %v %v, want PERMISSION_DENIED", name, receipt, resp, err)
			}
			inFlight(name)
		}
	}
	// The Go client of a stranger, with a made-up receipt.
	other := testutil.Dial(t, srv.Addr()).Queue("jobs")
	fake := &client.Delivery{Queue: "jobs", ID: d.ID, Token: d.Token, Receipt: wrong}
	for what, err := range map[string]error{"ack": other.Ack(ctx, fake), "nack": other.Nack(ctx, fake), "extend": other.Extend(ctx, fake, time.Second)} {
		if !errors.Is(err, client.ErrPermissionDenied) {
			t.Fatalf("client %s with a wrong receipt: %v, want ErrPermissionDenied", what, err)
		}
	}
	inFlight("the stranger's client")
	if err := q.Extend(ctx, d, time.Minute); err != nil {
		t.Fatalf("the consumer's extend: %v", err)
	}
	if err := q.Ack(ctx, d); err != nil {
		t.Fatalf("the consumer's ack: %v", err)
	}
	if err := other.Ack(ctx, fake); !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("the stranger repeating the ack: %v, want ErrPermissionDenied", err)
	}
	if err := q.Ack(ctx, d); err != nil {
		t.Fatalf("the consumer repeating its ack: %v", err)
	}
}

// TestQueueReceiptsSurviveRestart: after a snapshot and a restart, the
// delivery in flight is still settled by its receipt alone.
func TestQueueReceiptsSurviveRestart(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q := testutil.Dial(t, srv.Addr()).Queue("r")
	for range 2 {
		if _, err := q.Enqueue(ctx, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	d1, err := q.Dequeue(ctx, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Node.Snapshot(); err != nil {
		t.Fatal(err)
	}
	d2, err := q.Dequeue(ctx, time.Hour) // in the log only
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop(t)
	srv = testutil.Start(t, srv.DataDir, nil)
	q = testutil.Dial(t, srv.Addr()).Queue("r")
	for _, d := range []*client.Delivery{d1, d2} {
		swapped := *d
		swapped.Receipt = d1.Receipt
		if d == d1 {
			swapped.Receipt = d2.Receipt
		}
		if err := q.Ack(ctx, &swapped); !errors.Is(err, client.ErrPermissionDenied) {
			t.Fatalf("ack of item %d with the other delivery's receipt after the restart: %v", d.ID, err)
		}
		if err := q.Ack(ctx, d); err != nil {
			t.Fatalf("ack of item %d after the restart: %v", d.ID, err)
		}
	}
}

// TestQueuePurgeAndDelete: purge removes every item (ready, in flight,
// dead) and keeps the queue's memories; delete removes the queue. Their
// deliveries in flight end (acks are stale; no lease runs out later), and
// a consumer waiting meanwhile gets the next item enqueued.
func TestQueuePurgeAndDelete(t *testing.T) {
	clk := clock.NewFake()
	srv := testutil.Start(t, "", clk)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	q := c.Queue("p")
	for i := range 4 {
		if _, err := q.Enqueue(ctx, []byte(fmt.Sprint(i)), client.WithOperationID(fmt.Sprint("op", i)), client.WithMaxAttempts(1)); err != nil {
			t.Fatal(err)
		}
	}
	dead, err := q.Dequeue(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Nack(ctx, dead); err != nil {
		t.Fatal(err)
	}
	s := testutil.Session(t, ctx, c)
	held, err := q.Dequeue(ctx, time.Second, client.UnderSession(s))
	if err != nil {
		t.Fatal(err)
	}
	n, err := q.Purge(ctx)
	if err != nil || n != 4 {
		t.Fatalf("purge: %d %v, want 4", n, err)
	}
	if st, err := q.Stats(ctx); err != nil || st.Queued+st.InFlight+st.Dead != 0 || st.MaxAttempts != 1 {
		t.Fatalf("stats after the purge: %+v %v", st, err)
	}
	if err := q.Ack(ctx, held); !errors.Is(err, client.ErrStale) {
		t.Fatalf("ack of a purged delivery: %v", err)
	}
	if e, err := q.Enqueue(ctx, nil, client.WithOperationID("op3")); err != nil || !e.Duplicate {
		t.Fatalf("operation id after the purge: %+v %v", e, err)
	}
	if n, err := q.Purge(ctx); err != nil || n != 0 {
		t.Fatalf("purge of an empty queue: %d %v", n, err)
	}

	// A consumer waits; the queue is deleted under it; the next enqueue
	// creates the queue anew and reaches the consumer.
	got := make(chan *client.Delivery, 1)
	go func() {
		d, err := q.Dequeue(ctx, time.Minute)
		if err != nil {
			t.Error(err)
		}
		got <- d
	}()
	testutil.WaitFor(t, "the consumer to wait", 10*time.Second, func() bool { return srv.Hub.QueueWaiting("p") == 1 })
	del, err := q.Delete(ctx)
	if err != nil || !del.Deleted || del.Items != 0 {
		t.Fatalf("delete: %+v %v", del, err)
	}
	e, err := q.Enqueue(ctx, []byte("new"), client.WithOperationID("op3"))
	if err != nil || e.Duplicate {
		t.Fatalf("enqueue after the delete: %+v %v, want a new item", e, err)
	}
	select {
	case d := <-got:
		if d == nil || d.ID != e.ID {
			t.Fatalf("the waiting consumer got %+v, want item %d", d, e.ID)
		}
	case <-ctx.Done():
		t.Fatal("the waiting consumer got nothing")
	}
	if st, err := q.Stats(ctx); err != nil || st.MaxAttempts != fsm.DefaultMaxAttempts || st.InFlight != 1 {
		t.Fatalf("the queue created anew: %+v %v", st, err)
	}
	if del, err := q.Delete(ctx); err != nil || !del.Deleted || del.Items != 1 {
		t.Fatalf("delete of a queue with an item in flight: %+v %v", del, err)
	}
	if del, err := q.Delete(ctx); err != nil || del.Deleted {
		t.Fatalf("delete of an unknown queue: %+v %v", del, err)
	}
	// Ending the session that held the purged delivery gives nothing back,
	// nor does the time their leases would have ended.
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Elapse(t, clk, 2*time.Minute)
	if st, err := q.Stats(ctx); err != nil || st.Queued+st.InFlight+st.Dead != 0 {
		t.Fatalf("after the session ended and the leases would have: %+v %v", st, err)
	}
}

// TestQueueEmptyQueuesDoNotPileUp: 10,000 queues created and drained leave
// at most fsm.MaxEmptyQueues in the state, before and after a restart;
// every new queue is accepted, and an enqueue retried right after its queue
// was drained is still a duplicate.
func TestQueueEmptyQueuesDoNotPileUp(t *testing.T) {
	testutil.Slow(t)
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	const queues, workers = 10_000, 32
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < queues && ctx.Err() == nil; i = next.Add(1) - 1 {
				if err := drainQueue(ctx, c.Queue(fmt.Sprint("q", i))); err != nil {
					t.Error(err)
					cancel()
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	count := func() (n int) {
		srv.Node.Read(func(st *fsm.State) { n = st.QueueCount() })
		return n
	}
	if n := count(); n > fsm.MaxEmptyQueues {
		t.Fatalf("%d queues kept after %d were drained, want at most %d", n, queues, fsm.MaxEmptyQueues)
	}
	srv.Stop(t)
	srv = testutil.Start(t, srv.DataDir, nil)
	c = testutil.Dial(t, srv.Addr())
	if n := count(); n > fsm.MaxEmptyQueues {
		t.Fatalf("%d queues after the restart", n)
	}
	for i := range 20 {
		if err := drainQueue(ctx, c.Queue(fmt.Sprint("after", i))); err != nil {
			t.Fatalf("a new queue after the restart: %v", err)
		}
	}
	if n := count(); n > fsm.MaxEmptyQueues {
		t.Fatalf("%d queues after more were drained", n)
	}
}

// drainQueue enqueues one item under an operation id, takes and acks it,
// and checks that a retry of the enqueue is a duplicate.
func drainQueue(ctx context.Context, q *client.Queue) error {
	e, err := q.Enqueue(ctx, []byte("x"), client.WithOperationID("op"))
	if err != nil {
		return fmt.Errorf("enqueue on %s: %w", q.Name(), err)
	}
	d, err := q.TryDequeue(ctx, time.Minute)
	if err != nil {
		return fmt.Errorf("dequeue on %s: %w", q.Name(), err)
	}
	if err := q.Ack(ctx, d); err != nil {
		return fmt.Errorf("ack on %s: %w", q.Name(), err)
	}
	again, err := q.Enqueue(ctx, []byte("x"), client.WithOperationID("op"))
	if err != nil || !again.Duplicate || again.ID != e.ID {
		return fmt.Errorf("enqueue retried on drained %s: %+v %v, want a duplicate of %d", q.Name(), again, err, e.ID)
	}
	return nil
}
