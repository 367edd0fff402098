package lessor

import (
	"testing"
	"unsafe"
)

// TestSessionDeadlineSize: a session's deadline costs the lessor an entry
// of at most 32 bytes and a heap slot of 16, since a million sessions keep
// a million of each.
func TestSessionDeadlineSize(t *testing.T) {
	if n := unsafe.Sizeof(sessionEntry{}); n > 32 {
		t.Errorf("sessionEntry is %d bytes, want at most 32", n)
	}
	if n := unsafe.Sizeof(heapItem[*sessionEntry]{}); n > 16 {
		t.Errorf("a heap slot is %d bytes, want at most 16", n)
	}
}
