package fsm_test

import (
	"errors"
	"testing"

	"github.com/tenure-io/tenure/internal/fsm"
)

// TestRegisterBoundToItsLock: the resource decides which lock a token is
// checked against. Register res/B, first written by a holder of res/B
// naming that lock, is bound to it: a write naming res/A with a current
// grant of res/A (a higher token than the register's) is refused invalid
// and changes nothing; one naming no lock is checked against res/B, so a
// res/A token is stale there. Before, the sender chose the lock and both
// writes were accepted.
func TestRegisterBoundToItsLock(t *testing.T) {
	m := newMachine(t)
	b, a := m.session("b"), m.session("a")
	tb := m.acquire(b, "res/B", 0)
	m.wantPut(cmdPutLock("res/B", "b1", tb, "res/B", ""), fsm.PutAccepted, tb)
	ta := m.acquire(a, "res/A", 0)
	if ta <= tb {
		t.Fatalf("token %d after %d", ta, tb)
	}

	r := m.failsWith(cmdPutLock("res/B", "evil", ta, "res/A", ""), fsm.ErrInvalid)
	var wl *fsm.WrongLockError
	if !errors.As(r.Err, &wl) || wl.Key != "res/B" || wl.Bound != "res/B" || wl.Lock != "res/A" {
		t.Fatalf("write naming res/A: %v, want a WrongLockError naming both locks", r.Err)
	}
	m.failsWith(cmdPutLock("res/B", "evil", ta, "res/A", "op-evil"), fsm.ErrInvalid)
	m.failsWith(cmdDelete("res/B", ta, "res/A", ""), fsm.ErrInvalid)
	// Naming no lock, the register's lock is used: ta is no grant of it.
	m.wantUnchanged(cmdPut("res/B", "evil", ta, ""), tb)
	m.wantUnchanged(cmdDelete("res/B", ta, "", ""), tb)
	if got := m.s.Register("res/B"); string(got.Value) != "b1" || got.Token != tb || got.Lock != "res/B" {
		t.Fatalf("register after the refused writes: %+v", got)
	}
	// Its own holder writes, naming the lock or not.
	m.wantPut(cmdPut("res/B", "b2", tb, ""), fsm.PutAccepted, tb)
	m.wantPut(cmdPutLock("res/B", "b3", tb, "res/B", ""), fsm.PutAccepted, tb)

	// A delete keeps the binding: the key cannot be taken over by
	// another lock's holder after it.
	m.wantPut(cmdDelete("res/B", tb, "res/B", ""), fsm.PutAccepted, tb)
	m.failsWith(cmdPutLock("res/B", "evil", ta, "res/A", ""), fsm.ErrInvalid)
	m.wantUnchanged(cmdPut("res/B", "evil", ta, ""), tb)
	m.wantPut(cmdPut("res/B", "b4", tb, ""), fsm.PutAccepted, tb)
	if got := m.s.Register("res/B"); got.Lock != "res/B" {
		t.Fatalf("re-created register bound to %q", got.Lock)
	}

	// The binding survives a snapshot, and the restored state refuses
	// the same write.
	s2, err := fsm.Import(m.s.Export())
	if err != nil {
		t.Fatal(err)
	}
	m2 := &machine{tb: t, s: s2}
	m2.failsWith(cmdPutLock("res/B", "evil", ta, "res/A", ""), fsm.ErrInvalid)
	m.wantPut(cmdDelete("res/B", tb, "", ""), fsm.PutAccepted, tb)
	s3, err := fsm.Import(m.s.Export())
	if err != nil {
		t.Fatal(err)
	}
	(&machine{tb: t, s: s3}).failsWith(cmdPutLock("res/B", "evil", ta, "res/A", ""), fsm.ErrInvalid)

	// A register first written naming no lock is bound by its first
	// accepted write that names one; a stale one binds nothing.
	m.wantPut(cmdPut("free", "x", tb, ""), fsm.PutAccepted, tb)
	m.wantUnchanged(cmdPutLock("free", "y", tb, "res/A", ""), tb) // tb is no grant of res/A
	m.wantPut(cmdPutLock("free", "y", ta, "res/A", ""), fsm.PutAccepted, ta)
	m.failsWith(cmdPutLock("free", "z", tb, "res/B", ""), fsm.ErrInvalid)
}

// TestRegisterBindingIsReplicatedState: two states fed the same log agree
// on every register's lock, and a snapshot round trip keeps it.
func TestRegisterBindingIsReplicatedState(t *testing.T) {
	log := func(m *machine) {
		s := m.session("s")
		tok := m.acquire(s, "L", 0)
		m.ok(cmdPutLock("k1", "v", tok, "L", ""))
		m.ok(cmdPut("k2", "v", tok, ""))
		m.ok(cmdDelete("k3", tok, "L", ""))
	}
	m1, m2 := newMachine(t), newMachine(t)
	log(m1)
	log(m2)
	b1, b2 := exportBytes(t, m1.s), exportBytes(t, m2.s)
	if string(b1) != string(b2) {
		t.Fatal("equal logs, different states")
	}
	snap := m1.s.Export()
	var bound []string
	for _, r := range snap.GetRegisters() {
		bound = append(bound, r.GetKey()+"="+r.GetLock())
	}
	for _, d := range snap.GetDeletedRegisters() {
		bound = append(bound, "deleted "+d.GetKey()+"="+d.GetLock())
	}
	if got := bound; len(got) != 3 || got[0] != "k1=L" || got[1] != "k2=" || got[2] != "deleted k3=L" {
		t.Fatalf("snapshot bindings %q", got)
	}
	s, err := fsm.Import(snap)
	if err != nil {
		t.Fatal(err)
	}
	if string(exportBytes(t, s)) != string(b1) {
		t.Fatal("a snapshot round trip changed the state")
	}
}
