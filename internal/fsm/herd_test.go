package fsm_test

import (
	"fmt"
	"testing"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// TestThunderingHerd queues 1,000 sessions on one lock and releases each
// holder in turn: every release wakes exactly one waiter, the next in arrival
// order, with a larger token.
func TestThunderingHerd(t *testing.T) {
	const n = 1000
	m := newMachine(t)
	sessions := make([]uint64, n)
	for i := range sessions {
		sessions[i] = m.session(fmt.Sprint("s", i))
	}

	// All arrive with wait=true; the first finds the lock free.
	type handle struct{ session, token, acqRev uint64 }
	var holder handle
	acqRevs := make([]uint64, n)
	for i, s := range sessions {
		r, evs := m.ok(cmdAcquire(s, "herd", true, 0))
		if len(evs) != 0 {
			t.Fatalf("acquire %d emitted %v", i, evs)
		}
		acqRevs[i] = r.AcquireRevision
		if i == 0 {
			if !r.Granted {
				t.Fatalf("first acquire not granted: %+v", r)
			}
			holder = handle{s, r.Token, r.AcquireRevision}
			continue
		}
		if !r.Queued || r.Position != uint32(i) {
			t.Fatalf("acquire %d: %+v, want queued at position %d", i, r, i)
		}
	}
	if w := m.s.Lock("herd").Waiters; len(w) != n-1 {
		t.Fatalf("%d waiters, want %d", len(w), n-1)
	}

	for i := 1; i <= n; i++ {
		r, evs := m.ok(cmdRelease(holder.session, "herd", holder.token))
		if i == n {
			if len(evs) != 0 {
				t.Fatalf("last release emitted %v", evs)
			}
			break
		}
		if len(evs) != 1 || evs[0].Kind != fsm.EventGranted {
			t.Fatalf("release %d emitted %+v, want exactly one EventGranted", i, evs)
		}
		e := evs[0]
		if e.Session != sessions[i] || e.AcquireRevision != acqRevs[i] || e.Name != "herd" {
			t.Fatalf("release %d granted %+v, want session %d (acquisition %d)", i, e, sessions[i], acqRevs[i])
		}
		if e.Token <= holder.token || e.Token != r.Revision {
			t.Fatalf("release %d: token %d after %d at revision %d", i, e.Token, holder.token, r.Revision)
		}
		holder = handle{e.Session, e.Token, e.AcquireRevision}
	}
	m.wantHolder("herd", 0, 0)
	if h := m.s.History("herd"); len(h) != fsm.HistoryLimit {
		t.Fatalf("history has %d records", len(h))
	}
}

// Benchmarks: go test -run '^$' -bench . ./internal/fsm/
// On a 2-vCPU AMD EPYC VM, go1.26.8, when these were written:
//
//	BenchmarkAcquireRelease            337 ns/op   32 B/op  1 allocs/op
//	BenchmarkHandoff/waiters=1         541 ns/op   80 B/op  2 allocs/op
//	BenchmarkHandoff/waiters=1000      572 ns/op   80 B/op  2 allocs/op
//
// (The hand-off cost does not grow with the queue.)

// BenchmarkAcquireRelease measures an uncontended acquire and release
// through State.Apply.
func BenchmarkAcquireRelease(b *testing.B) {
	s := fsm.NewState()
	sess := s.Apply(cmdCreate("bench", 10_000), nil).Session
	acquire := cmdAcquire(sess, "lock", false, 0)
	release := cmdRelease(sess, "lock", 0)
	b.ReportAllocs()
	for b.Loop() {
		r := s.Apply(acquire, nil)
		if !r.Granted {
			b.Fatalf("acquire: %+v", r)
		}
		release.GetRelease().Token = r.Token
		if r := s.Apply(release, nil); r.Err != nil {
			b.Fatalf("release: %v", r.Err)
		}
	}
}

// BenchmarkHandoff measures a release that grants the lock to the first
// waiter, plus the re-queueing of the released session, with queues of
// different depths: the hand-off should not depend on the depth.
func BenchmarkHandoff(b *testing.B) {
	for _, depth := range []int{1, 1000} {
		b.Run(fmt.Sprint("waiters=", depth), func(b *testing.B) {
			s := fsm.NewState()
			var granted fsm.Event
			sink := func(e fsm.Event) {
				if e.Kind == fsm.EventGranted {
					granted = e
				}
			}
			queue := make(map[uint64]*fsmpb.Command) // session -> its waiting acquire
			var holder, token uint64
			for i := 0; i <= depth; i++ {
				id := s.Apply(cmdCreate(fmt.Sprint("s", i), 10_000), nil).Session
				queue[id] = cmdAcquire(id, "lock", true, 0)
				r := s.Apply(queue[id], nil)
				if r.Granted {
					holder, token = id, r.Token
				}
			}
			release := cmdRelease(0, "lock", 0)
			b.ReportAllocs()
			for b.Loop() {
				rel := release.GetRelease()
				rel.Session, rel.Token = holder, token
				granted = fsm.Event{}
				if r := s.Apply(release, sink); r.Err != nil || granted.Kind != fsm.EventGranted {
					b.Fatalf("release: %v, event %+v", r.Err, granted)
				}
				if r := s.Apply(queue[holder], nil); !r.Queued {
					b.Fatalf("re-queue: %+v", r)
				}
				holder, token = granted.Session, granted.Token
			}
		})
	}
}
