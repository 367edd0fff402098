package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"

	pb "github.com/tenure-io/tenure/api/tenurepb"
)

// MaxBatch is the most items one batch request (EnqueueBatch,
// DequeueBatch, AckBatch, NackBatch) may hold; the server refuses more
// with ErrInvalid.
const MaxBatch = 1000

// BatchItem is one item of EnqueueBatch.
type BatchItem struct {
	Payload []byte
	// OperationID, if set, makes this item's enqueue idempotent, as
	// WithOperationID does for Enqueue.
	OperationID string
}

// EnqueueBatch appends up to MaxBatch items to the queue in order, in one
// commit, and returns one Enqueued per item: each its own id (they follow
// each other), or, for an item whose OperationID was seen before (also
// earlier in the same batch), Duplicate with the first item's id. A
// refusal is for the whole batch and adds nothing: ErrInvalid (a bad
// item, more than MaxBatch items, payloads and operation ids above 4 MiB
// together) or ErrLimit (the queue would pass its max-queue-length). The
// only option is WithMaxAttempts; operation ids are per item.
func (q *Queue) EnqueueBatch(ctx context.Context, items []BatchItem, opts ...EnqueueOption) ([]Enqueued, error) {
	var o enqueueOptions
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if o.opID != "" {
		return nil, fmt.Errorf("%w: WithOperationID does not apply to a batch: set each BatchItem's OperationID", ErrInvalid)
	}
	req := &pb.QueueEnqueueBatchRequest{Queue: q.name, MaxAttempts: o.maxAttempts, Items: make([]*pb.QueueEnqueueItem, len(items))}
	for i, it := range items {
		req.Items[i] = &pb.QueueEnqueueItem{Payload: it.Payload, OperationId: it.OperationID}
	}
	var resp *pb.QueueEnqueueBatchResponse
	err := q.c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.QueueEnqueueBatch(ctx, req)
		return err
	})
	if err != nil {
		return nil, err
	}
	if len(resp.GetItems()) != len(items) {
		return nil, fmt.Errorf("tenure: the server answered %d results for %d items", len(resp.GetItems()), len(items))
	}
	out := make([]Enqueued, len(items))
	for i, r := range resp.GetItems() {
		out[i] = Enqueued{ID: r.GetId(), Duplicate: r.GetDuplicate(), Revision: resp.GetRevision()}
	}
	return out, nil
}

// DequeueBatch waits until at least one item is available and hands out
// up to max of the oldest ones (1 to MaxBatch) under one visibility lease
// (0: the server's default, 30 s), in one commit. Each Delivery has its
// own token, receipt and attempt count, and is settled (Ack, Nack,
// AckBatch...), redelivered when the lease ends, and dead-lettered on its
// own. A batch stops before its payloads pass 4 MiB (it holds at least
// one item). Waiting and ErrUnknownOutcome are as for Dequeue.
func (q *Queue) DequeueBatch(ctx context.Context, max int, visibility time.Duration, opts ...DequeueOption) ([]*Delivery, error) {
	return q.dequeueBatch(ctx, max, visibility, true, opts)
}

// TryDequeueBatch is DequeueBatch without waiting: ErrQueueEmpty when no
// item is ready.
func (q *Queue) TryDequeueBatch(ctx context.Context, max int, visibility time.Duration, opts ...DequeueOption) ([]*Delivery, error) {
	return q.dequeueBatch(ctx, max, visibility, false, opts)
}

func (q *Queue) dequeueBatch(ctx context.Context, max int, visibility time.Duration, wait bool, opts []DequeueOption) ([]*Delivery, error) {
	if max < 1 || max > MaxBatch {
		return nil, fmt.Errorf("%w: a dequeue batch takes 1 to %d items, not %d", ErrInvalid, MaxBatch, max)
	}
	var o dequeueOptions
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	var resp *pb.QueueDequeueBatchResponse
	for {
		err := q.c.unary(ctx, func(api pb.TenureClient) (err error) {
			resp, err = api.QueueDequeueBatch(ctx, &pb.QueueDequeueBatchRequest{Queue: q.name, VisibilityMs: visibility.Milliseconds(), Session: o.session, SessionSecret: o.secret, Wait: wait, MaxItems: uint32(max)}, grpc.MaxCallRecvMsgSize(maxRecv))
			return err
		})
		if wait && errors.Is(err, ErrUnknownOutcome) && ctx.Err() == nil {
			continue
		}
		if err != nil {
			return nil, err
		}
		break
	}
	if len(resp.GetItems()) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrQueueEmpty, q.name)
	}
	out := make([]*Delivery, len(resp.GetItems()))
	for i, it := range resp.GetItems() {
		out[i] = &Delivery{Queue: q.name, ID: it.GetId(), Payload: it.GetPayload(), Token: it.GetDeliveryToken(), Receipt: it.GetReceipt(), Attempt: int(it.GetAttempt())}
	}
	return out, nil
}

// AckBatch acks up to MaxBatch deliveries of this queue in one commit.
// The error is the request's: if it is not nil, no answer came (with
// ErrUnknownOutcome, the acks may have happened; repeating them is safe).
// Otherwise each delivery has its own outcome, in order: nil (acked, or
// acked before with the same token and receipt), an ErrStale or an
// ErrPermissionDenied, as Ack.
func (q *Queue) AckBatch(ctx context.Context, ds []*Delivery) ([]error, error) {
	return q.settleBatch(ctx, "ack", ds, func(api pb.TenureClient, r *pb.QueueSettleBatchRequest) (*pb.QueueSettleBatchResponse, error) {
		return api.QueueAckBatch(ctx, r)
	})
}

// NackBatch gives up to MaxBatch deliveries back at once, each as Nack
// (back at its place, or to the dead letters at its max attempts), with
// outcomes as AckBatch's.
func (q *Queue) NackBatch(ctx context.Context, ds []*Delivery) ([]error, error) {
	return q.settleBatch(ctx, "nack", ds, func(api pb.TenureClient, r *pb.QueueSettleBatchRequest) (*pb.QueueSettleBatchResponse, error) {
		return api.QueueNackBatch(ctx, r)
	})
}

func (q *Queue) settleBatch(ctx context.Context, what string, ds []*Delivery, call func(pb.TenureClient, *pb.QueueSettleBatchRequest) (*pb.QueueSettleBatchResponse, error)) ([]error, error) {
	req := &pb.QueueSettleBatchRequest{Queue: q.name, Items: make([]*pb.QueueDelivery, len(ds))}
	for i, d := range ds {
		if d == nil {
			return nil, fmt.Errorf("%w: %s of a nil delivery (item %d)", ErrInvalid, what, i)
		}
		if d.Queue != "" && d.Queue != q.name {
			return nil, fmt.Errorf("%w: %s on queue %s of a delivery of queue %s (item %d)", ErrInvalid, what, q.name, d.Queue, i)
		}
		req.Items[i] = &pb.QueueDelivery{Id: d.ID, DeliveryToken: d.Token, Receipt: d.Receipt}
	}
	var resp *pb.QueueSettleBatchResponse
	err := q.c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = call(api, req)
		return err
	})
	if err != nil {
		return nil, err
	}
	if len(resp.GetItems()) != len(ds) {
		return nil, fmt.Errorf("tenure: the server answered %d results for %d deliveries", len(resp.GetItems()), len(ds))
	}
	out := make([]error, len(ds))
	for i, r := range resp.GetItems() {
		switch {
		case r.GetError() != nil:
			out[i] = fromProto(r.GetError())
		case r.GetResult() == pb.QueueSettleResult_QUEUE_SETTLE_RESULT_STALE:
			out[i] = q.stale(what, ds[i])
		}
	}
	return out, nil
}
