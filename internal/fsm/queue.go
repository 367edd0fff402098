package fsm

// The distributed queue.
//
// An item's id is the revision of its enqueue, so ids are unique and grow
// with commit order. Every queue keeps, ordered by id, its ready items,
// its items in flight (handed out under a visibility lease) and its
// dead-lettered items (queue_store.go). A dequeue takes the smallest ready
// id; an item that comes back (nack, visibility expiry, its consumer's
// session ending) is put back under its own id, so it is again ahead of
// everything enqueued after it. Every step is O(log n) in the queue's
// length. Batches of items follow the same path (queue_batch.go).
//
// A delivery's token is the revision at which the item was handed out: a
// later redelivery has a larger one, so (queue, id, token) names exactly one
// delivery. Ack, Nack, Extend and the leader's Expire act only when the item
// is in flight under that exact token; anything else is stale.
//
// Tokens are easy to guess, so a delivery also has a receipt: random bytes
// the proposing server drew and gave to the consumer alone. The log and the
// state keep only its SHA-256 (with the item in flight, and with a
// remembered ack). Ack, Nack and Extend carry the hash of the receipt they
// were given; for the current delivery (or a remembered ack) any other hash
// is ErrPermissionDenied and changes nothing. The leader's Expire carries
// none and needs none.
//
// A queue that holds no item keeps its max attempts and memories until
// MaxEmptyQueues queues emptied after it; then it is removed (queueSet.empty
// orders the empty queues by the revision at which they became empty).
//
// Every structure is copy-on-write: a snapshot clones a queue under the
// state lock in time independent of its length and serialises the clone
// while Apply goes on (queue_snapshot.go). Items are stored by value and
// never modified in place, so a clone never sees a later change.

import (
	"cmp"
	"crypto/sha256"
	"fmt"
	"iter"
	"math"
	"sort"

	"github.com/google/btree"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// Queue limits of the replicated contract. The server's configurable
// admission limits (payload size, queue length, number of queues) must
// stay within them.
const (
	// MaxQueuePayload is the hard ceiling of an item's payload, bytes.
	MaxQueuePayload = 4 << 20
	// DefaultMaxAttempts is how many deliveries an item gets before it is
	// dead-lettered, unless its queue's first enqueue chose otherwise.
	DefaultMaxAttempts = 5
	// MaxQueueAttempts bounds a queue's max_attempts.
	MaxQueueAttempts = 1000
	// MinVisibilityMs and MaxVisibilityMs bound a delivery's visibility
	// lease (100 ms .. 12 h).
	MinVisibilityMs = 100
	MaxVisibilityMs = 12 * 3600 * 1000
	// QueueOpMemory is how many recent enqueue operation ids each queue
	// remembers; an id older than that is enqueued as new.
	QueueOpMemory = 10_000
	// QueueAckMemory is how many recent acknowledgements each queue
	// remembers, so that a repeated ack with the same token answers acked
	// again; an older repeated ack is answered stale.
	QueueAckMemory = 10_000
	// MaxRequeueBatch bounds the dead-lettered items one requeue moves.
	MaxRequeueBatch = 1000
	// MaxEmptyQueues is how many queues without items the state keeps
	// (with their operation ids, acks and max attempts): the newest
	// emptied, by the revision at which they became empty.
	MaxEmptyQueues = 1000
)

// Queue event kinds; numbered apart from the other kinds.
const (
	// EventQueueReady: Queue.Ready items of queue Name became ready
	// (enqueued, returned or requeued); one waiting consumer per item may
	// be woken. Queue.ID is the (first) item's id.
	EventQueueReady EventKind = 64 + iota
	// EventQueueLeased: item Queue.ID of queue Name is in flight under
	// Queue.Token for Queue.VisibilityMs from now (a delivery or an Extend);
	// the leader arms its visibility timer.
	EventQueueLeased
	// EventQueueSettled: the delivery (Name, Queue.ID, Queue.Token) ended
	// (acked, nacked, expired or its session ended); its timer is moot.
	EventQueueSettled
)

// QueueEvent is the queue part of an Event.
type QueueEvent struct {
	ID           uint64
	Token        uint64
	VisibilityMs int64
	Ready        int
	// Enqueue: the ready item was just enqueued (not returned).
	Enqueue bool
}

// QueueResult is the queue part of a Result.
type QueueResult struct {
	// ID: the item enqueued (or, for a Duplicate, enqueued first),
	// delivered or settled.
	ID uint64
	// Duplicate: an enqueue's operation id was seen before (nothing was
	// added), or an ack repeated the token that already acked the item.
	Duplicate bool
	// Empty: a dequeue found no ready item.
	Empty bool
	// Delivery: the token, payload and attempt number (from 1).
	Token   uint64
	Payload []byte
	Attempt uint32
	// Stale: an Ack/Nack/Extend named a delivery that is not current.
	Stale bool
	// Requeued: how many dead-lettered items a requeue moved.
	Requeued int
	// Deleted: a delete found the queue (and removed it).
	Deleted bool
	// Removed: how many items a delete or purge removed.
	Removed int
	// Items: a dequeue or settle batch's outcome, item by item in the
	// command's order; Enqueued: an enqueue batch's (queue_batch.go).
	Items    []QueueItemResult
	Enqueued []QueueEnqueued
}

type queue struct {
	name        string
	maxAttempts uint32
	ready       readySet
	inflight    *btree.BTreeG[qFlight]
	dead        *btree.BTreeG[qItem]
	ops         memo[string]
	acks        memo[uint64]
	// emptySince is the revision at which the queue last became empty
	// (its key in queueSet.empty while it holds no item).
	emptySince uint64
}

func newQueue(name string, maxAttempts uint32) *queue {
	return &queue{
		name: name, maxAttempts: maxAttempts,
		ready:    newReadySet(),
		inflight: newFlightTree(),
		dead:     newItemTree(),
		ops:      newMemo[string](QueueOpMemory),
		acks:     newMemo[uint64](QueueAckMemory),
	}
}

func (q *queue) clone() *queue {
	return &queue{name: q.name, maxAttempts: q.maxAttempts, ready: q.ready.clone(), inflight: q.inflight.Clone(), dead: q.dead.Clone(), ops: q.ops.clone(), acks: q.acks.clone(), emptySince: q.emptySince}
}

func (q *queue) length() int { return q.ready.len() + q.inflight.Len() + q.dead.Len() }

// qref names an in-flight item held under a session.
type qref struct {
	queue string
	id    uint64
}

// queueSet is the State's queues and, derived from their in-flight items,
// which items each session holds.
type queueSet struct {
	byName  map[string]*queue
	session map[uint64]map[qref]struct{}
	// nonEmpty counts the queues holding at least one item (max-queues).
	nonEmpty int
	// empty holds every queue without items, oldest emptied first.
	empty *btree.BTreeG[emptyRef]
}

// emptyRef orders the empty queues by the revision at which they became
// empty (ties, only from snapshots written before it was recorded, by name).
type emptyRef struct {
	since uint64
	name  string
}

func emptyLess(a, b emptyRef) bool {
	if a.since != b.since {
		return a.since < b.since
	}
	return a.name < b.name
}

func (qs *queueSet) init() {
	if qs.byName == nil {
		qs.byName = make(map[string]*queue)
		qs.session = make(map[uint64]map[qref]struct{})
		qs.empty = btree.NewG(btreeDegree, emptyLess)
	}
}

// resized keeps the counters right after q's length changed from had: the
// queues holding items (max-queues) and the bounded set of empty ones. A
// queue that became empty is the newest empty one (at the current
// revision); the oldest beyond MaxEmptyQueues are removed.
func (s *State) queueResized(q *queue, had int) {
	qs := &s.queues
	switch now := q.length(); {
	case had == 0 && now > 0:
		qs.nonEmpty++
		qs.empty.Delete(emptyRef{q.emptySince, q.name})
		q.emptySince = 0
	case had > 0 && now == 0:
		qs.nonEmpty--
		q.emptySince = s.revision
		qs.empty.ReplaceOrInsert(emptyRef{q.emptySince, q.name})
		qs.trimEmpty()
	}
}

// trimEmpty removes the oldest empty queues beyond MaxEmptyQueues.
func (qs *queueSet) trimEmpty() {
	for qs.empty.Len() > MaxEmptyQueues {
		oldest, _ := qs.empty.DeleteMin()
		delete(qs.byName, oldest.name)
	}
}

// ReceiptHash is what the log and the state keep of a delivery's receipt.
func ReceiptHash(receipt []byte) []byte {
	h := sha256.Sum256(receipt)
	return h[:]
}

func (qs *queueSet) hold(session uint64, r qref) {
	if session == 0 {
		return
	}
	m := qs.session[session]
	if m == nil {
		m = make(map[qref]struct{})
		qs.session[session] = m
	}
	m[r] = struct{}{}
}

func (qs *queueSet) unhold(session uint64, r qref) {
	if session == 0 {
		return
	}
	if m := qs.session[session]; m != nil {
		delete(m, r)
		if len(m) == 0 {
			delete(qs.session, session)
		}
	}
}

// ValidateQueueName checks a queue's name.
func ValidateQueueName(name string) error { return ValidateName("queue name", name) }

// ValidateVisibility checks a visibility lease's length.
func ValidateVisibility(ms int64) error {
	if ms < MinVisibilityMs || ms > MaxVisibilityMs {
		return fmt.Errorf("%w: visibility %dms is outside %dms..%dms", ErrInvalid, ms, MinVisibilityMs, MaxVisibilityMs)
	}
	return nil
}

// applyQueue executes one queue command; ok is false for other commands.
func (s *State) applyQueue(cmd *fsmpb.Command, emit EventSink) (r Result, ok bool) {
	s.queues.init()
	switch op := cmd.GetOp().(type) {
	case *fsmpb.Command_QueueEnqueue:
		c := op.QueueEnqueue
		return s.enqueueBatch(c.GetQueue(), c.GetMaxAttempts(), []batchItem{{c.GetPayload(), c.GetOperationId()}}, false, emit), true
	case *fsmpb.Command_QueueDequeue:
		c := op.QueueDequeue
		return s.dequeueBatch(c.GetQueue(), c.GetSession(), c.GetVisibilityMs(), [][]byte{c.GetReceiptHash()}, false, emit), true
	case *fsmpb.Command_QueueAck:
		return s.settle(op.QueueAck, settleAck, emit), true
	case *fsmpb.Command_QueueNack:
		return s.settle(op.QueueNack, settleNack, emit), true
	case *fsmpb.Command_QueueExpire:
		return s.settle(op.QueueExpire, settleExpire, emit), true
	case *fsmpb.Command_QueueExtend:
		return s.extend(op.QueueExtend, emit), true
	case *fsmpb.Command_QueueRequeueDead:
		return s.requeueDead(op.QueueRequeueDead, emit), true
	case *fsmpb.Command_QueuePurge:
		return s.purgeQueue(op.QueuePurge.GetQueue(), emit), true
	case *fsmpb.Command_QueueDelete:
		return s.deleteQueue(op.QueueDelete.GetQueue(), emit), true
	case *fsmpb.Command_QueueEnqueueBatch:
		c := op.QueueEnqueueBatch
		items, err := unpackBatchItems(c.GetItems())
		if err != nil {
			return Result{Err: err}, true
		}
		return s.enqueueBatch(c.GetQueue(), c.GetMaxAttempts(), items, true, emit), true
	case *fsmpb.Command_QueueDequeueBatch:
		c := op.QueueDequeueBatch
		return s.dequeueBatch(c.GetQueue(), c.GetSession(), c.GetVisibilityMs(), c.GetReceiptHashes(), true, emit), true
	case *fsmpb.Command_QueueAckBatch:
		return s.settleBatch(op.QueueAckBatch, settleAck, emit), true
	case *fsmpb.Command_QueueNackBatch:
		return s.settleBatch(op.QueueNackBatch, settleNack, emit), true
	}
	return Result{}, false
}

type settleKind uint8

const (
	settleAck settleKind = iota + 1
	settleNack
	settleExpire
)

// current returns the item in flight under exactly (id, token).
func (s *State) current(name string, id, token uint64) (*queue, qFlight, bool) {
	q := s.queues.byName[name]
	if q == nil || token == 0 {
		return q, qFlight{}, false
	}
	it, ok := q.inflight.Get(qFlight{qItem: qItem{id: id}})
	if !ok || it.token != token {
		return q, qFlight{}, false
	}
	return q, it, true
}

// notYours is the refusal of a settle whose receipt hash is not the
// delivery's.
func notYours(what string, q *queue, id, token uint64) error {
	return fmt.Errorf("%w: %s of item %d of queue %q with delivery token %d: the receipt is not the one that delivery was handed out with (ack, nack and extend must present the delivery's receipt)", ErrPermissionDenied, what, id, q.name, token)
}

var settleNames = map[settleKind]string{settleAck: "ack", settleNack: "nack", settleExpire: "expire"}

func (s *State) settle(c *fsmpb.QueueSettle, kind settleKind, emit EventSink) Result {
	bumped := false
	r := s.settleOne(c.GetQueue(), c.GetId(), c.GetDeliveryToken(), c.GetReceiptHash(), kind, &bumped, emit)
	if r.Err != nil {
		return Result{Err: r.Err}
	}
	return Result{Queue: &QueueResult{ID: r.ID, Stale: r.Stale, Duplicate: r.Duplicate}}
}

// settleOne settles one delivery. Unless *bumped, a change takes a new
// revision and sets *bumped: the items of a batch share one. A refusal for
// the receipt is the item's Err.
func (s *State) settleOne(name string, id, token uint64, receiptHash []byte, kind settleKind, bumped *bool, emit EventSink) QueueItemResult {
	q, it, ok := s.current(name, id, token)
	if !ok {
		if kind == settleAck && q != nil {
			if e, seen := q.acks.get(id); seen && e.token == token {
				if e.receipt != string(receiptHash) {
					return QueueItemResult{ID: id, Err: notYours("ack", q, id, token)}
				}
				return QueueItemResult{ID: id, Duplicate: true} // acked again: idempotent
			}
		}
		return QueueItemResult{ID: id, Stale: true}
	}
	if kind != settleExpire && it.receipt != string(receiptHash) {
		return QueueItemResult{ID: id, Err: notYours(settleNames[kind], q, it.id, it.token)}
	}
	if !*bumped {
		s.bump()
		*bumped = true
	}
	had := q.length()
	q.inflight.Delete(it)
	s.queues.unhold(it.session, qref{q.name, it.id})
	emit(Event{Kind: EventQueueSettled, Name: q.name, Queue: &QueueEvent{ID: it.id, Token: it.token}})
	if kind == settleAck {
		q.acks.put(it.id, it.id, it.token, it.receipt)
		s.queueResized(q, had)
		return QueueItemResult{ID: it.id}
	}
	s.putBack(q, it.qItem, emit)
	return QueueItemResult{ID: it.id}
}

// putBack returns a delivered item to its place among the ready items, or
// to the dead letters once it has had max attempts deliveries.
func (s *State) putBack(q *queue, it qItem, emit EventSink) {
	if it.attempts >= q.maxAttempts {
		// A copy of its own: the payload may share a restored chunk, which
		// a dead letter must not keep (queue_snapshot.go).
		it.payload = append([]byte(nil), it.payload...)
		q.dead.ReplaceOrInsert(it)
		s.counters.DeadLettered++
		return
	}
	q.ready.returned(it)
	emit(Event{Kind: EventQueueReady, Name: q.name, Queue: &QueueEvent{ID: it.id, Ready: 1}})
}

func (s *State) extend(c *fsmpb.QueueExtend, emit EventSink) Result {
	if err := ValidateVisibility(c.GetVisibilityMs()); err != nil {
		return Result{Err: err}
	}
	q, it, ok := s.current(c.GetQueue(), c.GetId(), c.GetDeliveryToken())
	if !ok {
		return Result{Queue: &QueueResult{ID: c.GetId(), Stale: true}}
	}
	if it.receipt != string(c.GetReceiptHash()) {
		return Result{Err: notYours("extend", q, it.id, it.token)}
	}
	s.bump()
	it.visMs = c.GetVisibilityMs()
	q.inflight.ReplaceOrInsert(it)
	emit(Event{Kind: EventQueueLeased, Name: q.name, Queue: &QueueEvent{ID: it.id, Token: it.token, VisibilityMs: it.visMs}})
	return Result{Queue: &QueueResult{ID: it.id}}
}

func (s *State) requeueDead(c *fsmpb.QueueRequeueDead, emit EventSink) Result {
	if len(c.GetIds()) > MaxRequeueBatch || c.GetLimit() > MaxRequeueBatch {
		return Result{Err: fmt.Errorf("%w: a requeue moves at most %d items", ErrInvalid, MaxRequeueBatch)}
	}
	q := s.queues.byName[c.GetQueue()]
	if q == nil || q.dead.Len() == 0 {
		return Result{Queue: &QueueResult{}}
	}
	var moved []qItem
	if len(c.GetIds()) > 0 {
		for _, id := range c.GetIds() {
			if it, ok := q.dead.Delete(qItem{id: id}); ok {
				moved = append(moved, it)
			}
		}
	} else {
		limit := int(cmp.Or(c.GetLimit(), MaxRequeueBatch))
		for len(moved) < limit {
			it, ok := q.dead.DeleteMin()
			if !ok {
				break
			}
			moved = append(moved, it)
		}
	}
	if len(moved) == 0 {
		return Result{Queue: &QueueResult{}}
	}
	s.bump()
	for _, it := range moved {
		it.attempts = 0
		q.ready.returned(it)
	}
	emit(Event{Kind: EventQueueReady, Name: q.name, Queue: &QueueEvent{ID: moved[0].id, Ready: len(moved)}})
	return Result{Queue: &QueueResult{Requeued: len(moved)}}
}

// queueSessionEnded returns every item the session holds in flight, in
// (queue, id) order. Called by endSession after its bump.
func (s *State) queueSessionEnded(session uint64, emit EventSink) {
	held := s.queues.session[session]
	if len(held) == 0 {
		return
	}
	refs := make([]qref, 0, len(held))
	for r := range held {
		refs = append(refs, r)
	}
	sort.Slice(refs, func(i, j int) bool {
		if refs[i].queue != refs[j].queue {
			return refs[i].queue < refs[j].queue
		}
		return refs[i].id < refs[j].id
	})
	delete(s.queues.session, session)
	for _, r := range refs {
		q := s.queues.byName[r.queue]
		it, _ := q.inflight.Delete(qFlight{qItem: qItem{id: r.id}})
		emit(Event{Kind: EventQueueSettled, Name: q.name, Queue: &QueueEvent{ID: it.id, Token: it.token}})
		s.putBack(q, it.qItem, emit)
	}
}

// QueueStatsView describes a queue for readers.
type QueueStatsView struct {
	Exists      bool
	Ready       int
	InFlight    int
	Dead        int
	MaxAttempts uint32
	// OldestID is the smallest id among ready and in-flight items (0: none).
	OldestID uint64
}

// QueueStats describes the named queue; an unknown queue is empty.
func (s *State) QueueStats(name string) QueueStatsView {
	q := s.queues.byName[name]
	if q == nil {
		return QueueStatsView{MaxAttempts: DefaultMaxAttempts}
	}
	v := QueueStatsView{Exists: true, Ready: q.ready.len(), InFlight: q.inflight.Len(), Dead: q.dead.Len(), MaxAttempts: q.maxAttempts}
	if it, ok := q.ready.min(); ok {
		v.OldestID = it.id
	}
	if it, ok := q.inflight.Min(); ok && (v.OldestID == 0 || it.id < v.OldestID) {
		v.OldestID = it.id
	}
	return v
}

// QueueCount is the number of queues.
func (s *State) QueueCount() int { return len(s.queues.byName) }

// QueueItems is the number of items all queues store: O(queues).
func (s *State) QueueItems() int {
	n := 0
	for _, q := range s.queues.byName {
		n += q.length()
	}
	return n
}

// QueueLen is the number of items the named queue stores: ready, in
// flight and dead.
func (s *State) QueueLen(name string) int {
	if q := s.queues.byName[name]; q != nil {
		return q.length()
	}
	return 0
}

// QueueItemView is one item of a queue.
type QueueItemView struct {
	ID       uint64
	Payload  []byte
	Attempts uint32
}

// DeadLetters yields the dead-lettered items of name with ids above after,
// by id (finding the first costs O(log n)). The payloads are shared with
// the state: read only. It must be consumed under the state's lock.
func (s *State) DeadLetters(name string, after uint64) iter.Seq[QueueItemView] {
	return func(yield func(QueueItemView) bool) {
		q := s.queues.byName[name]
		if q == nil || after == math.MaxUint64 {
			return
		}
		q.dead.AscendGreaterOrEqual(qItem{id: after + 1}, func(it qItem) bool {
			return yield(QueueItemView{ID: it.id, Payload: it.payload, Attempts: it.attempts})
		})
	}
}

// InFlightView is one delivery in flight.
type InFlightView struct {
	Queue        string
	ID           uint64
	Token        uint64
	VisibilityMs int64
}

// InFlight calls fn for every delivery in flight, by queue name and id.
func (s *State) InFlight(fn func(InFlightView)) {
	for _, name := range sortedKeys(s.queues.byName) {
		s.queues.byName[name].inflight.Ascend(func(it qFlight) bool {
			fn(InFlightView{Queue: name, ID: it.id, Token: it.token, VisibilityMs: it.visMs})
			return true
		})
	}
}
