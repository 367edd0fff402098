package fsm

// Queues in snapshots.
//
// Ready and dead-lettered items, which may number millions, are written
// packed (QueueState.ready_packed and dead_packed): chunks of about
// packedChunkBytes, each a run of items in id order with, per item, the
// uvarint difference of its id from the previous item's (from 0 for the
// first of the list), its uvarint attempts, its payload's uvarint length
// and the payload. That costs a few bytes per item besides the payload,
// decodes without a message per item, and rebuilds the ready ring by
// appending (queue_store.go). Items in flight, a delivery's worth of
// fields each, stay messages. Snapshots written before the packed form
// list ready and dead items as messages; they are still read.

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// packedChunkBytes is the size one packed chunk stops growing at.
const packedChunkBytes = 1 << 20

// QueueSnapshot is a copy-on-write clone of every queue, taken in O(number
// of queues) under the state lock; Export serialises it later, while Apply
// goes on.
type QueueSnapshot struct{ queues []*queue }

// CloneQueues takes a QueueSnapshot. The caller holds the state lock.
func (s *State) CloneQueues() QueueSnapshot {
	var qs QueueSnapshot
	for _, name := range sortedKeys(s.queues.byName) {
		qs.queues = append(qs.queues, s.queues.byName[name].clone())
	}
	return qs
}

// packer writes items into packed chunks.
type packer struct {
	chunks [][]byte
	cur    []byte
	prev   uint64
}

func (p *packer) add(it qItem) bool {
	if len(p.cur) >= packedChunkBytes {
		p.chunks = append(p.chunks, p.cur)
		p.cur = nil
	}
	if p.cur == nil {
		p.cur = make([]byte, 0, packedChunkBytes+4<<10)
	}
	p.cur = binary.AppendUvarint(p.cur, it.id-p.prev)
	p.cur = binary.AppendUvarint(p.cur, uint64(it.attempts))
	p.cur = binary.AppendUvarint(p.cur, uint64(len(it.payload)))
	p.cur = append(p.cur, it.payload...)
	p.prev = it.id
	return true
}

func (p *packer) done() [][]byte {
	if len(p.cur) > 0 {
		p.chunks = append(p.chunks, p.cur)
	}
	return p.chunks
}

// Export serialises the cloned queues, by name. It needs no lock and may
// run once, concurrently with Apply.
func (qs QueueSnapshot) Export() []*fsmpb.QueueState {
	out := make([]*fsmpb.QueueState, 0, len(qs.queues))
	for _, q := range qs.queues {
		st := &fsmpb.QueueState{Name: q.name, MaxAttempts: q.maxAttempts, EmptySince: q.emptySince}
		var ready, dead packer
		q.ready.ascend(ready.add)
		q.dead.Ascend(dead.add)
		st.ReadyPacked, st.DeadPacked = ready.done(), dead.done()
		if n := q.inflight.Len(); n > 0 {
			st.InFlight = make([]*fsmpb.QueueItemState, 0, n)
		}
		q.inflight.Ascend(func(it qFlight) bool {
			st.InFlight = append(st.InFlight, &fsmpb.QueueItemState{Id: it.id, Payload: it.payload, Attempts: it.attempts, DeliveryToken: it.token, VisibilityMs: it.visMs, Session: it.session, ReceiptHash: []byte(it.receipt)})
			return true
		})
		q.ops.bySeq.Ascend(func(e memoEntry[string]) bool {
			st.Ops = append(st.Ops, &fsmpb.QueueMemo{OperationId: e.key, Id: e.id})
			return true
		})
		q.acks.bySeq.Ascend(func(e memoEntry[uint64]) bool {
			st.Acks = append(st.Acks, &fsmpb.QueueMemo{Id: e.id, Token: e.token, ReceiptHash: []byte(e.receipt)})
			return true
		})
		out = append(out, st)
	}
	return out
}

var errPacked = errors.New("packed items are cut short")

// unpack calls fn for every item of packed chunks, in order, with its own
// copy of the payload. Ids must increase strictly.
func unpack(chunks [][]byte, fn func(qItem)) error {
	var prev uint64
	for _, c := range chunks {
		for len(c) > 0 {
			delta, n := binary.Uvarint(c)
			if n <= 0 {
				return errPacked
			}
			c = c[n:]
			attempts, n := binary.Uvarint(c)
			if n <= 0 {
				return errPacked
			}
			c = c[n:]
			size, n := binary.Uvarint(c)
			if n <= 0 || size > uint64(len(c)-n) {
				return errPacked
			}
			c = c[n:]
			switch {
			case delta == 0 || prev+delta < prev:
				return fmt.Errorf("packed item ids do not increase (%d after %d)", prev+delta, prev)
			case attempts > MaxQueueAttempts:
				return fmt.Errorf("packed item %d has %d attempts", prev+delta, attempts)
			case size > MaxQueuePayload:
				return fmt.Errorf("packed item %d has a payload of %d bytes", prev+delta, size)
			}
			prev += delta
			fn(qItem{id: prev, attempts: uint32(attempts), payload: append([]byte(nil), c[:size]...)})
			c = c[size:]
		}
	}
	return nil
}

// importQueues rebuilds the queues of a snapshot; sessions are already in.
func (s *State) importQueues(states []*fsmpb.QueueState) error {
	s.queues.init()
	for _, st := range states {
		if st.GetMaxAttempts() == 0 {
			return fmt.Errorf("snapshot: queue %q has max attempts 0", st.GetName())
		}
		q := newQueue(st.GetName(), st.GetMaxAttempts())
		var last uint64 // the ring's newest id
		addReady := func(it qItem) {
			if it.id > last {
				q.ready.enqueued(it)
				last = it.id
			} else {
				q.ready.returned(it)
			}
		}
		for _, it := range st.GetReady() {
			addReady(qItem{id: it.GetId(), payload: it.GetPayload(), attempts: it.GetAttempts()})
		}
		if err := unpack(st.GetReadyPacked(), addReady); err != nil {
			return fmt.Errorf("snapshot: queue %q: ready items: %w", q.name, err)
		}
		for _, it := range st.GetInFlight() {
			if it.GetSession() != 0 {
				if _, ok := s.sessions[it.GetSession()]; !ok {
					return fmt.Errorf("snapshot: queue %q item %d held by unknown session %d", q.name, it.GetId(), it.GetSession())
				}
			}
			q.inflight.ReplaceOrInsert(qFlight{qItem: qItem{id: it.GetId(), payload: it.GetPayload(), attempts: it.GetAttempts()}, token: it.GetDeliveryToken(), visMs: it.GetVisibilityMs(), session: it.GetSession(), receipt: string(it.GetReceiptHash())})
			s.queues.hold(it.GetSession(), qref{q.name, it.GetId()})
		}
		addDead := func(it qItem) { q.dead.ReplaceOrInsert(it) }
		for _, it := range st.GetDead() {
			addDead(qItem{id: it.GetId(), payload: it.GetPayload(), attempts: it.GetAttempts()})
		}
		if err := unpack(st.GetDeadPacked(), addDead); err != nil {
			return fmt.Errorf("snapshot: queue %q: dead-lettered items: %w", q.name, err)
		}
		// Later enqueues append to the ring: its ids must be below them.
		if it, ok := q.ready.back.Max(); ok {
			last = max(last, it.id)
		}
		if it, ok := q.dead.Max(); ok {
			last = max(last, it.id)
		}
		if it, ok := q.inflight.Max(); ok {
			last = max(last, it.id)
		}
		if last > s.revision {
			return fmt.Errorf("snapshot: queue %q holds item %d, above the snapshot's revision %d", q.name, last, s.revision)
		}
		for _, m := range st.GetOps() {
			q.ops.put(m.GetOperationId(), m.GetId(), 0, "")
		}
		for _, m := range st.GetAcks() {
			q.acks.put(m.GetId(), m.GetId(), m.GetToken(), string(m.GetReceiptHash()))
		}
		s.queues.byName[q.name] = q
		if q.length() > 0 {
			s.queues.nonEmpty++
		} else {
			q.emptySince = st.GetEmptySince()
			s.queues.empty.ReplaceOrInsert(emptyRef{q.emptySince, q.name})
		}
	}
	s.queues.trimEmpty() // a snapshot written before empty queues were bounded
	return nil
}
