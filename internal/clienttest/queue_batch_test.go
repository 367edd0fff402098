package clienttest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestQueueBatchArguments: the batch calls refuse what they cannot send,
// before any request, with ErrInvalid.
func TestQueueBatchArguments(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q := dial(t, srv.Addr()).Queue("q")
	other := &client.Delivery{Queue: "elsewhere", ID: 1, Token: 1}
	for name, err := range map[string]error{
		"operation id for a batch": func() error {
			_, err := q.EnqueueBatch(ctx, []client.BatchItem{{Payload: []byte("x")}}, client.WithOperationID("op"))
			return err
		}(),
		"dequeue of none":         func() error { _, err := q.DequeueBatch(ctx, 0, time.Second); return err }(),
		"dequeue of too many":     func() error { _, err := q.TryDequeueBatch(ctx, client.MaxBatch+1, time.Second); return err }(),
		"ack of nil":              func() error { _, err := q.AckBatch(ctx, []*client.Delivery{nil}); return err }(),
		"nack of another queue's": func() error { _, err := q.NackBatch(ctx, []*client.Delivery{other}); return err }(),
		"enqueue of none":         func() error { _, err := q.EnqueueBatch(ctx, nil); return err }(),
	} {
		if !errors.Is(err, client.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

// TestQueueBatchThroughClient: items keep their order and ids through a
// batch enqueue (an operation id repeated in the batch answers the first
// item's), a batch dequeue hands them out oldest first, and AckBatch
// answers each delivery on its own; the queue ends empty.
func TestQueueBatchThroughClient(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q := dial(t, srv.Addr()).Queue("jobs")
	var items []client.BatchItem
	for i := range client.MaxBatch {
		items = append(items, client.BatchItem{Payload: []byte(fmt.Sprint(i)), OperationID: fmt.Sprint("op-", i%(client.MaxBatch-1))})
	}
	res, err := q.EnqueueBatch(ctx, items, client.WithMaxAttempts(3))
	if err != nil {
		t.Fatal(err)
	}
	last := res[len(res)-1]
	if !last.Duplicate || last.ID != res[0].ID || res[len(res)-2].ID != res[0].ID+uint64(client.MaxBatch-2) {
		t.Fatalf("results %+v ... %+v", res[0], res[len(res)-2:])
	}
	var got []*client.Delivery
	for len(got) < client.MaxBatch-1 {
		ds, err := q.DequeueBatch(ctx, 400, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ds...)
	}
	for i, d := range got {
		if string(d.Payload) != fmt.Sprint(i) || d.ID != res[i].ID {
			t.Fatalf("delivery %d: %+v", i, d)
		}
	}
	out, err := q.AckBatch(ctx, got[:client.MaxBatch-1])
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range out {
		if e != nil {
			t.Fatalf("ack %d: %v", i, e)
		}
	}
	if st, err := q.Stats(ctx); err != nil || st.Queued+st.InFlight+st.Dead != 0 || st.MaxAttempts != 3 {
		t.Fatalf("stats %+v %v", st, err)
	}
}
