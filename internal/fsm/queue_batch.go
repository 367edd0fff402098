package fsm

// Queue commands of several items: the single-item enqueue and dequeue are
// batches of one, so both forms follow one path.
//
// A batch is one command, so its items are applied together or not at
// all where the batch as a whole is refused (a bad argument, a limit), and
// one at a time otherwise:
//
//   - EnqueueBatch: every item is checked first; any bad one, or a queue
//     that would pass max-queue-length (or max-queues), refuses the whole
//     batch and adds nothing. An item whose operation id was seen before
//     (among the queue's memory, or earlier in the same batch) adds
//     nothing and answers the first item's id as Duplicate; the others are
//     added in order, each with its own id: the revision of its enqueue,
//     one after the other.
//   - DequeueBatch: hands out up to one item per receipt hash, oldest
//     first, under one visibility lease and session, each with its own
//     delivery token (the revision of its delivery), attempt count and
//     receipt; an item at its last attempt is dead-lettered on its own
//     when its delivery ends. The batch stops early before its payloads
//     pass MaxQueueBatchBytes (but hands out at least one item).
//   - SettleBatch (ack, nack): each delivery is settled, found stale,
//     answered Duplicate (an ack repeated with its token and receipt) or
//     refused for its receipt (its own ErrPermissionDenied) independently;
//     the batch takes one revision if it changed anything.

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// Batch limits of the replicated contract.
const (
	// MaxQueueBatch bounds the items of one batch command.
	MaxQueueBatch = 1000
	// MaxQueueBatchBytes bounds the payloads one dequeue batch hands out
	// (a batch holds at least one item, however large).
	MaxQueueBatchBytes = 4 << 20
)

// QueueItemResult is the outcome for one item of a batch.
type QueueItemResult struct {
	// ID: the item enqueued (for a Duplicate, the first one enqueued with
	// its operation id), delivered or settled.
	ID uint64
	// Duplicate: an enqueue's operation id was seen before, or an ack
	// repeated the token and receipt that already acked the item.
	Duplicate bool
	// Delivery: the token, payload (shared with the state: read only) and
	// attempt number (from 1).
	Token   uint64
	Payload []byte
	Attempt uint32
	// Stale: a settle named a delivery that is not current.
	Stale bool
	// Err: this item was refused (ErrPermissionDenied: not the delivery's
	// receipt); nothing was done for it.
	Err error
}

func batchSize(what string, n int) error {
	switch {
	case n == 0:
		return fmt.Errorf("%w: %s batch holds no item", ErrInvalid, what)
	case n > MaxQueueBatch:
		return fmt.Errorf("%w: %s batch holds %d items, the limit is %d", ErrInvalid, what, n, MaxQueueBatch)
	}
	return nil
}

// batchItem is one item of an enqueue: its payload and operation id.
type batchItem struct {
	payload []byte
	opID    string
}

// QueueEnqueued is the outcome for one item of an enqueue batch.
type QueueEnqueued struct {
	// ID: the item enqueued, or for a Duplicate the first one enqueued
	// with its operation id.
	ID        uint64
	Duplicate bool
}

// AppendBatchItem appends one item to the packed items of a
// QueueEnqueueBatch (see fsm.proto).
func AppendBatchItem(b, payload []byte, opID string) []byte {
	b = binary.AppendUvarint(b, uint64(len(payload)))
	b = append(b, payload...)
	b = binary.AppendUvarint(b, uint64(len(opID)))
	return append(b, opID...)
}

// unpackBatchItems decodes the packed items of a QueueEnqueueBatch; the
// payloads share b.
func unpackBatchItems(b []byte) ([]batchItem, error) {
	var out []batchItem
	field := func() ([]byte, error) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return nil, fmt.Errorf("%w: the batch's item %d is cut short", ErrInvalid, len(out))
		}
		v := b[k : k+int(n) : k+int(n)]
		b = b[k+int(n):]
		return v, nil
	}
	for len(b) > 0 {
		if len(out) == MaxQueueBatch {
			return nil, fmt.Errorf("%w: an enqueue batch holds more than %d items, the limit", ErrInvalid, MaxQueueBatch)
		}
		payload, err := field()
		if err != nil {
			return nil, err
		}
		op, err := field()
		if err != nil {
			return nil, err
		}
		out = append(out, batchItem{payload: payload, opID: string(op)})
	}
	return out, nil
}

// enqueueBatch appends items to the named queue. batch: the answer lists
// every item (Enqueued); otherwise items holds one and the answer is its
// own.
func (s *State) enqueueBatch(name string, maxAttempts uint32, items []batchItem, batch bool, emit EventSink) Result {
	if err := ValidateQueueName(name); err != nil {
		return Result{Err: err}
	}
	if batch {
		if err := batchSize("an enqueue", len(items)); err != nil {
			return Result{Err: err}
		}
	}
	for i, it := range items {
		which := ""
		if batch {
			which = fmt.Sprintf("item %d: ", i)
		}
		if n := len(it.payload); n > MaxQueuePayload {
			return Result{Err: fmt.Errorf("%w: %spayload is %d bytes, the limit is %d", ErrInvalid, which, n, MaxQueuePayload)}
		}
		if n := len(it.opID); n > MaxOpIDLen {
			return Result{Err: fmt.Errorf("%w: %soperation id is %d bytes, the limit is %d", ErrInvalid, which, n, MaxOpIDLen)}
		}
	}
	if maxAttempts > MaxQueueAttempts {
		return Result{Err: fmt.Errorf("%w: max attempts %d, the limit is %d", ErrInvalid, maxAttempts, MaxQueueAttempts)}
	}
	q := s.queues.byName[name]
	if q != nil && maxAttempts != 0 && maxAttempts != q.maxAttempts {
		return Result{Err: fmt.Errorf("%w: queue %q has max attempts %d; this enqueue asks for %d", ErrInvalid, q.name, q.maxAttempts, maxAttempts)}
	}
	// Which items are new: an operation id seen before (or earlier in this
	// batch) adds nothing.
	out := make([]QueueEnqueued, len(items))
	var firstOf map[string]int // operation id -> index of its item here
	fresh := 0
	for i, it := range items {
		if op := it.opID; op != "" {
			if q != nil {
				if e, seen := q.ops.get(op); seen {
					out[i] = QueueEnqueued{ID: e.id, Duplicate: true}
					continue
				}
			}
			if _, seen := firstOf[op]; seen {
				out[i].Duplicate = true // its ID is the first one's, below
				continue
			}
			if firstOf == nil {
				firstOf = make(map[string]int)
			}
			firstOf[op] = i
		}
		fresh++
	}
	if fresh > 0 {
		have := 0
		if q != nil {
			have = q.length()
		}
		if have == 0 {
			if err := overLimit("max-queues", s.limits.MaxQueues, "queues holding items", uint64(s.queues.nonEmpty), 1); err != nil {
				return Result{Err: err}
			}
		}
		if uint64(have+fresh) > s.limits.MaxQueueLength {
			what := fmt.Sprintf("items in queue %q", name)
			if batch {
				what = fmt.Sprintf("items in queue %q (the batch adds %d)", name, fresh)
			}
			return Result{Err: overLimit("max-queue-length", s.limits.MaxQueueLength, what, uint64(have), uint64(fresh))}
		}
		if q == nil {
			q = newQueue(name, cmp.Or(maxAttempts, DefaultMaxAttempts))
			s.queues.byName[q.name] = q
		}
		var first uint64
		for i, it := range items {
			if out[i].Duplicate {
				if out[i].ID == 0 {
					out[i].ID = out[firstOf[it.opID]].ID
				}
				continue
			}
			id := s.bump()
			if first == 0 {
				first = id
			}
			// The state keeps the command's payload (no copy): a command
			// must not change once applied (FSM.ApplyBatch decodes each
			// entry into fresh memory, and a hinted command is never
			// changed).
			q.ready.enqueued(qItem{id: id, payload: it.payload})
			if it.opID != "" {
				q.ops.put(it.opID, id, 0, "")
			}
			out[i] = QueueEnqueued{ID: id}
		}
		s.queueResized(q, have)
		emit(Event{Kind: EventQueueReady, Name: q.name, Queue: &QueueEvent{ID: first, Ready: fresh, Enqueue: true}})
	}
	if !batch {
		return Result{Queue: &QueueResult{ID: out[0].ID, Duplicate: out[0].Duplicate}}
	}
	return Result{Queue: &QueueResult{Enqueued: out}}
}

// dequeueBatch hands out up to len(hashes) ready items of the named queue
// (see the file comment). batch: the answer lists the items (Items, none
// if the queue had none ready); otherwise hashes holds one and the answer
// is its delivery's, or Empty.
func (s *State) dequeueBatch(name string, session uint64, visMs int64, hashes [][]byte, batch bool, emit EventSink) Result {
	if err := ValidateQueueName(name); err != nil {
		return Result{Err: err}
	}
	if err := ValidateVisibility(visMs); err != nil {
		return Result{Err: err}
	}
	if batch {
		if err := batchSize("a dequeue", len(hashes)); err != nil {
			return Result{Err: err}
		}
	}
	for i, h := range hashes {
		// An empty hash is a single dequeue logged before receipts
		// existed: its delivery is settled only by commands that carry
		// none either, which the server never proposes (it hashes
		// whatever it is given).
		if n := len(h); (n != 0 || batch) && n != sha256.Size {
			which := "receipt hash"
			if batch {
				which = fmt.Sprintf("receipt hash %d", i)
			}
			return Result{Err: fmt.Errorf("%w: %s is %d bytes, want %d", ErrInvalid, which, n, sha256.Size)}
		}
	}
	if session != 0 {
		if _, ok := s.sessions[session]; !ok {
			return Result{Err: ErrSessionNotFound}
		}
	}
	q := s.queues.byName[name]
	var out []QueueItemResult
	bytes := 0
	for _, h := range hashes {
		if q == nil {
			break
		}
		next, ok := q.ready.min()
		if !ok || (len(out) > 0 && bytes+len(next.payload) > MaxQueueBatchBytes) {
			break
		}
		q.ready.popMin()
		bytes += len(next.payload)
		it := qFlight{qItem: next, token: s.bump(), visMs: visMs, session: session, receipt: string(h)}
		it.attempts++
		if it.attempts > 1 {
			s.counters.Redeliveries++
		}
		q.inflight.ReplaceOrInsert(it)
		s.queues.hold(it.session, qref{q.name, it.id})
		emit(Event{Kind: EventQueueLeased, Name: q.name, Queue: &QueueEvent{ID: it.id, Token: it.token, VisibilityMs: it.visMs}})
		out = append(out, QueueItemResult{ID: it.id, Token: it.token, Payload: it.payload, Attempt: it.attempts})
	}
	if !batch {
		if len(out) == 0 {
			return Result{Queue: &QueueResult{Empty: true}}
		}
		d := out[0]
		return Result{Queue: &QueueResult{ID: d.ID, Token: d.Token, Payload: d.Payload, Attempt: d.Attempt}}
	}
	return Result{Queue: &QueueResult{Items: out, Empty: len(out) == 0}}
}

// settleBatch acks or nacks each delivery of c on its own (see the file
// comment).
func (s *State) settleBatch(c *fsmpb.QueueSettleBatch, kind settleKind, emit EventSink) Result {
	if err := ValidateQueueName(c.GetQueue()); err != nil {
		return Result{Err: err}
	}
	if err := batchSize("a "+settleNames[kind], len(c.GetItems())); err != nil {
		return Result{Err: err}
	}
	out := make([]QueueItemResult, len(c.GetItems()))
	bumped := false
	for i, it := range c.GetItems() {
		out[i] = s.settleOne(c.GetQueue(), it.GetId(), it.GetDeliveryToken(), it.GetReceiptHash(), kind, &bumped, emit)
	}
	return Result{Queue: &QueueResult{Items: out}}
}
