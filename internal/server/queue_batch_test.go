package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/server"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestQueueBatchRoundTrip: a batch enqueue gives each item its own id
// (duplicates answered per item), a batch dequeue hands out the oldest
// items each with its own token and receipt, and a batch ack settles each
// delivery on its own: acked, stale, or refused for a receipt that is not
// its own.
func TestQueueBatchRoundTrip(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q := testutil.Dial(t, srv.Addr()).Queue("jobs")
	first, err := q.Enqueue(ctx, []byte("first"), client.WithOperationID("op-first"))
	if err != nil {
		t.Fatal(err)
	}
	items := []client.BatchItem{{Payload: []byte("a")}, {Payload: []byte("b"), OperationID: "op-b"}, {Payload: []byte("again"), OperationID: "op-first"}, {Payload: []byte("c")}}
	got, err := q.EnqueueBatch(ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 || got[1].ID != got[0].ID+1 || got[3].ID != got[1].ID+1 || !got[2].Duplicate || got[2].ID != first.ID || got[0].Duplicate {
		t.Fatalf("enqueue batch: %+v (first %d)", got, first.ID)
	}
	ds, err := q.DequeueBatch(ctx, 3, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 3 || string(ds[0].Payload) != "first" || string(ds[1].Payload) != "a" || string(ds[2].Payload) != "b" {
		t.Fatalf("dequeue batch: %+v", ds)
	}
	for i, d := range ds {
		if d.Attempt != 1 || len(d.Receipt) == 0 || (i > 0 && (d.Token <= ds[i-1].Token || bytes.Equal(d.Receipt, ds[i-1].Receipt))) {
			t.Fatalf("delivery %d: %+v", i, d)
		}
	}
	wrong := *ds[1]
	wrong.Receipt = ds[0].Receipt
	stale := *ds[2]
	stale.Token++
	outcomes, err := q.AckBatch(ctx, []*client.Delivery{ds[0], &wrong, &stale, ds[0]})
	if err != nil {
		t.Fatal(err)
	}
	if outcomes[0] != nil || !errors.Is(outcomes[1], client.ErrPermissionDenied) || !errors.Is(outcomes[2], client.ErrStale) || outcomes[3] != nil {
		t.Fatalf("ack outcomes %v", outcomes)
	}
	st, err := q.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Queued != 1 || st.InFlight != 2 {
		t.Fatalf("stats %+v", st)
	}
	// Nacked, both come back ahead of c, each with its second attempt.
	if out, err := q.NackBatch(ctx, ds[1:]); err != nil || out[0] != nil || out[1] != nil {
		t.Fatalf("nack batch: %v %v", out, err)
	}
	again, err := q.TryDequeueBatch(ctx, 10, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != 3 || again[0].ID != ds[1].ID || again[0].Attempt != 2 || again[1].ID != ds[2].ID || string(again[2].Payload) != "c" {
		t.Fatalf("after the nack batch: %+v", again)
	}
	if _, err := q.TryDequeueBatch(ctx, 10, time.Minute); !errors.Is(err, client.ErrQueueEmpty) {
		t.Fatalf("dequeue batch of an empty queue: %v", err)
	}
}

// TestQueueBatchLimits: a batch past a limit is refused as a whole, with a
// message naming the limit: INVALID_ARGUMENT for the fixed ones (items per
// batch, bytes per batch, --max-queue-payload), RESOURCE_EXHAUSTED for the
// queue's max-queue-length; nothing is added.
func TestQueueBatchLimits(t *testing.T) {
	srv := testutil.StartConfig(t, daemon.Config{Limits: server.Limits{MaxQueuePayload: 1000}, ClusterLimits: fsm.Limits{MaxQueueLength: 5}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	api := testutil.API(t, srv.Addr())
	items := func(n, size int) []*pb.QueueEnqueueItem {
		out := make([]*pb.QueueEnqueueItem, n)
		for i := range out {
			out[i] = &pb.QueueEnqueueItem{Payload: make([]byte, size)}
		}
		return out
	}
	settle := make([]*pb.QueueDelivery, fsm.MaxQueueBatch+1)
	for i := range settle {
		settle[i] = &pb.QueueDelivery{Id: 1, DeliveryToken: 1}
	}
	for _, c := range []struct {
		name string
		call func() error
		code codes.Code
		says string
	}{
		{"no item", func() error {
			_, err := api.QueueEnqueueBatch(ctx, &pb.QueueEnqueueBatchRequest{Queue: "q"})
			return err
		}, codes.InvalidArgument, "at least one item"},
		{"too many items", func() error {
			_, err := api.QueueEnqueueBatch(ctx, &pb.QueueEnqueueBatchRequest{Queue: "q", Items: items(fsm.MaxQueueBatch+1, 0)})
			return err
		}, codes.InvalidArgument, "the limit is 1000 items per batch"},
		{"payload too large", func() error {
			_, err := api.QueueEnqueueBatch(ctx, &pb.QueueEnqueueBatchRequest{Queue: "q", Items: append(items(1, 10), items(1, 1001)...)})
			return err
		}, codes.InvalidArgument, "item 1: payload is 1001 bytes, the limit is 1000 (--max-queue-payload)"},
		{"past max-queue-length", func() error {
			_, err := api.QueueEnqueueBatch(ctx, &pb.QueueEnqueueBatchRequest{Queue: "q", Items: items(6, 1)})
			return err
		}, codes.ResourceExhausted, "max-queue-length"},
		{"dequeue of none", func() error {
			_, err := api.QueueDequeueBatch(ctx, &pb.QueueDequeueBatchRequest{Queue: "q"})
			return err
		}, codes.InvalidArgument, "at least one item (max_items)"},
		{"dequeue of too many", func() error {
			_, err := api.QueueDequeueBatch(ctx, &pb.QueueDequeueBatchRequest{Queue: "q", MaxItems: fsm.MaxQueueBatch + 1})
			return err
		}, codes.InvalidArgument, "the limit is 1000 items per batch"},
		{"ack of too many", func() error {
			_, err := api.QueueAckBatch(ctx, &pb.QueueSettleBatchRequest{Queue: "q", Items: settle})
			return err
		}, codes.InvalidArgument, "the limit is 1000 items per batch"},
	} {
		err := c.call()
		if st := status.Convert(err); st.Code() != c.code || !strings.Contains(st.Message(), c.says) {
			t.Errorf("%s: %v, want %v saying %q", c.name, err, c.code, c.says)
		}
	}
	st, err := testutil.Dial(t, srv.Addr()).Queue("q").Stats(ctx)
	if err != nil || st.Queued != 0 {
		t.Fatalf("after refused batches: %+v %v", st, err)
	}
	// The byte limit per batch, with the largest payloads the server takes.
	big := testutil.StartConfig(t, daemon.Config{Limits: server.Limits{MaxQueuePayload: fsm.MaxQueuePayload}})
	_, err = testutil.API(t, big.Addr()).QueueEnqueueBatch(ctx, &pb.QueueEnqueueBatchRequest{Queue: "q", Items: items(4, fsm.MaxQueueBatchBytes/4+1)})
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), fmt.Sprintf("the limit is %d bytes per batch", fsm.MaxQueueBatchBytes)) {
		t.Errorf("past the bytes per batch: %v", err)
	}
}

// TestQueueDequeueBatchWaits: a waiting batch dequeue is woken by items
// becoming ready and takes what there is, up to its maximum; under a
// session, its items come back when the session ends.
func TestQueueDequeueBatchWaits(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	q := c.Queue("jobs")
	sess := testutil.Session(t, ctx, c)
	type result struct {
		ds  []*client.Delivery
		err error
	}
	done := make(chan result, 1)
	go func() {
		ds, err := q.DequeueBatch(ctx, 4, time.Minute, client.UnderSession(sess))
		done <- result{ds, err}
	}()
	testutil.WaitFor(t, "the batch dequeue to wait", 10*time.Second, func() bool { return srv.Hub.QueueWaiting("jobs") == 1 })
	if _, err := q.EnqueueBatch(ctx, []client.BatchItem{{Payload: []byte("1")}, {Payload: []byte("2")}}); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || len(r.ds) != 2 || string(r.ds[0].Payload) != "1" || string(r.ds[1].Payload) != "2" {
		t.Fatalf("woken batch dequeue: %+v %v", r.ds, r.err)
	}
	if err := sess.Close(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the session's items to come back", 10*time.Second, func() bool {
		st, err := q.Stats(ctx)
		return err == nil && st.Queued == 2 && st.InFlight == 0
	})
	if out, err := q.AckBatch(ctx, r.ds); err != nil || !errors.Is(out[0], client.ErrStale) || !errors.Is(out[1], client.ErrStale) {
		t.Fatalf("acks after the session ended: %v %v", out, err)
	}
}
