package fsm_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// TestFenceFloorMakesOldTokensStale: a state restored with a fence floor
// answers stale to a fenced write whose token is at or below the floor
// (with or without an operation id, on a known or a new register) and
// stores nothing; a token above it is accepted. The floor survives
// export and import.
func TestFenceFloorMakesOldTokensStale(t *testing.T) {
	m := newMachine(t)
	for _, k := range []string{"a", "b", "c"} { // tokens up to 3 issued
		m.ok(cmdKVPut(k, "v", 0))
	}
	m.ok(cmdPut("reg", "old", 3, ""))
	snap := m.s.Export()
	snap.Revision, snap.FenceFloor = 100, 90
	s, err := fsm.Import(snap)
	if err != nil {
		t.Fatal(err)
	}
	if s.FenceFloor() != 90 {
		t.Fatalf("floor %d after import, want 90", s.FenceFloor())
	}
	m = &machine{tb: t, s: s}
	for _, c := range []*fsmpb.Command{cmdPut("reg", "x", 90, ""), cmdPut("reg", "x", 4, "op"), cmdPut("new", "x", 89, ""), cmdPut("new", "x", 1, "op")} {
		before := exportBytes(t, m.s)
		r, _ := m.ok(c)
		if r.Put != fsm.PutStale || r.Duplicate {
			t.Fatalf("put %v below the floor: %+v, want stale", c, r)
		}
		// Stale like any stale write: nothing is stored, only an operation
		// id on an existing register is remembered (its replay answers
		// stale again).
		if c.GetFencedPut().GetOperationId() == "" && !bytes.Equal(before, exportBytes(t, m.s)) {
			t.Fatalf("stale put %v changed the state", c)
		}
	}
	if r, _ := m.ok(cmdPut("new", "x", 91, "")); r.Put != fsm.PutAccepted {
		t.Fatalf("put above the floor: %+v", r)
	}
	again, err := fsm.Import(m.s.Export())
	if err != nil || again.FenceFloor() != 90 {
		t.Fatalf("floor after a round trip: %v %v", again.FenceFloor(), err)
	}
}

// TestImportRefusesFloorAboveRevision: a fence floor above the snapshot's
// revision would refuse every token the state can issue next: bad bytes.
func TestImportRefusesFloorAboveRevision(t *testing.T) {
	snap := fsm.NewState().Export()
	snap.Revision, snap.FenceFloor = 5, 6
	if _, err := fsm.Import(snap); !errors.Is(err, fsm.ErrInvalid) {
		t.Fatalf("import with floor above revision: %v", err)
	}
}
