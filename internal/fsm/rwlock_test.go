package fsm_test

import (
	"testing"

	"pgregory.net/rapid"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

func cmdAcquireRW(sess uint64, name string, wait, shared bool) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_Acquire{Acquire: &fsmpb.Acquire{Session: sess, Name: name, Wait: wait, Shared: shared}}}
}

// checkRW fails if a writer shares the lock with anyone.
func checkRW(t interface{ Fatalf(string, ...any) }, v fsm.LockView) {
	writers, readers := 0, 0
	for _, h := range v.Holders {
		if h.Shared {
			readers++
		} else {
			writers++
		}
	}
	if writers > 1 || (writers == 1 && readers > 0) {
		t.Fatalf("%d writers and %d readers hold %q at once", writers, readers, v.Name)
	}
}

func TestRWLockReadersShareWriterWaitsNoStarvation(t *testing.T) {
	m := newMachine(t)
	r1, r2, w, r3 := m.session("r1"), m.session("r2"), m.session("w"), m.session("r3")
	a, _ := m.ok(cmdAcquireRW(r1, "rw", true, true))
	b, _ := m.ok(cmdAcquireRW(r2, "rw", true, true))
	if !a.Granted || !b.Granted {
		t.Fatalf("two readers: %+v %+v", a, b)
	}
	qw, _ := m.ok(cmdAcquireRW(w, "rw", true, false))
	if !qw.Queued {
		t.Fatalf("writer with readers holding: %+v", qw)
	}
	// A reader arriving after a waiting writer waits behind it: a stream of
	// readers cannot starve the writer.
	q3, _ := m.ok(cmdAcquireRW(r3, "rw", true, true))
	if !q3.Queued || q3.Position != 2 {
		t.Fatalf("reader behind a waiting writer: %+v", q3)
	}
	_, evs := m.ok(cmdRelease(r1, "rw", a.Token))
	if len(grantedEvents(evs)) != 0 {
		t.Fatalf("writer granted while a reader holds: %+v", evs)
	}
	_, evs = m.ok(cmdRelease(r2, "rw", b.Token))
	if g := grantedEvents(evs); len(g) != 1 || g[0].Session != w {
		t.Fatalf("last reader out: %+v, want the writer only", evs)
	}
	checkRW(t, m.s.Lock("rw"))
	_, evs = m.ok(cmdClose(w))
	if g := grantedEvents(evs); len(g) != 1 || g[0].Session != r3 {
		t.Fatalf("writer gone: %+v, want r3", evs)
	}
	// Shared acquires are refused on semaphores.
	m.failsWith(&fsmpb.Command{Op: &fsmpb.Command_Acquire{Acquire: &fsmpb.Acquire{Session: r3, Name: "sem", Wait: true, Shared: true, Permits: 3}}}, fsm.ErrInvalid)
}

// TestRWLockRevokedHolderNeverTwoWriters is the bug class of etcd#16221:
// the holder's session is revoked while readers and writers wait; the
// hand-off must not let two writers (or a writer and readers) in.
func TestRWLockRevokedHolderNeverTwoWriters(t *testing.T) {
	m := newMachine(t)
	w1, w2, r1, w3, r2 := m.session("w1"), m.session("w2"), m.session("r1"), m.session("w3"), m.session("r2")
	m.ok(cmdAcquireRW(w1, "rw", true, false))
	for _, c := range []*fsmpb.Command{cmdAcquireRW(w2, "rw", true, false), cmdAcquireRW(r1, "rw", true, true), cmdAcquireRW(w3, "rw", true, false), cmdAcquireRW(r2, "rw", true, true)} {
		if r, _ := m.ok(c); !r.Queued {
			t.Fatalf("%v: %+v", c, r)
		}
	}
	_, evs := m.ok(cmdExpire(w1))
	if g := grantedEvents(evs); len(g) != 1 || g[0].Session != w2 {
		t.Fatalf("after revoking the holder: %+v, want w2 alone", evs)
	}
	checkRW(t, m.s.Lock("rw"))
	// Revoking the next writer too (the reported scenario): r1 alone gets
	// in, then w3 waits for it.
	_, evs = m.ok(cmdExpire(w2))
	if g := grantedEvents(evs); len(g) != 1 || g[0].Session != r1 {
		t.Fatalf("after revoking w2: %+v, want r1 alone (w3 is next, r2 behind it)", evs)
	}
	checkRW(t, m.s.Lock("rw"))
}

// TestRWLockProperties: never a writer together with anyone else; grants
// in queue order; tokens strictly increase; no waiter while the head could
// be admitted.
func TestRWLockProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := fsm.NewState()
		type q struct {
			id     uint64
			shared bool
		}
		var queue []q
		held := map[uint64]uint64{}
		var last uint64
		for step := 0; step < 80; step++ {
			var granted []fsm.Event
			emit := func(e fsm.Event) {
				if e.Kind == fsm.EventGranted {
					granted = append(granted, e)
				}
			}
			if len(held) == 0 || rapid.IntRange(0, 2).Draw(t, "op") == 0 {
				id := s.Apply(cmdCreate("o", 5000), nil).Session
				shared := rapid.Bool().Draw(t, "shared")
				r := s.Apply(cmdAcquireRW(id, "rw", true, shared), emit)
				if r.Granted {
					if len(queue) != 0 || r.Token <= last {
						t.Fatalf("granted past waiters or token %d after %d", r.Token, last)
					}
					last = r.Token
					held[id] = r.Token
				} else {
					queue = append(queue, q{id, shared})
				}
			} else {
				var ids []uint64
				for id := range held {
					ids = append(ids, id)
				}
				id := rapid.SampledFrom(sortU64(ids)).Draw(t, "holder")
				cmd := cmdRelease(id, "rw", held[id])
				if rapid.Bool().Draw(t, "expire") {
					cmd = cmdExpire(id)
				}
				if r := s.Apply(cmd, emit); r.Err != nil {
					t.Fatal(r.Err)
				}
				delete(held, id)
			}
			for _, g := range granted {
				if len(queue) == 0 || g.Session != queue[0].id || g.Token <= last {
					t.Fatalf("grant %+v, queue %v, last %d", g, queue, last)
				}
				last = g.Token
				held[g.Session] = g.Token
				queue = queue[1:]
			}
			v := s.Lock("rw")
			checkRW(t, v)
			if len(v.Holders) != len(held) || len(v.Waiters) != len(queue) {
				t.Fatalf("view %d holders %d waiters, model %d %d", len(v.Holders), len(v.Waiters), len(held), len(queue))
			}
			if len(queue) > 0 {
				head := queue[0]
				writers := len(v.Holders) > 0 && !v.Holders[0].Shared
				if (head.shared && !writers) || (!head.shared && len(v.Holders) == 0) {
					t.Fatalf("head %+v waits although it could be admitted (holders %+v)", head, v.Holders)
				}
			}
		}
	})
}
