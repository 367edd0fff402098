package lessor

import (
	"container/heap"
	"time"
)

// Deadlines are kept in a min-heap (as etcd's lease_queue.go keeps its
// leases), so that finding what is due costs O(log n) for each entry that
// comes up, not a look at every session on every wake-up.
//
// A session's heap position is keyed by at, which is never later than its
// deadline: a keepalive moves only the deadline (O(1), no heap work), and
// when at comes up with the deadline still ahead, the entry takes its
// deadline as its new at and sinks back into place. Each session so costs
// one heap fix per deadline it reaches, however often it is kept alive.

// slot is an entry's place in a deadlineHeap.
type slot struct {
	at    time.Time // when the entry next needs looking at
	index int       // in the heap; -1 when not in it
}

func (s *slot) slotOf() *slot { return s }

// slotted is an entry that embeds a slot.
type slotted interface{ slotOf() *slot }

// deadlineHeap is a min-heap of entries by slot.at. It is guarded by
// Lessor.mu.
type deadlineHeap[E slotted] struct{ items heapItems[E] }

// heapItems implements heap.Interface; use deadlineHeap's methods.
type heapItems[E slotted] []E

func (h heapItems[E]) Len() int           { return len(h) }
func (h heapItems[E]) Less(i, j int) bool { return h[i].slotOf().at.Before(h[j].slotOf().at) }
func (h heapItems[E]) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].slotOf().index = i
	h[j].slotOf().index = j
}

func (h *heapItems[E]) Push(x any) {
	e := x.(E)
	e.slotOf().index = len(*h)
	*h = append(*h, e)
}

func (h *heapItems[E]) Pop() any {
	old := *h
	e := old[len(old)-1]
	var zero E
	old[len(old)-1] = zero
	*h = old[:len(old)-1]
	e.slotOf().index = -1
	return e
}

// push adds e, due at at.
func (h *deadlineHeap[E]) push(e E, at time.Time) {
	e.slotOf().at = at
	heap.Push(&h.items, e)
}

// remove takes e out, if it is in.
func (h *deadlineHeap[E]) remove(e E) {
	if i := e.slotOf().index; i >= 0 {
		heap.Remove(&h.items, i)
	}
}

// min returns the entry due first.
func (h *deadlineHeap[E]) min() (e E, ok bool) {
	if len(h.items) == 0 {
		return e, false
	}
	return h.items[0], true
}

// popMin removes the entry due first.
func (h *deadlineHeap[E]) popMin() { heap.Pop(&h.items) }

// postponeMin moves the entry due first to at, which is no earlier.
func (h *deadlineHeap[E]) postponeMin(at time.Time) {
	h.items[0].slotOf().at = at
	heap.Fix(&h.items, 0)
}

// shift moves every entry d later; their order stays.
func (h *deadlineHeap[E]) shift(d time.Duration) {
	for _, e := range h.items {
		s := e.slotOf()
		s.at = s.at.Add(d)
	}
}

func (h *deadlineHeap[E]) len() int { return len(h.items) }

// moveEarlier brings e, which is in the heap, forward to at.
func (h *deadlineHeap[E]) moveEarlier(e E, at time.Time) {
	s := e.slotOf()
	s.at = at
	heap.Fix(&h.items, s.index)
}
