package fsm_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

func cmdAcquireArgs(a *fsmpb.Acquire) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_Acquire{Acquire: a}}
}

// TestUnusedLocksAreRemoved: a lock with no holder, no waiter and no
// lock-delay is removed however it became unused, so state shrinks and a
// name's permits are fixed only while it is in use.
func TestUnusedLocksAreRemoved(t *testing.T) {
	m := newMachine(t)
	a, b := m.session("a"), m.session("b")

	tok := m.acquire(a, "released", 0)
	m.ok(cmdRelease(a, "released", tok))

	m.acquire(a, "held", 0)
	rb := m.queue(b, "held", 0)
	m.ok(cmdCancel(b, "held", rb.AcquireRevision))

	c := m.session("c")
	m.acquire(c, "closed", 0)
	m.ok(cmdClose(c))

	if got := m.s.LockCount(); got != 1 {
		t.Fatalf("%d locks in use, want 1 (held)", got)
	}

	// shard-7 was a semaphore of 9,999 permits; unused, it can become a mutex.
	r, _ := m.ok(cmdAcquireArgs(&fsmpb.Acquire{Session: a, Name: "shard-7", Permits: 9_999}))
	m.ok(cmdRelease(a, "shard-7", r.Token))
	m.acquire(a, "shard-7", 0)
	if v := m.s.Lock("shard-7"); v.Permits != 1 {
		t.Fatalf("shard-7 has %d permits, want 1", v.Permits)
	}

	// A lock held back by a lock-delay stays until the delay ends.
	d := m.session("d")
	m.acquire(d, "delayed", 1_000)
	exp, _ := m.ok(cmdExpire(d))
	if !m.s.Lock("delayed").Delayed {
		t.Fatal("delayed lock removed")
	}
	m.ok(cmdEndDelay("delayed", exp.Revision))
	if got := m.s.LockCount(); got != 2 {
		t.Fatalf("%d locks in use, want 2 (held, shard-7)", got)
	}
}

// TestHistoryOutlivesTheLock: the grant records of a removed lock stay
// readable (bounded over all names), so a late write can be explained.
func TestHistoryOutlivesTheLock(t *testing.T) {
	m := newMachine(t)
	a := m.session("a")
	var toks []uint64
	for range 3 {
		tok := m.acquire(a, "ledger", 0)
		m.ok(cmdRelease(a, "ledger", tok))
		toks = append(toks, tok)
	}
	h := m.s.History("ledger")
	if len(h) != 3 {
		t.Fatalf("history of the removed lock: %+v", h)
	}
	for i, g := range h {
		if g.Token != toks[i] || g.Ended != "released" || g.Owner != "a" {
			t.Fatalf("record %d: %+v, want token %d released", i, g, toks[i])
		}
	}
	// The history survives a snapshot.
	back, err := fsm.Import(m.s.Export())
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(back.History("ledger")) != fmt.Sprint(h) {
		t.Fatalf("after a snapshot: %+v, want %+v", back.History("ledger"), h)
	}
	// Bounded over all names: the oldest go first.
	for i := range fsm.RemovedHistoryLimit {
		tok := m.acquire(a, fmt.Sprint("n", i), 0)
		m.ok(cmdRelease(a, fmt.Sprint("n", i), tok))
	}
	if h := m.s.History("ledger"); h != nil {
		t.Fatalf("ledger's records outlived the bound: %+v", h)
	}
	if h := m.s.History("n0"); len(h) != 1 {
		t.Fatalf("n0's record: %+v", h)
	}
}

// TestRefusedAcquireChangesNothing: an acquire refused for its arguments
// leaves the lock as it was (it used to mark the lock an election first).
func TestRefusedAcquireChangesNothing(t *testing.T) {
	m := newMachine(t)
	a, b := m.session("a"), m.session("b")
	tok := m.acquire(a, "m", 0)
	m.failsWith(cmdAcquireArgs(&fsmpb.Acquire{Session: b, Name: "m", Election: true, Permits: 2, Wait: true}), fsm.ErrInvalid)
	_, evs := m.ok(cmdRelease(a, "m", tok))
	for _, e := range evs {
		if e.Kind == fsm.EventHolderChanged {
			t.Fatalf("a mutex reports leader changes after a refused election acquire: %+v", e)
		}
	}
}

// TestWriterLeavingHeadAdmitsReaders: when a waiting writer at the head of
// a read-write lock leaves (cancel or session end), the readers queued
// behind it are granted at once beside the readers that hold the lock.
func TestWriterLeavingHeadAdmitsReaders(t *testing.T) {
	for _, leave := range []string{"cancel", "close"} {
		t.Run(leave, func(t *testing.T) {
			m := newMachine(t)
			r1, w, r2 := m.session("r1"), m.session("w"), m.session("r2")
			m.ok(cmdAcquireArgs(&fsmpb.Acquire{Session: r1, Name: "rw", Shared: true}))
			rw, _ := m.ok(cmdAcquireArgs(&fsmpb.Acquire{Session: w, Name: "rw", Wait: true}))
			rr, _ := m.ok(cmdAcquireArgs(&fsmpb.Acquire{Session: r2, Name: "rw", Shared: true, Wait: true}))
			if !rr.Queued {
				t.Fatal("reader overtook the waiting writer")
			}
			var evs []fsm.Event
			if leave == "cancel" {
				_, evs = m.ok(cmdCancel(w, "rw", rw.AcquireRevision))
			} else {
				_, evs = m.ok(cmdClose(w))
			}
			granted := false
			for _, e := range evs {
				granted = granted || (e.Kind == fsm.EventGranted && e.Session == r2)
			}
			if !granted || len(m.s.Lock("rw").Holders) != 2 {
				t.Fatalf("reader behind the writer not granted: events %+v, lock %+v", evs, m.s.Lock("rw"))
			}
		})
	}
}

func TestLimitOnLocksCountsOnlyLocksInUse(t *testing.T) {
	m := newMachine(t)
	m.ok(cmdSetLimits(fsm.Limits{MaxLocks: 1}))
	a := m.session("a")
	for i := range 5 { // used one at a time: never more than one in use
		name := fmt.Sprint("l", i)
		tok := m.acquire(a, name, 0)
		m.ok(cmdRelease(a, name, tok))
	}
	m.acquire(a, "x", 0)
	r, _ := m.apply(cmdAcquire(a, "y", false, 0))
	if !errors.Is(r.Err, fsm.ErrLimit) {
		t.Fatalf("second lock in use: %v, want ErrLimit", r.Err)
	}
}
