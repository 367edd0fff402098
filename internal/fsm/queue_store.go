package fsm

// How a queue holds its items.
//
// A ready item costs what it must: its id, its attempts and its payload
// (qItem, 40 bytes beside the payload). The fields of a delivery exist only
// for items in flight (qFlight). Most ready items sit in a chunked ring in
// id order, where an enqueue appends and a dequeue takes the head; items
// that come back (nack, expiry, a session's end, a requeue) wait in a
// B-tree beside it, since their ids fall anywhere. The smallest ready id is
// the smaller of the two heads. A snapshot rebuilds the ring by appending
// its sorted items, with no search and no per-item node.
//
// Every structure is copy-on-write, so that FSM.Snapshot clones a queue
// under the state lock in time independent of its length (the ring copies
// one pointer per chunk) and serialises the clone while Apply goes on. The
// ring's chunks are never written below their length, and a clone reads
// only up to the length it saw, so appends to the live ring never reach a
// clone; taking the head moves an index and writes nothing.

import (
	"cmp"

	"github.com/google/btree"
)

// qItem is a ready or dead-lettered item.
type qItem struct {
	id       uint64
	payload  []byte
	attempts uint32
}

func itemLess(a, b qItem) bool { return a.id < b.id }

// qFlight is an item in flight: the item and its current delivery.
type qFlight struct {
	qItem
	token   uint64
	visMs   int64
	session uint64
	receipt string // SHA-256 of the delivery's receipt
}

func flightLess(a, b qFlight) bool { return a.id < b.id }

const btreeDegree = 32

func newItemTree() *btree.BTreeG[qItem]     { return btree.NewG(btreeDegree, itemLess) }
func newFlightTree() *btree.BTreeG[qFlight] { return btree.NewG(btreeDegree, flightLess) }

// ringChunk is how many items one chunk of a ring holds.
const ringChunk = 1024

// ring is a FIFO of items in increasing id order: push appends at the
// tail, pop takes the head. Its zero value is empty.
type ring struct {
	chunks [][]qItem
	head   int // index of the first item in chunks[0]
	n      int
}

func (r *ring) len() int { return r.n }

// push appends it, whose id is above every id in r.
func (r *ring) push(it qItem) {
	last := len(r.chunks) - 1
	if last < 0 || len(r.chunks[last]) == ringChunk {
		r.chunks = append(r.chunks, make([]qItem, 0, ringChunk))
		last++
	}
	r.chunks[last] = append(r.chunks[last], it)
	r.n++
}

// front returns the head item.
func (r *ring) front() (qItem, bool) {
	if r.n == 0 {
		return qItem{}, false
	}
	return r.chunks[0][r.head], true
}

// pop removes and returns the head item.
func (r *ring) pop() (qItem, bool) {
	it, ok := r.front()
	if !ok {
		return it, false
	}
	r.head++
	r.n--
	switch {
	case r.n == 0:
		*r = ring{}
	case r.head == len(r.chunks[0]):
		r.chunks[0] = nil // let the chunk go (a clone keeps its own copy of the list)
		r.chunks = r.chunks[1:]
		r.head = 0
	}
	return it, true
}

// clone returns a copy that shares the chunks; see the file comment.
func (r *ring) clone() ring {
	return ring{chunks: append([][]qItem(nil), r.chunks...), head: r.head, n: r.n}
}

// ascend calls fn for every item in id order until it returns false.
func (r *ring) ascend(fn func(qItem) bool) bool {
	for i, c := range r.chunks {
		if i == 0 {
			c = c[r.head:]
		}
		for _, it := range c {
			if !fn(it) {
				return false
			}
		}
	}
	return true
}

// readySet is a queue's ready items: the ring of items in enqueue order
// and the tree of items that came back.
type readySet struct {
	fresh ring
	back  *btree.BTreeG[qItem]
}

func newReadySet() readySet { return readySet{back: newItemTree()} }

func (rs *readySet) len() int { return rs.fresh.len() + rs.back.Len() }

func (rs *readySet) clone() readySet { return readySet{fresh: rs.fresh.clone(), back: rs.back.Clone()} }

// enqueued adds a just enqueued item: its id is the newest.
func (rs *readySet) enqueued(it qItem) { rs.fresh.push(it) }

// returned adds an item that was ready before (its id may be anywhere).
func (rs *readySet) returned(it qItem) { rs.back.ReplaceOrInsert(it) }

// min returns the ready item with the smallest id.
func (rs *readySet) min() (qItem, bool) {
	f, fok := rs.fresh.front()
	b, bok := rs.back.Min()
	switch {
	case fok && (!bok || f.id < b.id):
		return f, true
	case bok:
		return b, true
	}
	return qItem{}, false
}

// popMin removes and returns the ready item with the smallest id.
func (rs *readySet) popMin() (qItem, bool) {
	f, fok := rs.fresh.front()
	b, bok := rs.back.Min()
	switch {
	case fok && (!bok || f.id < b.id):
		return rs.fresh.pop()
	case bok:
		rs.back.DeleteMin()
		return b, true
	}
	return qItem{}, false
}

// ascend calls fn for every ready item in id order until it returns false.
func (rs *readySet) ascend(fn func(qItem) bool) {
	var pending []qItem // back items not yet yielded, in order
	rs.back.Ascend(func(it qItem) bool { pending = append(pending, it); return true })
	ok := rs.fresh.ascend(func(it qItem) bool {
		for len(pending) > 0 && pending[0].id < it.id {
			if !fn(pending[0]) {
				return false
			}
			pending = pending[1:]
		}
		return fn(it)
	})
	for ok && len(pending) > 0 {
		ok = fn(pending[0])
		pending = pending[1:]
	}
}

// memo is a bounded memory of recent keys (oldest evicted first), held in
// two copy-on-write trees so that a snapshot clones it in O(1).
type memo[K cmp.Ordered] struct {
	byKey *btree.BTreeG[memoEntry[K]]
	bySeq *btree.BTreeG[memoEntry[K]]
	seq   uint64
	limit int
}

type memoEntry[K cmp.Ordered] struct {
	seq     uint64
	key     K
	id      uint64
	token   uint64
	receipt string // acks: the acking delivery's receipt hash
}

func newMemo[K cmp.Ordered](limit int) memo[K] {
	return memo[K]{
		byKey: btree.NewG(btreeDegree, func(a, b memoEntry[K]) bool { return a.key < b.key }),
		bySeq: btree.NewG(btreeDegree, func(a, b memoEntry[K]) bool { return a.seq < b.seq }),
		limit: limit,
	}
}

func (m *memo[K]) get(k K) (memoEntry[K], bool) { return m.byKey.Get(memoEntry[K]{key: k}) }

func (m *memo[K]) put(k K, id, token uint64, receipt string) {
	if old, ok := m.byKey.Get(memoEntry[K]{key: k}); ok {
		m.bySeq.Delete(old)
	}
	m.seq++
	e := memoEntry[K]{seq: m.seq, key: k, id: id, token: token, receipt: receipt}
	m.byKey.ReplaceOrInsert(e)
	m.bySeq.ReplaceOrInsert(e)
	for m.bySeq.Len() > m.limit {
		oldest, _ := m.bySeq.DeleteMin()
		m.byKey.Delete(oldest)
	}
}

func (m memo[K]) clone() memo[K] {
	return memo[K]{byKey: m.byKey.Clone(), bySeq: m.bySeq.Clone(), seq: m.seq, limit: m.limit}
}
