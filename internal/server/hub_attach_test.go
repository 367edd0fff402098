package server

import (
	"slices"
	"testing"
	"unsafe"
)

// TestHubAttachesEveryStreamOfASession: a session with more than one
// stream attached (a resume while the stream it takes over from is still
// attached) has each one once, whichever leaves first, and none once all
// have left.
func TestHubAttachesEveryStreamOfASession(t *testing.T) {
	h := NewHub()
	a, b, c := &sessionStream{sid: 1}, &sessionStream{sid: 2}, &sessionStream{sid: 3}
	attached := func() []uint64 {
		h.mu.Lock()
		defer h.mu.Unlock()
		var ids []uint64
		for _, ss := range h.attachedLocked(7) {
			ids = append(ids, ss.sid)
		}
		slices.Sort(ids)
		return ids
	}
	want := func(ids ...uint64) {
		t.Helper()
		if got := attached(); !slices.Equal(got, ids) {
			t.Fatalf("attached %v, want %v", got, ids)
		}
	}
	h.attach(7, a)
	h.attach(7, a)
	want(1)
	h.attach(7, b)
	h.attach(7, c)
	h.attach(7, b)
	want(1, 2, 3)
	h.detach(7, a) // the first leaves: another takes its place
	want(2, 3)
	h.detach(7, a) // twice: nothing changes
	want(2, 3)
	h.attach(7, a)
	want(1, 2, 3)
	h.detach(7, c)
	want(1, 2)
	h.detach(7, b)
	h.detach(7, a)
	want()
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.streams) != 0 || len(h.more) != 0 {
		t.Fatalf("%d first streams and %d others left", len(h.streams), len(h.more))
	}
}

// TestSessionStreamSize: an idle session's stream stays within the
// allocator's 192-byte size class (a million idle sessions hold a million
// of them).
func TestSessionStreamSize(t *testing.T) {
	if n := unsafe.Sizeof(sessionStream{}); n > 192 {
		t.Fatalf("a session stream takes %d bytes, more than 192", n)
	}
}
