package fsm

// Queues in snapshots.
//
// Ready and dead-lettered items, which may number millions, are written
// packed, in chunks of about packedChunkBytes (Snapshot.queue_items, one
// fsmpb.QueueItems each): per item the uvarint difference of its id from
// the previous item's in the chunk, its uvarint attempts, its payload's
// uvarint length and the payload. That costs a few bytes per item besides
// the payload and decodes without a message or an allocation per item. A
// queue's other state (max attempts, items in flight, memories) stays in
// its QueueState. Snapshots written before the chunks existed list ready
// and dead items in the QueueState; they are still read.
//
// Persist writes the chunks after every other field, one at a time, so a
// snapshot is never held whole in memory; Restore reads the stream field
// by field (snapshot.go): the chunks as they come, everything else as one
// message. The ready items of a chunk keep their payloads in the chunk's
// buffer (a chunk is freed once none of its items is left); dead-lettered
// items, which may stay for long, get their own copies, as does an item
// whenever it is dead-lettered.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sort"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// packedChunkBytes is the size one packed chunk stops growing at.
const packedChunkBytes = 1 << 20

// snapshotQueueItems is Snapshot.queue_items' field number.
const snapshotQueueItems protowire.Number = 11

// QueueSnapshot is a copy-on-write clone of every queue, taken in O(number
// of queues) under the state lock; Export and Items serialise it later,
// while Apply goes on.
type QueueSnapshot struct{ queues []*queue }

// CloneQueues takes a QueueSnapshot. The caller holds the state lock.
func (s *State) CloneQueues() QueueSnapshot {
	var qs QueueSnapshot
	for _, name := range sortedKeys(s.queues.byName) {
		qs.queues = append(qs.queues, s.queues.byName[name].clone())
	}
	return qs
}

// Export serialises the cloned queues, by name, without their ready and
// dead items (see Items). It needs no lock and may run concurrently with
// Apply.
func (qs QueueSnapshot) Export() []*fsmpb.QueueState {
	out := make([]*fsmpb.QueueState, 0, len(qs.queues))
	for _, q := range qs.queues {
		st := &fsmpb.QueueState{Name: q.name, MaxAttempts: q.maxAttempts, EmptySince: q.emptySince}
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

// Items calls fn with every chunk of ready and dead-lettered items of the
// cloned queues, in order (by queue name, ready before dead, by id). fn
// must not keep the chunk's bytes; an error from fn stops Items and is
// returned. It needs no lock and may run concurrently with Apply.
func (qs QueueSnapshot) Items(fn func(*fsmpb.QueueItems) error) error {
	buf := make([]byte, 0, packedChunkBytes+4<<10)
	var err error
	for _, q := range qs.queues {
		for _, dead := range []bool{false, true} {
			var prev uint64
			flush := func() {
				if len(buf) > 0 && err == nil {
					err = fn(&fsmpb.QueueItems{Queue: q.name, Dead: dead, Packed: buf})
				}
				buf, prev = buf[:0], 0
			}
			add := func(it qItem) bool {
				buf = binary.AppendUvarint(buf, it.id-prev)
				buf = binary.AppendUvarint(buf, uint64(it.attempts))
				buf = binary.AppendUvarint(buf, uint64(len(it.payload)))
				buf = append(buf, it.payload...)
				prev = it.id
				if len(buf) >= packedChunkBytes {
					flush()
				}
				return err == nil
			}
			if dead {
				q.dead.Ascend(add)
			} else {
				q.ready.ascend(add)
			}
			flush()
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// WriteItems writes the chunks of Items to w as Snapshot.queue_items
// fields: appended to an encoded Snapshot, they make one.
func (qs QueueSnapshot) WriteItems(w io.Writer) error {
	var hdr []byte
	return qs.Items(func(c *fsmpb.QueueItems) error {
		// The chunk's message: queue (1), dead (2), packed (3).
		var msg []byte
		msg = protowire.AppendTag(msg, 1, protowire.BytesType)
		msg = protowire.AppendString(msg, c.GetQueue())
		if c.GetDead() {
			msg = protowire.AppendTag(msg, 2, protowire.VarintType)
			msg = protowire.AppendVarint(msg, 1)
		}
		msg = protowire.AppendTag(msg, 3, protowire.BytesType)
		msg = protowire.AppendVarint(msg, uint64(len(c.GetPacked())))
		hdr = protowire.AppendTag(hdr[:0], snapshotQueueItems, protowire.BytesType)
		hdr = protowire.AppendVarint(hdr, uint64(len(msg)+len(c.GetPacked())))
		hdr = append(hdr, msg...)
		if _, err := w.Write(hdr); err != nil {
			return err
		}
		_, err := w.Write(c.GetPacked())
		return err
	})
}

var errPacked = errors.New("packed items are cut short")

// unpack calls fn for every item of a packed chunk, in order; the payloads
// share the chunk's bytes. Ids must increase strictly.
func unpack(c []byte, fn func(qItem) error) error {
	var prev uint64
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
		}
		prev += delta
		if err := fn(qItem{id: prev, attempts: uint32(attempts), payload: c[:size:size]}); err != nil {
			return err
		}
		c = c[size:]
	}
	return nil
}

// itemLoader gathers the chunks of a snapshot's queue items, in any order
// relative to the queues' own state, for importQueues.
type itemLoader struct {
	ready map[string]*ring
	dead  map[string][]qItem
}

// chunk adds the items of c. Its ready payloads keep sharing c's bytes.
func (l *itemLoader) chunk(c *fsmpb.QueueItems) error {
	name := c.GetQueue()
	if l.ready == nil {
		l.ready, l.dead = make(map[string]*ring), make(map[string][]qItem)
	}
	var err error
	if c.GetDead() {
		err = unpack(c.GetPacked(), func(it qItem) error {
			d := l.dead[name]
			if n := len(d); n > 0 && it.id <= d[n-1].id {
				return fmt.Errorf("dead-lettered item %d follows item %d", it.id, d[n-1].id)
			}
			it.payload = append([]byte(nil), it.payload...)
			l.dead[name] = append(d, it)
			return nil
		})
	} else {
		r := l.ready[name]
		if r == nil {
			r = &ring{}
			l.ready[name] = r
		}
		last := uint64(0)
		if r.n > 0 {
			lc := r.chunks[len(r.chunks)-1]
			last = lc[len(lc)-1].id
		}
		err = unpack(c.GetPacked(), func(it qItem) error {
			if it.id <= last {
				return fmt.Errorf("ready item %d follows item %d", it.id, last)
			}
			r.push(it)
			last = it.id
			return nil
		})
	}
	if err != nil {
		return fmt.Errorf("snapshot: queue %q: %w", name, err)
	}
	return nil
}

// importQueues rebuilds the queues of a snapshot, with the items l
// gathered; sessions are already in.
func (s *State) importQueues(states []*fsmpb.QueueState, l *itemLoader) error {
	s.queues.init()
	for _, st := range states {
		if st.GetMaxAttempts() == 0 {
			return fmt.Errorf("snapshot: queue %q has max attempts 0", st.GetName())
		}
		if _, dup := s.queues.byName[st.GetName()]; dup {
			return fmt.Errorf("snapshot: queue %q appears twice", st.GetName())
		}
		q := newQueue(st.GetName(), st.GetMaxAttempts())
		var last uint64 // the ring's newest id
		if r := l.ready[q.name]; r != nil {
			delete(l.ready, q.name)
			if r.n > 0 { // a chunk may hold no item
				q.ready.fresh = *r
				lc := r.chunks[len(r.chunks)-1]
				last = lc[len(lc)-1].id
			}
		}
		for _, list := range [][]*fsmpb.QueueItemState{st.GetReady(), st.GetDead(), st.GetInFlight()} {
			for _, it := range list {
				if it.GetId() == 0 { // ids are revisions; a chunk could not hold it
					return fmt.Errorf("snapshot: queue %q holds an item of id 0", q.name)
				}
			}
		}
		for _, it := range st.GetReady() { // listed: written before the chunks
			it := qItem{id: it.GetId(), payload: it.GetPayload(), attempts: it.GetAttempts()}
			if it.id > last {
				q.ready.enqueued(it)
				last = it.id
			} else {
				q.ready.returned(it)
			}
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
		for _, it := range l.dead[q.name] {
			q.dead.ReplaceOrInsert(it)
		}
		delete(l.dead, q.name)
		for _, it := range st.GetDead() {
			q.dead.ReplaceOrInsert(qItem{id: it.GetId(), payload: it.GetPayload(), attempts: it.GetAttempts()})
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
	var stray []string
	for name := range l.ready {
		stray = append(stray, name)
	}
	for name := range l.dead {
		stray = append(stray, name)
	}
	if len(stray) > 0 {
		sort.Strings(stray)
		return fmt.Errorf("snapshot: items of queue %q, which it does not hold", stray[0])
	}
	s.queues.trimEmpty() // a snapshot written before empty queues were bounded
	return nil
}
