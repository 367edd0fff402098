package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"

	pb "github.com/tenure-io/tenure/api/tenurepb"
)

// ErrQueueEmpty: TryDequeue found no ready item.
var ErrQueueEmpty = errors.New("tenure: queue is empty")

// maxRecv bounds a queue response (a payload is at most 4 MiB; a page of
// dead letters at most 2 MiB, or one item).
const maxRecv = 16 << 20

// Queue is a handle on a named distributed queue: items are kept in commit
// order, handed out under a visibility lease with a delivery token and a
// receipt, and deleted only by an ack presenting both. It holds no state
// and is safe for concurrent use.
type Queue struct {
	c    *Client
	name string
}

// Queue returns a handle on the named queue (which need not exist yet).
func (c *Client) Queue(name string) *Queue { return &Queue{c: c, name: name} }

// Name is the queue's name.
func (q *Queue) Name() string { return q.name }

// EnqueueOption configures Enqueue.
type EnqueueOption func(*enqueueOptions) error

type enqueueOptions struct {
	opID        string
	maxAttempts uint32
}

// WithOperationID makes the enqueue idempotent: a retry with the same id
// (among the queue's 10,000 most recent; a queue that was emptied keeps
// them until 1,000 newer queues were emptied, a deleted one forgets them)
// answers the first item's id with Duplicate set, and adds nothing.
func WithOperationID(id string) EnqueueOption {
	return func(o *enqueueOptions) error {
		if id == "" {
			return fmt.Errorf("%w: empty operation id", ErrInvalid)
		}
		o.opID = id
		return nil
	}
}

// WithMaxAttempts sets how many deliveries an item gets before it is
// dead-lettered. It is fixed by the queue's first enqueue (default 5); an
// enqueue naming another number is refused with ErrInvalid.
func WithMaxAttempts(n int) EnqueueOption {
	return func(o *enqueueOptions) error {
		if n < 1 {
			return fmt.Errorf("%w: max attempts %d must be at least 1", ErrInvalid, n)
		}
		o.maxAttempts = uint32(n)
		return nil
	}
}

// Enqueued is the answer to Enqueue.
type Enqueued struct {
	// ID is the item's id: the revision of its enqueue.
	ID uint64
	// Duplicate: the operation id was seen before and nothing was added;
	// ID is the first item's.
	Duplicate bool
	Revision  uint64
}

// Enqueue appends payload to the queue. Without WithOperationID a retry
// after ErrUnknownOutcome may add the item twice.
func (q *Queue) Enqueue(ctx context.Context, payload []byte, opts ...EnqueueOption) (Enqueued, error) {
	var o enqueueOptions
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return Enqueued{}, err
		}
	}
	var resp *pb.QueueEnqueueResponse
	err := q.c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.QueueEnqueue(ctx, &pb.QueueEnqueueRequest{Queue: q.name, Payload: payload, OperationId: o.opID, MaxAttempts: o.maxAttempts})
		return err
	})
	if err != nil {
		return Enqueued{}, err
	}
	return Enqueued{ID: resp.GetId(), Duplicate: resp.GetDuplicate(), Revision: resp.GetRevision()}, nil
}

// Delivery is one item handed out by Dequeue. Settle it with Ack (done),
// Nack (give it back now) or let its visibility lease run out. Another
// process may settle it if it is given ID, Token and Receipt (e.g. from
// `tenure queue pop -o json`).
type Delivery struct {
	Queue   string
	ID      uint64
	Payload []byte
	// Token names this delivery; a redelivery of the item has a larger
	// one, and only the current token acks.
	Token uint64
	// Receipt is the delivery's capability: random bytes the server drew
	// for this delivery and gave to this consumer alone (it keeps only a
	// hash). Ack, Nack and Extend must present it; without it, or with
	// another, they fail with ErrPermissionDenied. Keep it secret like a
	// password: whoever has it can settle the delivery.
	Receipt []byte
	// Attempt counts the item's deliveries, from 1.
	Attempt int
}

// DequeueOption configures Dequeue.
type DequeueOption func(*dequeueOptions) error

type dequeueOptions struct {
	session uint64
	secret  []byte
}

// UnderSession ties the delivery to s: when s ends (closed or expired) the
// item goes back to the queue, even before its visibility lease ends.
func UnderSession(s *Session) DequeueOption {
	return func(o *dequeueOptions) error {
		if s == nil {
			return fmt.Errorf("%w: nil session", ErrInvalid)
		}
		o.session, o.secret = s.ID(), s.Secret()
		return nil
	}
}

// Dequeue waits until an item is available and hands it out for
// visibility (0: the server's default, 30 s): nobody else gets it until
// the lease ends. It returns ctx's error when ctx ends first. Waiting
// consumers are served in arrival order, one woken per item.
//
// An attempt whose outcome is unknown (the node lost leadership while
// committing it) does not end the wait: Dequeue asks again. If that attempt
// did hand out an item, nobody holds it, and it is delivered again when
// its visibility lease ends (at-least-once delivery).
func (q *Queue) Dequeue(ctx context.Context, visibility time.Duration, opts ...DequeueOption) (*Delivery, error) {
	return q.dequeue(ctx, visibility, true, opts)
}

// TryDequeue is Dequeue without waiting: ErrQueueEmpty when no item is
// ready.
func (q *Queue) TryDequeue(ctx context.Context, visibility time.Duration, opts ...DequeueOption) (*Delivery, error) {
	return q.dequeue(ctx, visibility, false, opts)
}

func (q *Queue) dequeue(ctx context.Context, visibility time.Duration, wait bool, opts []DequeueOption) (*Delivery, error) {
	var o dequeueOptions
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	var resp *pb.QueueDequeueResponse
	for {
		err := q.c.unary(ctx, func(api pb.TenureClient) (err error) {
			resp, err = api.QueueDequeue(ctx, &pb.QueueDequeueRequest{Queue: q.name, VisibilityMs: visibility.Milliseconds(), Session: o.session, SessionSecret: o.secret, Wait: wait}, grpc.MaxCallRecvMsgSize(maxRecv))
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
	it := resp.GetItem()
	if it == nil {
		return nil, fmt.Errorf("%w: %s", ErrQueueEmpty, q.name)
	}
	return &Delivery{Queue: q.name, ID: it.GetId(), Payload: it.GetPayload(), Token: it.GetDeliveryToken(), Receipt: it.GetReceipt(), Attempt: int(it.GetAttempt())}, nil
}

func (q *Queue) settle(ctx context.Context, what string, d *Delivery, call func(pb.TenureClient, *pb.QueueSettleRequest) (*pb.QueueSettleResponse, error), vis time.Duration) error {
	if d == nil {
		return fmt.Errorf("%w: %s of a nil delivery", ErrInvalid, what)
	}
	if d.Queue != "" && d.Queue != q.name {
		return fmt.Errorf("%w: %s on queue %s of a delivery of queue %s", ErrInvalid, what, q.name, d.Queue)
	}
	var resp *pb.QueueSettleResponse
	err := q.c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = call(api, &pb.QueueSettleRequest{Queue: q.name, Id: d.ID, DeliveryToken: d.Token, Receipt: d.Receipt, VisibilityMs: vis.Milliseconds()})
		return err
	})
	if err != nil {
		return err
	}
	if resp.GetResult() == pb.QueueSettleResult_QUEUE_SETTLE_RESULT_STALE {
		return q.stale(what, d)
	}
	return nil
}

// stale is the ErrStale of settle what of d.
func (q *Queue) stale(what string, d *Delivery) error {
	return &staleDelivery{fmt.Sprintf("tenure: stale delivery token: %s of item %d of queue %s with delivery token %d: not the current delivery (the lease ran out and the item was redelivered, or it was settled)", what, d.ID, q.name, d.Token)}
}

// staleDelivery is ErrStale for a delivery token.
type staleDelivery struct{ msg string }

func (e *staleDelivery) Error() string { return e.msg }
func (e *staleDelivery) Unwrap() error { return ErrStale }

// Ack deletes the item of delivery d (its ID, Token and Receipt are sent;
// d.Queue, if set, must be this queue). ErrStale means the delivery is no
// longer current (its lease ran out and it may have been redelivered, or it
// was nacked): the ack did nothing. ErrPermissionDenied means d.Receipt is
// not the delivery's: nothing was done. Repeating a successful ack answers
// nil again (for the queue's 10,000 latest acks).
func (q *Queue) Ack(ctx context.Context, d *Delivery) error {
	return q.settle(ctx, "ack", d, func(api pb.TenureClient, r *pb.QueueSettleRequest) (*pb.QueueSettleResponse, error) {
		return api.QueueAck(ctx, r)
	}, 0)
}

// Nack gives the item of delivery d back at once, at its original place in
// the queue (or to the dead letters once it had its max attempts).
// ErrStale and ErrPermissionDenied as Ack.
func (q *Queue) Nack(ctx context.Context, d *Delivery) error {
	return q.settle(ctx, "nack", d, func(api pb.TenureClient, r *pb.QueueSettleRequest) (*pb.QueueSettleResponse, error) {
		return api.QueueNack(ctx, r)
	}, 0)
}

// Extend makes delivery d's visibility lease end visibility from now.
// ErrStale and ErrPermissionDenied as Ack.
func (q *Queue) Extend(ctx context.Context, d *Delivery, visibility time.Duration) error {
	return q.settle(ctx, "extend", d, func(api pb.TenureClient, r *pb.QueueSettleRequest) (*pb.QueueSettleResponse, error) {
		return api.QueueExtend(ctx, r)
	}, visibility)
}

// Purge removes every item of the queue (queued, in flight and dead) and
// reports how many. The queue keeps its max attempts and its remembered
// operation ids and acks. Deliveries in flight end: their acks are
// ErrStale. Purging an empty or unknown queue does nothing.
func (q *Queue) Purge(ctx context.Context) (int, error) {
	var resp *pb.QueuePurgeResponse
	err := q.c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.QueuePurge(ctx, &pb.QueuePurgeRequest{Queue: q.name})
		return err
	})
	if err != nil {
		return 0, err
	}
	return int(resp.GetPurged()), nil
}

// QueueDeleted is the answer to Delete.
type QueueDeleted struct {
	// Deleted: the queue existed (false: nothing was done).
	Deleted bool
	// Items: how many items it held (queued, in flight and dead).
	Items    int
	Revision uint64
}

// Delete removes the queue entirely: its items (queued, in flight and
// dead), its max attempts and its remembered operation ids and acks. A
// later enqueue creates it anew (and a retried operation id is enqueued
// again). Deliveries in flight end: their acks are ErrStale. Consumers
// waiting in Dequeue keep waiting.
func (q *Queue) Delete(ctx context.Context) (QueueDeleted, error) {
	var resp *pb.QueueDeleteResponse
	err := q.c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.QueueDelete(ctx, &pb.QueueDeleteRequest{Queue: q.name})
		return err
	})
	if err != nil {
		return QueueDeleted{}, err
	}
	return QueueDeleted{Deleted: resp.GetDeleted(), Items: int(resp.GetItems()), Revision: resp.GetRevision()}, nil
}

// QueueStats describes a queue.
type QueueStats struct {
	Queued, InFlight, Dead int
	MaxAttempts            int
	// OldestID is the oldest item queued or in flight (0: none); OldestAge
	// is how long ago the server applied its enqueue (approximate: see
	// docs/queue.md).
	OldestID  uint64
	OldestAge time.Duration
	Revision  uint64
	// Waiting counts the dequeues blocked for an item on the node that
	// answered (waiting consumers are not replicated).
	Waiting int
}

// Stats reports the queue's length, items in flight and dead letters.
func (q *Queue) Stats(ctx context.Context) (QueueStats, error) {
	var resp *pb.QueueStatsResponse
	err := q.c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.QueueStats(ctx, &pb.QueueStatsRequest{Queue: q.name, Serializable: q.c.serializable})
		return err
	})
	if err != nil {
		return QueueStats{}, err
	}
	return QueueStats{Queued: int(resp.GetQueued()), InFlight: int(resp.GetInFlight()), Dead: int(resp.GetDead()), MaxAttempts: int(resp.GetMaxAttempts()), OldestID: resp.GetOldestId(), OldestAge: time.Duration(resp.GetOldestAgeMs()) * time.Millisecond, Revision: resp.GetRevision(), Waiting: int(resp.GetWaiting())}, nil
}

// DeadLetter is an item that had its max attempts.
type DeadLetter struct {
	ID       uint64
	Payload  []byte
	Attempts int
}

// deadPage is the most dead letters the server lists in one page.
const deadPage = 1000

// DeadLetters lists up to limit (0: all) dead-lettered items with ids
// above after, oldest first. The server answers in pages (at most 1,000
// items and 2 MiB each, or one larger item), which DeadLetters follows
// until it has limit items or the last one (see Listings in the package
// documentation).
func (q *Queue) DeadLetters(ctx context.Context, after uint64, limit int) ([]DeadLetter, error) {
	if limit < 0 {
		return nil, fmt.Errorf("%w: negative limit", ErrInvalid)
	}
	var out []DeadLetter
	for {
		n := deadPage
		if limit > 0 {
			n = min(n, limit-len(out))
		}
		var resp *pb.QueueDeadListResponse
		err := q.c.unary(ctx, func(api pb.TenureClient) (err error) {
			resp, err = api.QueueDeadList(ctx, &pb.QueueDeadListRequest{Queue: q.name, AfterId: after, Limit: uint32(n)}, grpc.MaxCallRecvMsgSize(maxRecv))
			return err
		})
		if err != nil {
			return nil, err
		}
		for _, it := range resp.GetItems() {
			out = append(out, DeadLetter{ID: it.GetId(), Payload: it.GetPayload(), Attempts: int(it.GetAttempts())})
		}
		if !resp.GetMore() || (limit > 0 && len(out) >= limit) {
			return out, nil
		}
		if len(resp.GetItems()) == 0 {
			return nil, errEmptyPage
		}
		after = out[len(out)-1].ID
	}
}

// requeueBatch is how many dead letters one request moves at most.
const requeueBatch = 1000

// RequeueDead moves the listed dead-lettered items (none listed: all of
// them, 1,000 per request) back to the queue at their original place,
// with their attempts reset, and reports how many moved.
func (q *Queue) RequeueDead(ctx context.Context, ids ...uint64) (int, error) {
	total := 0
	for {
		batch := ids
		if len(batch) > requeueBatch {
			batch = batch[:requeueBatch]
		}
		var resp *pb.QueueDeadRequeueResponse
		err := q.c.unary(ctx, func(api pb.TenureClient) (err error) {
			resp, err = api.QueueDeadRequeue(ctx, &pb.QueueDeadRequeueRequest{Queue: q.name, Ids: batch})
			return err
		})
		if err != nil {
			return total, err
		}
		total += int(resp.GetRequeued())
		if len(ids) > 0 {
			ids = ids[len(batch):]
			if len(ids) == 0 {
				return total, nil
			}
			continue
		}
		if resp.GetRequeued() == 0 || resp.GetDead() == 0 {
			return total, nil
		}
	}
}
