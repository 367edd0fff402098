package fsm_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

func cmdPutLock(key, value string, token uint64, lock, opID string) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_FencedPut{FencedPut: &fsmpb.FencedPut{Key: key, Value: []byte(value), Token: token, Lock: lock, OperationId: opID}}}
}

func cmdDelete(key string, token uint64, lock, opID string) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_FencedDelete{FencedDelete: &fsmpb.FencedDelete{Key: key, Token: token, Lock: lock, OperationId: opID}}}
}

// newMachineAt is newMachine with the state already at revision rev, so
// that every token up to rev counts as issued.
func newMachineAt(tb testing.TB, rev uint64) *machine {
	tb.Helper()
	s, err := fsm.Import(&fsmpb.Snapshot{Revision: rev})
	if err != nil {
		tb.Fatal(err)
	}
	return &machine{tb: tb, s: s}
}

// wantPut applies cmd (a fenced put or delete) and checks its outcome and
// the key's accepted token after it.
func (m *machine) wantPut(cmd *fsmpb.Command, out fsm.PutOutcome, accepted uint64) fsm.Result {
	m.tb.Helper()
	r, _ := m.ok(cmd)
	if r.Put != out || r.Duplicate || r.AcceptedToken != accepted {
		m.tb.Fatalf("%v: %+v, want outcome %v with accepted token %d", cmd, r, out, accepted)
	}
	return r
}

// wantUnchanged applies cmd, which must answer stale, and checks that it
// changed nothing at all.
func (m *machine) wantUnchanged(cmd *fsmpb.Command, accepted uint64) {
	m.tb.Helper()
	before := exportBytes(m.tb, m.s)
	m.wantPut(cmd, fsm.PutStale, accepted)
	if !bytes.Equal(before, exportBytes(m.tb, m.s)) {
		m.tb.Fatalf("%v: stale, but the state changed", cmd)
	}
}

// TestFencedWriteUnissuedToken: a token above the state's revision cannot
// have come from a grant (a token is the revision at its grant). Such a
// write is refused as invalid and stores nothing: no register, no
// operation id, no revision. Before this check one write with token
// 999999999 made every honest holder stale on its key for good.
func TestFencedWriteUnissuedToken(t *testing.T) {
	m := newMachine(t)
	a := m.session("a")
	tok := m.acquire(a, "l", 0)
	m.ok(cmdPut("k", "v", tok, "op"))
	rev := m.s.Revision()
	cases := []struct {
		name  string
		cmd   *fsmpb.Command
		token uint64
	}{
		{"put one above the revision", cmdPut("k", "w", rev+1, ""), rev + 1},
		{"put far above", cmdPut("k", "w", 999999999, ""), 999999999},
		{"put creating a register", cmdPut("new", "w", rev+1, "op-new"), rev + 1},
		{"put naming the lock", cmdPutLock("k", "w", rev+1, "l", ""), rev + 1},
		{"put replaying a remembered op id", cmdPut("k", "w", 999999999, "op"), 999999999},
		{"delete", cmdDelete("k", rev+1, "", ""), rev + 1},
		{"delete of a missing register", cmdDelete("new", 999999999, "", "op-del"), 999999999},
		{"delete naming the lock", cmdDelete("k", 999999999, "l", ""), 999999999},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m.tb = t
			r := m.failsWith(tc.cmd, fsm.ErrInvalid)
			var ue *fsm.UnissuedTokenError
			if !errors.As(r.Err, &ue) || ue.Token != tc.token || ue.Revision != rev {
				t.Fatalf("error %v (%#v), want an UnissuedTokenError for token %d at revision %d", r.Err, ue, tc.token, rev)
			}
			want := fmt.Sprintf("token %d was never issued", tc.token)
			if !strings.Contains(r.Err.Error(), want) || !strings.Contains(r.Err.Error(), fmt.Sprint(rev)) {
				t.Fatalf("message %q does not say %q and the revision %d", r.Err, want, rev)
			}
			if m.s.Register("new").Found {
				t.Fatal("a refused write created a register")
			}
		})
	}
	m.tb = t
	// The refused token left no mark: the holder's own token still writes,
	// and so does any token up to the revision.
	m.wantPut(cmdPut("k", "w", tok, ""), fsm.PutAccepted, tok)
	m.wantPut(cmdPut("k", "x", m.s.Revision(), ""), fsm.PutAccepted, m.s.Revision())
}

// TestFencedPutNamingTheLock: a write that names its lock is accepted only
// while its token is a current grant of that lock (Chubby's sequencer
// check), so a holder whose grant ended is stale even though no newer
// holder has written and the register's own token is lower.
func TestFencedPutNamingTheLock(t *testing.T) {
	m := newMachine(t)
	a, b := m.session("a"), m.session("b")
	t0 := m.acquire(b, "other", 0)
	m.wantPut(cmdPut("k", "v0", t0, ""), fsm.PutAccepted, t0)
	ta := m.acquire(a, "l", 0)
	if ta <= t0 {
		t.Fatalf("token %d after %d", ta, t0)
	}
	m.wantPut(cmdPutLock("k", "a1", ta, "l", ""), fsm.PutAccepted, ta)

	// A token that is not a grant of the named lock is stale, even when it
	// is a current grant of another lock and above the register's token.
	m.wantUnchanged(cmdPutLock("k", "x", m.acquire(b, "third", 0), "l", ""), ta)

	m.ok(cmdRelease(a, "l", ta)) // a's grant ends; nobody holds l, l is removed
	m.wantUnchanged(cmdPutLock("k", "late", ta, "l", ""), ta)
	m.wantUnchanged(cmdPutLock("fresh", "late", ta, "l", ""), 0)
	if m.s.Register("fresh").Found {
		t.Fatal("a stale write created a register")
	}
	// Stale with an operation id on an existing register: remembered, and
	// its replay answers the first outcome.
	r, _ := m.ok(cmdPutLock("k", "late", ta, "l", "late-op"))
	if r.Put != fsm.PutStale {
		t.Fatalf("late write with op id: %+v", r)
	}
	if r, _ := m.ok(cmdPutLock("k", "late", ta, "l", "late-op")); !r.Duplicate || r.Put != fsm.PutStale {
		t.Fatalf("replay of a stale op: %+v", r)
	}
	if got := m.s.Register("k"); string(got.Value) != "a1" || got.Token != ta {
		t.Fatalf("register %+v after the late writes", got)
	}

	// k is bound to l by the first write that named it: a write naming no
	// lock is checked against l too, so the same late write is stale.
	m.wantUnchanged(cmdPut("k", "late", ta, ""), ta)
	// On a register never written naming a lock, the register's own check
	// applies: ta is not below its token, so the late write goes through.
	// This is the gap naming the lock closes.
	m.wantPut(cmdPut("open", "v", ta, ""), fsm.PutAccepted, ta)
	m.wantPut(cmdPut("open", "late", ta, ""), fsm.PutAccepted, ta)

	// A grant that ended by expiry is stale too; the new holder writes.
	tb := m.acquire(b, "l", 0)
	m.wantPut(cmdPutLock("k", "b1", tb, "l", ""), fsm.PutAccepted, tb)
	m.ok(cmdExpire(b))
	m.wantUnchanged(cmdPutLock("k", "b2", tb, "l", ""), tb)

	// The lock check comes on top of the register's: a current grant
	// below the register's token is stale.
	c := m.session("c")
	tc := m.acquire(c, "l", 0)
	newer := m.acquire(c, "newer", 0)
	m.wantPut(cmdPut("open", "newer", newer, ""), fsm.PutAccepted, newer)
	m.wantUnchanged(cmdPutLock("open", "c1", tc, "l", ""), newer)

	// An invalid lock name is an invalid write.
	m.failsWith(cmdPutLock("k", "x", tc, string([]byte{0xff}), ""), fsm.ErrInvalid)
	m.failsWith(cmdPutLock("k", "x", tc, strings.Repeat("l", fsm.MaxNameLen+1), ""), fsm.ErrInvalid)
}

// TestFencedPutNamingASharedLock: a semaphore or a read-write lock has
// several holders at once; any current grant of it passes.
func TestFencedPutNamingASharedLock(t *testing.T) {
	m := newMachine(t)
	a, b, c := m.session("a"), m.session("b"), m.session("c")
	r1, _ := m.ok(cmdAcquireN(a, "sem", false, 2))
	r2, _ := m.ok(cmdAcquireN(b, "sem", false, 2))
	r3, _ := m.ok(cmdAcquireN(c, "sem", true, 2))
	if !r1.Granted || !r2.Granted || !r3.Queued {
		t.Fatalf("semaphore acquires: %+v %+v %+v", r1, r2, r3)
	}
	m.wantPut(cmdPutLock("s1", "a", r1.Token, "sem", ""), fsm.PutAccepted, r1.Token)
	m.wantPut(cmdPutLock("s2", "b", r2.Token, "sem", ""), fsm.PutAccepted, r2.Token)
	m.wantPut(cmdPutLock("s1", "b", r2.Token, "sem", ""), fsm.PutAccepted, r2.Token)
	// A waiter's acquire revision is not a grant.
	m.wantUnchanged(cmdPutLock("s3", "c", r3.AcquireRevision, "sem", ""), 0)
	// The first holder leaves: its token is stale, the waiter's grant passes.
	m.ok(cmdRelease(a, "sem", r1.Token))
	m.wantUnchanged(cmdPutLock("s3", "a", r1.Token, "sem", ""), 0)
	tc := m.s.Lock("sem").Holders[1].Token
	m.wantPut(cmdPutLock("s3", "c", tc, "sem", ""), fsm.PutAccepted, tc)

	// Two readers of a read-write lock.
	d, e := m.session("d"), m.session("e")
	rd, _ := m.ok(cmdAcquireRW(d, "rw", false, true))
	re, _ := m.ok(cmdAcquireRW(e, "rw", false, true))
	if !rd.Granted || !re.Granted {
		t.Fatalf("readers: %+v %+v", rd, re)
	}
	m.wantPut(cmdPutLock("rw1", "e", re.Token, "rw", ""), fsm.PutAccepted, re.Token)
	m.wantPut(cmdPutLock("rw2", "d", rd.Token, "rw", ""), fsm.PutAccepted, rd.Token)
}

// TestFencedDelete: a fenced delete passes the checks of a write and
// removes the register; the key then remembers the delete's token, so an
// older token cannot write it again.
func TestFencedDelete(t *testing.T) {
	m := newMachine(t)
	a := m.session("a")
	t1 := m.acquire(a, "l", 0)
	m.wantPut(cmdPut("k", "v1", t1, ""), fsm.PutAccepted, t1)
	m.ok(cmdRelease(a, "l", t1))
	t2 := m.acquire(a, "l", 0)

	// A delete below the register's token is stale; the register stays.
	m.wantPut(cmdPut("k", "v2", t2, ""), fsm.PutAccepted, t2)
	m.wantUnchanged(cmdDelete("k", t1, "", ""), t2)
	// A delete naming the lock needs a current grant.
	m.wantUnchanged(cmdDelete("k", t1, "l", ""), t2)

	before := m.s.Revision()
	r := m.wantPut(cmdDelete("k", t2, "l", ""), fsm.PutAccepted, t2)
	if r.Revision != before+1 {
		t.Fatalf("delete took revisions %d..%d", before, r.Revision)
	}
	if got := m.s.Register("k"); got.Found {
		t.Fatalf("deleted register still found: %+v", got)
	}
	// The deleted token's predecessor is stale and creates nothing; so is
	// a delete with it.
	m.wantUnchanged(cmdPut("k", "late", t2-1, ""), t2)
	m.wantUnchanged(cmdPut("k", "late", t1, "op"), t2)
	m.wantUnchanged(cmdDelete("k", t1, "", ""), t2)
	if m.s.Register("k").Found {
		t.Fatal("a stale write re-created the deleted register")
	}
	// The deleted token itself writes again (one holder, many writes).
	m.wantPut(cmdPut("k", "again", t2, ""), fsm.PutAccepted, t2)
	if got := m.s.Register("k"); !got.Found || string(got.Value) != "again" {
		t.Fatalf("register %+v", got)
	}

	// A delete of a register that does not exist is accepted and raises
	// the key's token like one that does.
	tn := m.s.Revision()
	m.wantPut(cmdDelete("never", tn, "", ""), fsm.PutAccepted, tn)
	m.wantUnchanged(cmdPut("never", "x", tn-1, ""), tn)

	// A stale delete with an operation id is remembered like a stale put.
	r, _ = m.ok(cmdDelete("k", t1, "", "del-op"))
	if r.Put != fsm.PutStale {
		t.Fatalf("stale delete with op id: %+v", r)
	}
	if r, _ := m.ok(cmdDelete("k", t2, "", "del-op")); !r.Duplicate || r.Put != fsm.PutStale || !m.s.Register("k").Found {
		t.Fatalf("replay of a stale delete: %+v", r)
	}

	// Bad arguments are invalid and change nothing.
	m.failsWith(cmdDelete("", t2, "", ""), fsm.ErrInvalid)
	m.failsWith(cmdDelete("k", 0, "", ""), fsm.ErrInvalid)
	m.failsWith(cmdDelete("k", t2, "", strings.Repeat("o", fsm.MaxOpIDLen+1)), fsm.ErrInvalid)
}

// TestFencedDeleteFreesItsRegister: a deleted register no longer counts
// against max-registers and max-register-bytes.
func TestFencedDeleteFreesItsRegister(t *testing.T) {
	m := newMachineAt(t, 100)
	m.ok(cmdSetLimits(fsm.Limits{MaxRegisters: 1, MaxRegisterBytes: 4}))
	m.wantPut(cmdPut("k", "abc", 10, ""), fsm.PutAccepted, 10) // 1+3 bytes
	if r, _ := m.apply(cmdPut("j", "", 10, "")); !errors.Is(r.Err, fsm.ErrLimit) {
		t.Fatalf("second register under max-registers 1: %v", r.Err)
	}
	m.wantPut(cmdDelete("k", 10, "", ""), fsm.PutAccepted, 10)
	m.ok(cmdSetLimits(fsm.Limits{MaxRegisters: 2}))
	m.wantPut(cmdPut("j", "xyz", 10, ""), fsm.PutAccepted, 10) // the 4 bytes are free again
	if r, _ := m.apply(cmdPut("k", "a", 10, "")); !errors.Is(r.Err, fsm.ErrLimit) {
		t.Fatalf("5 bytes under max-register-bytes 4: %v", r.Err)
	}
	// Deleting and re-creating many times keeps the count exact.
	for i := 0; i < 50; i++ {
		m.wantPut(cmdDelete("j", 10, "", ""), fsm.PutAccepted, 10)
		m.wantPut(cmdPut("j", "xyz", 10, ""), fsm.PutAccepted, 10)
	}
	if r, _ := m.apply(cmdPut("k", "a", 10, "")); !errors.Is(r.Err, fsm.ErrLimit) {
		t.Fatalf("5 bytes under max-register-bytes 4 after 50 re-creations: %v", r.Err)
	}
	m.wantPut(cmdPut("j", "x", 10, ""), fsm.PutAccepted, 10) // shrinking frees
	m.wantPut(cmdPut("k", "a", 10, ""), fsm.PutAccepted, 10)
}

// TestFencedDeleteFloor: the memory of deletes is bounded. When the oldest
// remembered delete is dropped, its token becomes a floor below which no
// register is created, so its key still refuses the older tokens, and so
// does every key that has no register.
func TestFencedDeleteFloor(t *testing.T) {
	m := newMachine(t)
	a := m.session("a")
	early := m.acquire(a, "l", 0) // a grant older than every delete below
	m.session("b")
	tokens := make([]uint64, fsm.DeletedRegisterMemory+1)
	for i := range tokens {
		tokens[i] = m.s.Revision()
		m.wantPut(cmdDelete(fmt.Sprint("r", i), tokens[i], "", ""), fsm.PutAccepted, tokens[i])
	}
	snap := m.s.Export()
	if n := len(snap.GetDeletedRegisters()); n != fsm.DeletedRegisterMemory {
		t.Fatalf("%d deletes remembered, want %d", n, fsm.DeletedRegisterMemory)
	}
	if got := snap.GetDeletedRegisters()[0].GetKey(); got != "r1" {
		t.Fatalf("oldest remembered delete is %q, want r1", got)
	}
	if snap.GetRegisterFloor() != tokens[0] {
		t.Fatalf("floor %d, want the dropped delete's token %d", snap.GetRegisterFloor(), tokens[0])
	}
	restored, err := fsm.Import(snap)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(exportBytes(t, m.s), exportBytes(t, restored)) {
		t.Fatal("the restored state exports differently")
	}
	for _, s := range []*fsm.State{m.s, restored} {
		m := &machine{tb: t, s: s}
		// The dropped key: below the floor stale, at the floor accepted.
		m.wantUnchanged(cmdPut("r0", "late", tokens[0]-1, ""), tokens[0])
		// A remembered key: its own delete's token.
		m.wantUnchanged(cmdPut("r1", "late", tokens[1]-1, ""), tokens[1])
		// A key never written: the early grant cannot create it.
		m.wantUnchanged(cmdPut("fresh", "late", early, ""), tokens[0])
		m.wantUnchanged(cmdDelete("fresh", early, "", ""), tokens[0])
		m.wantPut(cmdPut("r0", "ok", tokens[0], ""), fsm.PutAccepted, tokens[0])
		m.wantPut(cmdPut("r1", "ok", tokens[1], ""), fsm.PutAccepted, tokens[1])
		m.wantPut(cmdPut("fresh", "ok", m.s.Revision(), ""), fsm.PutAccepted, m.s.Revision())
	}
	// A register that exists keeps its own check: the early grant's
	// token writes a register it created before the floor rose.
	m2 := newMachine(t)
	b := m2.session("b")
	tb := m2.acquire(b, "l", 0)
	m2.wantPut(cmdPut("mine", "v", tb, ""), fsm.PutAccepted, tb)
	for i := 0; i <= fsm.DeletedRegisterMemory; i++ {
		m2.ok(cmdDelete(fmt.Sprint("r", i), m2.s.Revision(), "", ""))
	}
	if m2.s.Export().GetRegisterFloor() <= tb {
		t.Fatal("the floor did not rise above the early token")
	}
	m2.wantPut(cmdPut("mine", "v2", tb, ""), fsm.PutAccepted, tb)
}
