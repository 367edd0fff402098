package fsm_test

import (
	"fmt"
	"iter"
	"math"
	"slices"
	"testing"

	"github.com/tenure-io/tenure/internal/fsm"
)

// take returns the first n items of seq.
func take[V any](seq iter.Seq[V], n int) []V {
	var out []V
	for v := range seq {
		if len(out) == n {
			break
		}
		out = append(out, v)
	}
	return out
}

// pages walks seq(after) in pages of n, each starting after the last item
// of the one before, and returns every item in order.
func pages[V any, C comparable](seq func(after C) iter.Seq[V], cursor func(V) C, n int) []V {
	var all []V
	var after C
	for {
		page := take(seq(after), n)
		all = append(all, page...)
		if len(page) < n {
			return all
		}
		after = cursor(page[len(page)-1])
	}
}

func TestSessionsAfterPages(t *testing.T) {
	m := newMachine(t)
	var live []uint64
	for i := range 50 {
		id := m.session(fmt.Sprintf("o%d", i))
		if i%3 == 0 {
			m.ok(cmdClose(id))
			continue
		}
		live = append(live, id)
	}
	for _, n := range []int{1, 2, 7, 1000} {
		got := pages(func(after uint64) iter.Seq[fsm.SessionView] { return m.s.SessionsAfter(after, -1) },
			func(v fsm.SessionView) uint64 { return v.ID }, n)
		var ids []uint64
		for _, v := range got {
			ids = append(ids, v.ID)
		}
		if !slices.Equal(ids, live) {
			t.Fatalf("pages of %d: %v, want %v", n, ids, live)
		}
	}
	if got := take(m.s.SessionsAfter(math.MaxUint64, -1), 10); len(got) != 0 {
		t.Fatalf("after the largest id: %+v", got)
	}
	if err := m.s.CheckIndexes(); err != nil {
		t.Fatal(err)
	}
}

func TestSessionsAfterBoundsTheNames(t *testing.T) {
	m := newMachine(t)
	a, b := m.session("a"), m.session("b")
	for _, name := range []string{"l3", "l1", "l2", "l0"} {
		m.acquire(a, name, 0)
		m.queue(b, name, 0)
	}
	got := take(m.s.SessionsAfter(0, 2), 10)
	if len(got) != 2 {
		t.Fatalf("sessions %+v", got)
	}
	if v := got[0]; !slices.Equal(v.Held, []string{"l0", "l1"}) || v.HeldCount != 4 || len(v.Waiting) != 0 || v.WaitingCount != 0 {
		t.Fatalf("holder %+v", v)
	}
	if v := got[1]; !slices.Equal(v.Waiting, []string{"l0", "l1"}) || v.WaitingCount != 4 || len(v.Held) != 0 {
		t.Fatalf("waiter %+v", v)
	}
	if all := m.s.Sessions(); len(all[0].Held) != 4 || len(all[1].Waiting) != 4 {
		t.Fatalf("Sessions must list every name: %+v", all)
	}
}

func TestLocksPagesByNameAndPrefix(t *testing.T) {
	m := newMachine(t)
	s1, s2 := m.session("a"), m.session("b")
	names := []string{"b/2", "a", "b/1", "b", "b/10", "c", "ba"}
	for _, n := range names {
		m.acquire(s1, n, 0)
	}
	m.queue(s2, "b/1", 0)
	m.ok(cmdAcquire(s2, "sem", false, 0))
	slices.Sort(names)
	all := append(slices.Clone(names), "sem")
	slices.Sort(all)
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{"", all},
		{"b", []string{"b", "b/1", "b/10", "b/2", "ba"}},
		{"b/", []string{"b/1", "b/10", "b/2"}},
		{"z", nil},
	} {
		for _, n := range []int{1, 2, 100} {
			got := pages(func(after string) iter.Seq[fsm.LockSummary] { return m.s.Locks(tc.prefix, after) },
				func(l fsm.LockSummary) string { return l.Name }, n)
			var gotNames []string
			for _, l := range got {
				gotNames = append(gotNames, l.Name)
			}
			if !slices.Equal(gotNames, tc.want) {
				t.Fatalf("prefix %q in pages of %d: %v, want %v", tc.prefix, n, gotNames, tc.want)
			}
		}
	}
	// after before the prefix starts at the prefix; after past it is empty.
	if got := take(m.s.Locks("b/", "a"), 1); len(got) != 1 || got[0].Name != "b/1" {
		t.Fatalf("after before the prefix: %+v", got)
	}
	if got := take(m.s.Locks("b/", "b/2"), 1); len(got) != 0 {
		t.Fatalf("after the prefix's last name: %+v", got)
	}
	l := take(m.s.Locks("b/1", ""), 1)[0]
	if l != (fsm.LockSummary{Name: "b/1", Kind: fsm.KindMutex, Permits: 1, Holders: 1, Waiters: 1}) {
		t.Fatalf("summary of b/1: %+v", l)
	}
	if got := m.s.LockSummary("b/1"); got != l {
		t.Fatalf("LockSummary %+v, listing %+v", got, l)
	}
	if got := m.s.LockSummary("none"); got != (fsm.LockSummary{Name: "none", Kind: fsm.KindMutex, Permits: 1}) {
		t.Fatalf("unknown lock: %+v", got)
	}
}

func TestLockHoldersAndWaitersPages(t *testing.T) {
	m := newMachine(t)
	var holders, waiters []uint64 // tokens, queued revisions
	for range 5 {
		s := m.session("h")
		r, _ := m.ok(cmdAcquireN(s, "sem", false, 5))
		holders = append(holders, r.Token)
	}
	for range 7 {
		s := m.session("w")
		r, _ := m.ok(cmdAcquireN(s, "sem", true, 5))
		waiters = append(waiters, r.AcquireRevision)
	}
	for _, n := range []int{1, 3, 100} {
		hs := pages(func(after uint64) iter.Seq[fsm.HolderView] { return m.s.LockHolders("sem", after) },
			func(h fsm.HolderView) uint64 { return h.Token }, n)
		var got []uint64
		for _, h := range hs {
			got = append(got, h.Token)
		}
		if !slices.Equal(got, holders) {
			t.Fatalf("holders in pages of %d: %v, want %v", n, got, holders)
		}
		ws := pages(func(after uint64) iter.Seq[fsm.WaiterView] { return m.s.LockWaiters("sem", after) },
			func(w fsm.WaiterView) uint64 { return w.AcquireRevision }, n)
		got = nil
		for _, w := range ws {
			got = append(got, w.AcquireRevision)
		}
		if !slices.Equal(got, waiters) {
			t.Fatalf("waiters in pages of %d: %v, want %v", n, got, waiters)
		}
	}
	if got := take(m.s.LockWaiters("sem", math.MaxUint64), 1); len(got) != 0 {
		t.Fatalf("waiters after 2^64-1: %+v", got)
	}
	if got := take(m.s.LockHolders("none", 0), 1); len(got) != 0 {
		t.Fatalf("holders of an unknown lock: %+v", got)
	}
}

func TestKVFromPages(t *testing.T) {
	m := newMachine(t)
	for _, k := range []string{"p/b", "p/a", "q", "p/c", "o"} {
		m.ok(cmdKVPut(k, "v", 0))
	}
	var keys []string
	for kv := range m.s.KVFrom("p/", "p/b") {
		keys = append(keys, kv.Key)
	}
	if !slices.Equal(keys, []string{"p/b", "p/c"}) {
		t.Fatalf("from p/b: %v", keys)
	}
	keys = nil
	for kv := range m.s.KVFrom("p/", "") {
		keys = append(keys, kv.Key)
	}
	if !slices.Equal(keys, []string{"p/a", "p/b", "p/c"}) {
		t.Fatalf("from the start: %v", keys)
	}
}

// The indexes are rebuilt by Import.
func TestIndexesSurviveASnapshot(t *testing.T) {
	m := newMachine(t)
	a := m.session("a")
	m.session("b")
	m.acquire(a, "x", 0)
	m.acquire(a, "y", 0)
	s, err := fsm.Import(m.s.Export())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CheckIndexes(); err != nil {
		t.Fatal(err)
	}
	if got := take(s.SessionsAfter(a, -1), 10); len(got) != 1 || got[0].ID != a+1 {
		t.Fatalf("sessions after %d: %+v", a, got)
	}
	if got := take(s.Locks("", "x"), 10); len(got) != 1 || got[0].Name != "y" {
		t.Fatalf("locks after x: %+v", got)
	}
}
