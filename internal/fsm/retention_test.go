package fsm_test

import (
	"fmt"
	"testing"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

func cmdRetention(lockHistory, opMemory uint32) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_SetRetention{SetRetention: &fsmpb.SetRetention{LockHistory: lockHistory, RegisterOpMemory: opMemory}}}
}

// TestSetRetentionLockHistory: shrinking the lock history keeps the newest
// records, later grants keep the new bound, and the setting survives a
// snapshot.
func TestSetRetentionLockHistory(t *testing.T) {
	m := newMachine(t)
	sess := m.session("a")
	var tokens []uint64
	for i := 0; i < 10; i++ {
		tok := m.acquire(sess, "l", 0)
		tokens = append(tokens, tok)
		m.ok(cmdRelease(sess, "l", tok))
	}
	if n := len(m.s.History("l")); n != 10 {
		t.Fatalf("history %d records, want 10", n)
	}
	m.ok(cmdRetention(4, 0))
	wantNewest := func(n int) {
		t.Helper()
		h := m.s.History("l")
		if len(h) != n {
			t.Fatalf("history %d records, want %d", len(h), n)
		}
		for i, r := range h {
			if want := tokens[len(tokens)-n+i]; r.Token != want {
				t.Fatalf("record %d token %d, want %d", i, r.Token, want)
			}
		}
	}
	wantNewest(4)
	tok := m.acquire(sess, "l", 0)
	tokens = append(tokens, tok)
	wantNewest(4)
	if h, o := m.s.Retention(); h != 4 || o != fsm.OpMemory {
		t.Fatalf("retention %d/%d, want 4/%d", h, o, fsm.OpMemory)
	}

	s2, err := fsm.Import(m.s.Export())
	if err != nil {
		t.Fatal(err)
	}
	if h, _ := s2.Retention(); h != 4 {
		t.Fatalf("after import lock history %d, want 4", h)
	}
	if string(exportBytes(t, s2)) != string(exportBytes(t, m.s)) {
		t.Fatal("export differs after import")
	}
}

// TestSetRetentionOpMemory: a register remembers exactly the newest
// operation ids of the configured number, in order, across shrinking,
// growing and a snapshot.
func TestSetRetentionOpMemory(t *testing.T) {
	m := newMachineAt(t, 100) // tokens up to 100 are issued
	put := func(i int) fsm.Result {
		r, _ := m.apply(cmdPut("k", "v", uint64(i), fmt.Sprint("op", i)))
		return r
	}
	for i := 1; i <= 10; i++ {
		put(i)
	}
	m.ok(cmdRetention(0, 3))
	dup := func(i int) bool {
		r, _ := m.apply(cmdPut("k", "v", uint64(i), fmt.Sprint("op", i)))
		return r.Duplicate
	}
	for i := 8; i <= 10; i++ {
		if !dup(i) {
			t.Fatalf("op%d forgotten after shrinking to 3", i)
		}
	}
	if dup(7) { // now remembered again as a new (stale) operation, evicting op8
		t.Fatal("op7 still remembered after shrinking to 3")
	}
	m.ok(cmdRetention(0, 5))
	for i := 11; i <= 13; i++ {
		put(i)
	}
	// After the shrink: op8 op9 op10; op7 (new, stale) evicts op8; growing
	// to 5 keeps op9 op10 op7; op11..op13 fill up and evict op9.
	want := []string{"op10", "op7", "op11", "op12", "op13"}
	var got []string
	for _, op := range m.s.Export().GetRegisters()[0].GetOps() {
		got = append(got, op.GetOperationId())
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("remembered %v, want %v", got, want)
	}
	s2, err := fsm.Import(m.s.Export())
	if err != nil {
		t.Fatal(err)
	}
	if string(exportBytes(t, s2)) != string(exportBytes(t, m.s)) {
		t.Fatal("export differs after import")
	}
	if _, o := s2.Retention(); o != 5 {
		t.Fatalf("after import op memory %d, want 5", o)
	}
}

func TestSetRetentionValidates(t *testing.T) {
	m := newMachine(t)
	m.failsWith(cmdRetention(fsm.MaxHistoryLimit+1, 0), fsm.ErrInvalid)
	m.failsWith(cmdRetention(0, fsm.MaxOpMemory+1), fsm.ErrInvalid)
	if h, o := m.s.Retention(); h != fsm.HistoryLimit || o != fsm.OpMemory {
		t.Fatalf("retention %d/%d changed by refused commands", h, o)
	}
}
