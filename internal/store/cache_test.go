package store

import (
	"testing"

	"github.com/hashicorp/raft"
)

// TestLogCacheBounded: the cache serves the newest entries from memory,
// holds at most its count and its bytes (the oldest go first), starts
// again after a gap or a DeleteRange, and always answers from the store
// what it no longer holds.
func TestLogCacheBounded(t *testing.T) {
	disk := raft.NewInmemStore()
	c := newLogCache(4, 100, disk)
	put := func(idx uint64, size int) {
		t.Helper()
		if err := c.StoreLog(&raft.Log{Index: idx, Data: make([]byte, size)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := uint64(1); i <= 6; i++ {
		put(i, 10)
	}
	if c.n != 4 || c.ring[c.head].Index != 3 || c.bytes != 40 {
		t.Fatalf("after 6 small entries: %d cached from %d, %d bytes", c.n, c.ring[c.head].Index, c.bytes)
	}
	put(7, 90) // over 100 bytes with the others: the oldest go
	if c.bytes > 100 || c.ring[(c.head+c.n-1)%len(c.ring)].Index != 7 {
		t.Fatalf("after a large entry: %d entries, %d bytes", c.n, c.bytes)
	}
	put(8, 500) // larger than the whole budget: not kept
	if c.n != 0 || c.bytes != 0 {
		t.Fatalf("after an entry over the budget: %d entries, %d bytes", c.n, c.bytes)
	}
	for i := uint64(1); i <= 8; i++ {
		var l raft.Log
		if err := c.GetLog(i, &l); err != nil || l.Index != i {
			t.Fatalf("entry %d: %v %+v", i, err, l)
		}
	}
	put(9, 10)
	put(11, 10) // a gap: starts again
	if c.n != 1 || c.ring[c.head].Index != 11 {
		t.Fatalf("after a gap: %d entries from %d", c.n, c.ring[c.head].Index)
	}
	if err := c.DeleteRange(11, 11); err != nil || c.n != 0 {
		t.Fatalf("after DeleteRange: %v, %d entries", err, c.n)
	}
}
