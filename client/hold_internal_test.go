package client

import "testing"

// TestLockAsksQuietlyUnlessThePositionIsWanted: an acquire asks the server
// not to answer "queued" unless the caller wants the queue position.
func TestLockAsksQuietlyUnlessThePositionIsWanted(t *testing.T) {
	m := &Mutex{name: "L"}
	if !m.request(true, lockCall{}).GetAcquire().GetQuiet() {
		t.Error("Lock without OnQueued: the acquire is not quiet")
	}
	if m.request(true, lockCall{onQueued: func(int) {}}).GetAcquire().GetQuiet() {
		t.Error("Lock with OnQueued: the acquire is quiet, so the position would never come")
	}
}
