package lessor

import "time"

// Deadlines are kept in a min-heap (as etcd's lease_queue.go keeps its
// leases), so that finding what is due costs O(log n) for each entry that
// comes up, not a look at every session on every wake-up.
//
// A session's heap key, at, is never later than its deadline: a keepalive
// moves only the deadline (O(1), no heap work), and when at comes up with
// the deadline still ahead, the entry takes its deadline as its new key and
// sinks back into place. Each session so costs one heap fix per deadline it
// reaches, however often it is kept alive. Keys are on the lessor's clock
// (see Lessor.stalled), so a stall leaves them as they are. The keys live in the heap's own
// array, next to each other, so that sifting reads no entry.

// tick is a time on the lessor's clock, in nanoseconds since
// Lessor.epoch less the stalls seen since the promotion (see
// Lessor.stalled). Eight bytes, not a time.Time's 24: a million sessions
// keep two of them each.
type tick int64

// add is t plus d.
func (t tick) add(d time.Duration) tick { return t + tick(d) }

// sub is t minus u.
func (t tick) sub(u tick) time.Duration { return time.Duration(t - u) }

// slot is an entry's place in a deadlineHeap: its index, -1 when not in it.
// Four bytes, so that a session's entry packs its flags beside it: a heap
// of 2^31 entries would need terabytes for the sessions alone.
type slot struct{ index int32 }

func (s *slot) slotOf() *slot { return s }

// slotted is an entry that embeds a slot.
type slotted interface{ slotOf() *slot }

type heapItem[E slotted] struct {
	at tick
	e  E
}

// deadlineHeap is a min-heap of entries by when they next need looking
// at. It is guarded by Lessor.mu.
type deadlineHeap[E slotted] struct{ items []heapItem[E] }

func (h *deadlineHeap[E]) len() int { return len(h.items) }

// push adds e, due at at.
func (h *deadlineHeap[E]) push(e E, at tick) {
	h.items = append(h.items, heapItem[E]{at: at, e: e})
	i := len(h.items) - 1
	e.slotOf().index = int32(i)
	h.up(i)
}

// remove takes e out, if it is in.
func (h *deadlineHeap[E]) remove(e E) {
	i := int(e.slotOf().index)
	if i < 0 {
		return
	}
	last := len(h.items) - 1
	if i != last {
		h.swap(i, last)
	}
	h.items[last] = heapItem[E]{}
	h.items = h.items[:last]
	e.slotOf().index = -1
	if i != last {
		h.fix(i)
	}
}

// min returns the entry due first and its key.
func (h *deadlineHeap[E]) min() (e E, at tick, ok bool) {
	if len(h.items) == 0 {
		return e, at, false
	}
	return h.items[0].e, h.items[0].at, true
}

// at is e's key; e must be in the heap.
func (h *deadlineHeap[E]) at(e E) tick { return h.items[int(e.slotOf().index)].at }

// popMin removes the entry due first.
func (h *deadlineHeap[E]) popMin() { h.remove(h.items[0].e) }

// move gives e, which is in the heap, the key at.
func (h *deadlineHeap[E]) move(e E, at tick) {
	i := int(e.slotOf().index)
	h.items[i].at = at
	h.fix(i)
}

func (h *deadlineHeap[E]) less(i, j int) bool { return h.items[i].at < h.items[j].at }

func (h *deadlineHeap[E]) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].e.slotOf().index = int32(i)
	h.items[j].e.slotOf().index = int32(j)
}

func (h *deadlineHeap[E]) fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}

func (h *deadlineHeap[E]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

// down sifts i down and reports whether it moved.
func (h *deadlineHeap[E]) down(i int) bool {
	start, n := i, len(h.items)
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if r := c + 1; r < n && h.less(r, c) {
			c = r
		}
		if !h.less(c, i) {
			break
		}
		h.swap(i, c)
		i = c
	}
	return i > start
}
