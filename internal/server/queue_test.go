package server_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/clock"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/server"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestQueueOneWakeupPerItem: with many consumers waiting, each enqueued
// item wakes exactly one of them (no herd), in arrival order.
func TestQueueOneWakeupPerItem(t *testing.T) {
	const consumers, items = 20, 5
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	q := c.Queue("jobs")

	type got struct {
		consumer int
		d        *client.Delivery
	}
	delivered := make(chan got, consumers)
	wctx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	done := make(chan struct{}, consumers)
	for i := range consumers {
		go func() {
			defer func() { done <- struct{}{} }()
			d, err := q.Dequeue(wctx, time.Minute)
			if err == nil {
				delivered <- got{i, d}
			}
		}()
		// Arrival order is the order of joining the line.
		testutil.WaitFor(t, fmt.Sprintf("consumer %d to wait", i), 10*time.Second, func() bool { return srv.Hub.QueueWaiting("jobs") == i+1 })
	}
	before := srv.Hub.QueueWakeups()
	var ids []uint64
	for i := range items {
		e, err := q.Enqueue(ctx, []byte(fmt.Sprint("item", i)))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, e.ID)
	}
	// The k-th consumer in line gets the k-th item. (The consumers'
	// goroutines report in whatever order they get scheduled.)
	for k := range items {
		select {
		case g := <-delivered:
			if g.consumer >= items || g.d.ID != ids[g.consumer] || g.d.Attempt != 1 {
				t.Fatalf("consumer %d got %+v, want consumer k (k < %d) to get item k %v", g.consumer, g.d, items, ids)
			}
		case <-ctx.Done():
			t.Fatalf("only %d of %d items delivered", k, items)
		}
	}
	if woken := srv.Hub.QueueWakeups() - before; woken != items {
		t.Fatalf("%d wake-ups for %d items with %d consumers waiting", woken, items, consumers)
	}
	if n := srv.Hub.QueueWaiting("jobs"); n != consumers-items {
		t.Fatalf("%d consumers still wait, want %d", n, consumers-items)
	}
	stopWaiting()
	for range consumers {
		<-done
	}
	select {
	case g := <-delivered:
		t.Fatalf("an extra delivery after the test stopped waiting: %+v", g)
	default:
	}
}

// TestQueueRedeliveryAndStaleAck: a delivery whose visibility runs out is
// handed out again with a larger token; the first consumer's ack is then
// stale, the second's succeeds, and repeating it is harmless.
func TestQueueRedeliveryAndStaleAck(t *testing.T) {
	clk := clock.NewFake()
	srv := testutil.Start(t, "", clk)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	q := c.Queue("work")
	e, err := q.Enqueue(ctx, []byte("payload"), client.WithOperationID("op-1"))
	if err != nil {
		t.Fatal(err)
	}
	if again, err := q.Enqueue(ctx, []byte("payload"), client.WithOperationID("op-1")); err != nil || !again.Duplicate || again.ID != e.ID {
		t.Fatalf("retried enqueue: %+v %v", again, err)
	}
	first, err := q.Dequeue(ctx, time.Second)
	if err != nil || first.ID != e.ID || string(first.Payload) != "payload" || first.Attempt != 1 {
		t.Fatalf("first delivery: %+v %v", first, err)
	}
	if _, err := q.TryDequeue(ctx, time.Second); !errors.Is(err, client.ErrQueueEmpty) {
		t.Fatalf("the item is invisible during its lease, got %v", err)
	}
	testutil.WaitFor(t, "the visibility lease to run out", 10*time.Second, func() bool {
		testutil.Elapse(t, clk, 2*time.Second)
		st, err := q.Stats(ctx)
		return err == nil && st.Queued == 1
	})
	second, err := q.Dequeue(ctx, time.Minute)
	if err != nil || second.ID != e.ID || second.Token <= first.Token || second.Attempt != 2 {
		t.Fatalf("redelivery: %+v %v after %+v", second, err, first)
	}
	if err := q.Ack(ctx, first); !errors.Is(err, client.ErrStale) {
		t.Fatalf("late ack with the first token: %v, want ErrStale", err)
	}
	if err := q.Extend(ctx, first, time.Minute); !errors.Is(err, client.ErrStale) {
		t.Fatalf("extend with the first token: %v, want ErrStale", err)
	}
	if err := q.Ack(ctx, second); err != nil {
		t.Fatalf("ack of the current delivery: %v", err)
	}
	if err := q.Ack(ctx, second); err != nil {
		t.Fatalf("repeated ack: %v", err)
	}
	if st, err := q.Stats(ctx); err != nil || st.Queued+st.InFlight+st.Dead != 0 {
		t.Fatalf("stats after the ack: %+v %v", st, err)
	}
}

// TestQueueSessionEndReturnsItem: an item dequeued under a session goes
// back to the queue when the session ends, long before its lease would.
func TestQueueSessionEndReturnsItem(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	q := c.Queue("s")
	if _, err := q.Enqueue(ctx, []byte("x")); err != nil {
		t.Fatal(err)
	}
	s, err := c.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d, err := q.Dequeue(ctx, time.Hour, client.UnderSession(s))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	again, err := q.Dequeue(ctx, time.Hour)
	if err != nil || again.ID != d.ID || again.Attempt != 2 {
		t.Fatalf("after the session ended: %+v %v", again, err)
	}
	if err := q.Nack(ctx, d); !errors.Is(err, client.ErrStale) {
		t.Fatalf("nack under the ended session's delivery: %v", err)
	}
}

// TestQueueDeadLetters: after max attempts an item is dead-lettered,
// listed, and requeued at its original place with attempts reset.
func TestQueueDeadLetters(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	q := c.Queue("dlq")
	poison, err := q.Enqueue(ctx, []byte("poison"), client.WithMaxAttempts(2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, []byte("x"), client.WithMaxAttempts(3)); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("enqueue with other max attempts: %v", err)
	}
	for range 2 {
		d, err := q.Dequeue(ctx, time.Minute)
		if err != nil || d.ID != poison.ID {
			t.Fatalf("delivery %+v %v", d, err)
		}
		if err := q.Nack(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	st, err := q.Stats(ctx)
	if err != nil || st.Dead != 1 || st.Queued != 0 || st.MaxAttempts != 2 {
		t.Fatalf("stats %+v %v", st, err)
	}
	dl, err := q.DeadLetters(ctx, 0, 0)
	if err != nil || len(dl) != 1 || dl[0].ID != poison.ID || string(dl[0].Payload) != "poison" || dl[0].Attempts != 2 {
		t.Fatalf("dead letters %+v %v", dl, err)
	}
	later, err := q.Enqueue(ctx, []byte("later"))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := q.RequeueDead(ctx); err != nil || n != 1 {
		t.Fatalf("requeue: %d %v", n, err)
	}
	d, err := q.Dequeue(ctx, time.Minute)
	if err != nil || d.ID != poison.ID || d.Attempt != 1 || d.ID >= later.ID {
		t.Fatalf("after requeue: %+v %v", d, err)
	}
}

// TestQueueLimits: past a queue limit a request gets a clear error naming
// the limit; everything within the limits goes on.
func TestQueueLimits(t *testing.T) {
	srv := testutil.StartConfig(t, daemon.Config{Limits: server.Limits{MaxQueuePayload: 10}, ClusterLimits: fsm.Limits{MaxQueueLength: 2, MaxQueues: 2}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	a := c.Queue("a")
	if _, err := a.Enqueue(ctx, make([]byte, 11)); !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "--max-queue-payload") || !strings.Contains(err.Error(), "11 bytes") {
		t.Fatalf("large payload: %v", err)
	}
	for range 2 {
		if _, err := a.Enqueue(ctx, []byte("ok")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Enqueue(ctx, []byte("ok")); !errors.Is(err, client.ErrLimit) || !strings.Contains(err.Error(), "--max-queue-length") {
		t.Fatalf("third item: %v", err)
	}
	if _, err := c.Queue("b").Enqueue(ctx, []byte("ok")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Queue("c").Enqueue(ctx, []byte("ok")); !errors.Is(err, client.ErrLimit) || !strings.Contains(err.Error(), "--max-queues") {
		t.Fatalf("third queue: %v", err)
	}
	// Within the limits everything goes on: consume, and the queue takes
	// items again.
	d, err := a.Dequeue(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Ack(ctx, d); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Enqueue(ctx, []byte("ok")); err != nil {
		t.Fatalf("enqueue after room was made: %v", err)
	}
	if err := (server.Limits{MaxQueuePayload: 5 << 20}).Validate(); err == nil {
		t.Fatal("a payload limit above the state machine's ceiling was accepted")
	}
}

// TestQueueLargePayload: a payload at the state machine's ceiling passes
// through gRPC both ways.
func TestQueueLargePayload(t *testing.T) {
	srv := testutil.StartConfig(t, daemon.Config{Limits: server.Limits{MaxQueuePayload: 4 << 20}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	q := c.Queue("big")
	payload := make([]byte, 4<<20)
	payload[len(payload)-1] = 7
	if _, err := q.Enqueue(ctx, payload); err != nil {
		t.Fatal(err)
	}
	d, err := q.Dequeue(ctx, time.Minute)
	if err != nil || len(d.Payload) != len(payload) || d.Payload[len(payload)-1] != 7 {
		t.Fatalf("dequeue of a 4 MiB payload: %v", err)
	}
}

// TestQueueSurvivesSnapshotAndRestart: a raft snapshot followed by more
// log entries and a restart restores every queue exactly: stored items,
// deliveries in flight (their tokens still settle them), dead letters and
// remembered operation ids; the new leader re-arms the visibility leases.
func TestQueueSurvivesSnapshotAndRestart(t *testing.T) {
	clk := clock.NewFake()
	srv := testutil.Start(t, "", clk)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	q := c.Queue("durable")
	for i := range 20 {
		if _, err := q.Enqueue(ctx, []byte(fmt.Sprint(i)), client.WithOperationID(fmt.Sprint("op", i)), client.WithMaxAttempts(1)); err != nil {
			t.Fatal(err)
		}
	}
	poison, err := q.Dequeue(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Nack(ctx, poison); err != nil { // one attempt: dead
		t.Fatal(err)
	}
	held, err := q.Dequeue(ctx, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Node.Snapshot(); err != nil {
		t.Fatal(err)
	}
	// After the snapshot: more entries that only the log has.
	acked, err := q.Dequeue(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Ack(ctx, acked); err != nil {
		t.Fatal(err)
	}
	before, err := q.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop(t)

	srv = testutil.Start(t, srv.DataDir, clk)
	c = testutil.Dial(t, srv.Addr())
	q = c.Queue("durable")
	after, err := q.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.Queued != before.Queued || after.InFlight != 1 || after.Dead != 1 || after.OldestID != before.OldestID {
		t.Fatalf("after the restart %+v, before %+v", after, before)
	}
	if dup, err := q.Enqueue(ctx, nil, client.WithOperationID("op0")); err != nil || !dup.Duplicate || dup.ID != poison.ID {
		t.Fatalf("op id after the restart: %+v %v", dup, err)
	}
	if err := q.Ack(ctx, acked); err != nil {
		t.Fatalf("repeated ack after the restart: %v", err)
	}
	// The delivery in flight is re-armed with its full lease by the new
	// leader: advancing past it returns the item (to the dead letters, as
	// it had its one attempt).
	testutil.WaitFor(t, "the re-armed lease to run out", 10*time.Second, func() bool {
		testutil.Elapse(t, clk, 6*time.Second)
		st, err := q.Stats(ctx)
		return err == nil && st.InFlight == 0
	})
	if err := q.Ack(ctx, held); !errors.Is(err, client.ErrStale) {
		t.Fatalf("ack after the lease ran out: %v", err)
	}
	dl, err := q.DeadLetters(ctx, 0, 0)
	if err != nil || len(dl) != 2 || dl[0].ID != poison.ID || dl[1].ID != held.ID {
		t.Fatalf("dead letters %+v %v", dl, err)
	}
}

// TestQueueWaitersSurviveLostRaces: consumers that are woken but lose the
// item to consumers that do not wait keep their place and still get the
// items that come later; no item is left queued while one of them waits.
func TestQueueWaitersSurviveLostRaces(t *testing.T) {
	testutil.Slow(t)
	const waiters, stealers, items = 4, 8, 200
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	q := c.Queue("race")
	got := make(chan uint64, items+waiters)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	for range waiters {
		go func() {
			for {
				d, err := q.Dequeue(wctx, time.Minute)
				if err != nil {
					return
				}
				_ = q.Ack(ctx, d)
				got <- d.ID
			}
		}()
	}
	testutil.WaitFor(t, "the consumers to wait", 10*time.Second, func() bool { return srv.Hub.QueueWaiting("race") == waiters })
	sctx, stopStealing := context.WithCancel(ctx)
	stolen := make(chan int, stealers)
	for range stealers {
		go func() {
			n := 0
			defer func() { stolen <- n }()
			for sctx.Err() == nil {
				if d, err := q.TryDequeue(sctx, time.Minute); err == nil {
					_ = q.Ack(ctx, d)
					n++
				}
			}
		}()
	}
	for i := range items {
		if _, err := q.Enqueue(ctx, []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, "every item to be taken", 30*time.Second, func() bool {
		st, err := q.Stats(ctx)
		return err == nil && st.Queued == 0 && st.InFlight == 0
	})
	stopStealing()
	total := 0
	for range stealers {
		total += <-stolen
	}
	byWaiters := len(got)
	if total+byWaiters != items {
		t.Fatalf("%d items taken by stealers and %d by waiters, want %d in all", total, byWaiters, items)
	}
	// The waiters are all back in line: each new item reaches one of them.
	testutil.WaitFor(t, "the consumers to wait again", 10*time.Second, func() bool { return srv.Hub.QueueWaiting("race") == waiters })
	for i := range waiters {
		if _, err := q.Enqueue(ctx, []byte(fmt.Sprint("late", i))); err != nil {
			t.Fatal(err)
		}
	}
	for i := range waiters {
		select {
		case <-got:
		case <-ctx.Done():
			t.Fatalf("only %d of %d late items reached the waiting consumers", i, waiters)
		}
	}
	t.Logf("%d items went to consumers that did not wait, %d to waiting ones", total, byWaiters)
}
