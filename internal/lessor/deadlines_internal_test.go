package lessor

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

type testEntry struct {
	slot
	id int
}

// TestDeadlineHeapOrder: after random pushes, moves and removals the heap
// gives its entries back in key order, and every entry knows its place.
func TestDeadlineHeapOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var h deadlineHeap[*testEntry]
	keys := map[*testEntry]tick{}
	var in []*testEntry
	for step := 0; step < 20000; step++ {
		switch op := rng.IntN(4); {
		case op < 2 || len(in) == 0:
			e := &testEntry{id: step}
			at := tick(0).add(time.Duration(rng.IntN(1000)) * time.Millisecond)
			h.push(e, at)
			keys[e] = at
			in = append(in, e)
		case op == 2:
			e := in[rng.IntN(len(in))]
			at := tick(0).add(time.Duration(rng.IntN(1000)) * time.Millisecond)
			h.move(e, at)
			keys[e] = at
		default:
			i := rng.IntN(len(in))
			e := in[i]
			h.remove(e)
			if e.index != -1 {
				t.Fatalf("removed entry has index %d", e.index)
			}
			delete(keys, e)
			in = slices.Delete(in, i, i+1)
		}
		for i, it := range h.items {
			if int(it.e.index) != i {
				t.Fatalf("step %d: entry at %d thinks it is at %d", step, i, it.e.index)
			}
		}
	}
	var last tick
	for h.len() > 0 {
		e, at, _ := h.min()
		if at < last || at != keys[e] {
			t.Fatalf("popped key %v after %v (entry's key %v)", at, last, keys[e])
		}
		last = at
		h.popMin()
		delete(keys, e)
	}
	if len(keys) != 0 {
		t.Fatalf("%d entries never came out", len(keys))
	}
}
