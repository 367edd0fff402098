package fsm

import (
	"fmt"
	"testing"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// TestSnapshotCopyAllocatesPerStateNotPerItem: what FSM.Snapshot does
// under the state lock (copyCore) makes a bounded number of allocations
// however many sessions, locks and registers there are, where building
// the message there (exportCoreSorted, as before) made several per item.
// An allocation per item under the lock is the stall this guards.
func TestSnapshotCopyAllocatesPerStateNotPerItem(t *testing.T) {
	const n = 2_000
	s := NewState()
	for i := range n {
		if r := s.Apply(&fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: "o", TtlMs: 60_000}}}, nil); r.Err != nil {
			t.Fatal(r.Err)
		}
		name := fmt.Sprintf("n/%d", i)
		if r := s.Apply(&fsmpb.Command{Op: &fsmpb.Command_Acquire{Acquire: &fsmpb.Acquire{Session: s.Revision(), Name: name, Wait: true}}}, nil); r.Err != nil || !r.Granted {
			t.Fatalf("acquire %q: %+v", name, r)
		}
		if r := s.Apply(&fsmpb.Command{Op: &fsmpb.Command_FencedPut{FencedPut: &fsmpb.FencedPut{Key: name, Value: []byte("v"), Token: s.Revision(), OperationId: "op"}}}, nil); r.Err != nil || r.Put != PutAccepted {
			t.Fatalf("put %q: %+v", name, r)
		}
	}
	if s.sessionOrder.Len() != n || s.lockOrder.Len() != n || s.registerOrder.Len() != n {
		t.Fatalf("%d sessions, %d locks, %d registers; want %d of each", s.sessionOrder.Len(), s.lockOrder.Len(), s.registerOrder.Len(), n)
	}
	const bound = 100 // the copy's slices, their growth, the small messages
	if allocs := testing.AllocsPerRun(5, func() { s.copyCore() }); allocs > bound {
		t.Errorf("copyCore made %.0f allocations for %d sessions, locks and registers; want at most %d", allocs, n, bound)
	}
	if allocs := testing.AllocsPerRun(5, func() { s.exportCoreSorted() }); allocs < n {
		t.Errorf("the sorted export made %.0f allocations: this test no longer tells a per-item copy from a flat one", allocs)
	}
}
