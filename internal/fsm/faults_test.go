//go:build tenurefault

package fsm_test

import (
	"testing"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// TestUnsafeSkipFenceCheck: the fault-injection switch really lets a stale
// write through (so the suite's checker has something to catch).
func TestUnsafeSkipFenceCheck(t *testing.T) {
	s, err := fsm.Import(&fsmpb.Snapshot{Revision: 100})
	if err != nil {
		t.Fatal(err)
	}
	s.SetUnsafeSkipFenceCheck()
	s.Apply(cmdPut("k", "new", 42, ""), nil)
	r := s.Apply(cmdPut("k", "late", 41, ""), nil)
	if r.Put != fsm.PutAccepted || string(s.Register("k").Value) != "late" {
		t.Fatalf("stale write with the check off: %+v, value %q", r, s.Register("k").Value)
	}
}
