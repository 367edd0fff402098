package fsm_test

import (
	"testing"

	"pgregory.net/rapid"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

func cmdAcquireN(sess uint64, name string, wait bool, permits uint32) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_Acquire{Acquire: &fsmpb.Acquire{Session: sess, Name: name, Wait: wait, Permits: permits}}}
}

func TestSemaphorePermitsAndFIFO(t *testing.T) {
	m := newMachine(t)
	a, b, c, d := m.session("a"), m.session("b"), m.session("c"), m.session("d")
	ra, _ := m.ok(cmdAcquireN(a, "s", true, 2))
	rb, _ := m.ok(cmdAcquireN(b, "s", true, 2))
	if !ra.Granted || !rb.Granted || rb.Token <= ra.Token {
		t.Fatalf("two permits: %+v %+v", ra, rb)
	}
	rc, _ := m.ok(cmdAcquireN(c, "s", true, 2))
	rd, _ := m.ok(cmdAcquireN(d, "s", true, 2))
	if !rc.Queued || rc.Position != 1 || !rd.Queued || rd.Position != 2 {
		t.Fatalf("third and fourth should queue: %+v %+v", rc, rd)
	}
	if v := m.s.Lock("s"); len(v.Holders) != 2 || v.Permits != 2 {
		t.Fatalf("view %+v", v)
	}
	// Another limit for the same name is refused, and so is a mutex.
	e := m.session("e")
	m.failsWith(cmdAcquireN(e, "s", true, 3), fsm.ErrInvalid)
	m.failsWith(cmdAcquire(e, "s", true, 0), fsm.ErrInvalid)
	// Releasing b's permit grants c (the first waiter), and only c.
	_, evs := m.ok(cmdRelease(b, "s", rb.Token))
	if g := grantedEvents(evs); len(g) != 1 || g[0].Session != c || g[0].Token <= rb.Token {
		t.Fatalf("hand-off events %+v", evs)
	}
	// A stale handle (b's old token) releases nothing.
	m.failsWith(cmdRelease(b, "s", rb.Token), fsm.ErrNotHeld)
	// Ending a's session frees its permit for d.
	_, evs = m.ok(cmdClose(a))
	if g := grantedEvents(evs); len(g) != 1 || g[0].Session != d {
		t.Fatalf("after close: %+v", evs)
	}
}

// TestSemaphoreProperties: never more than N holders; grants in queue
// order; tokens strictly increase; a free permit never coexists with a
// waiter; ended sessions hold and wait for nothing.
func TestSemaphoreProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		permits := rapid.IntRange(1, 4).Draw(t, "permits")
		s := fsm.NewState()
		var sessions []uint64
		var queue []uint64 // sessions in waiting order
		held := map[uint64]uint64{}
		var lastToken uint64
		for step := 0; step < 60; step++ {
			var granted []fsm.Event
			emit := func(e fsm.Event) {
				if e.Kind == fsm.EventGranted {
					granted = append(granted, e)
				}
			}
			switch rapid.IntRange(0, 3).Draw(t, "op") {
			case 0:
				r := s.Apply(cmdCreate("o", 5000), nil)
				sessions = append(sessions, r.Session)
				r = s.Apply(cmdAcquireN(r.Session, "sem", true, uint32(permits)), emit)
				switch {
				case r.Err != nil:
					t.Fatalf("acquire: %v", r.Err)
				case r.Granted:
					if len(queue) != 0 {
						t.Fatalf("granted past %d waiters", len(queue))
					}
					if r.Token <= lastToken {
						t.Fatalf("token %d after %d", r.Token, lastToken)
					}
					lastToken = r.Token
					held[sessions[len(sessions)-1]] = r.Token
				default:
					queue = append(queue, sessions[len(sessions)-1])
				}
			case 1, 2:
				if len(held) == 0 {
					continue
				}
				var hs []uint64
				for id := range held {
					hs = append(hs, id)
				}
				id := rapid.SampledFrom(sortU64(hs)).Draw(t, "holder")
				var cmd *fsmpb.Command
				if rapid.Bool().Draw(t, "expire") {
					cmd = cmdExpire(id)
				} else {
					cmd = cmdRelease(id, "sem", held[id])
				}
				if r := s.Apply(cmd, emit); r.Err != nil {
					t.Fatalf("%v: %v", cmd, r.Err)
				}
				delete(held, id)
			case 3:
				if len(queue) == 0 {
					continue
				}
				i := rapid.IntRange(0, len(queue)-1).Draw(t, "waiter")
				if r := s.Apply(cmdClose(queue[i]), emit); r.Err != nil {
					t.Fatal(r.Err)
				}
				queue = append(queue[:i], queue[i+1:]...)
			}
			for _, g := range granted {
				if len(queue) == 0 || g.Session != queue[0] {
					t.Fatalf("grant to %d, queue %v", g.Session, queue)
				}
				if g.Token <= lastToken {
					t.Fatalf("token %d after %d", g.Token, lastToken)
				}
				lastToken = g.Token
				held[g.Session] = g.Token
				queue = queue[1:]
			}
			v := s.Lock("sem")
			if len(v.Holders) > permits || len(v.Holders) != len(held) {
				t.Fatalf("%d holders (model %d), %d permits", len(v.Holders), len(held), permits)
			}
			if len(v.Holders) < permits && len(v.Waiters) > 0 {
				t.Fatalf("a free permit and %d waiters", len(v.Waiters))
			}
			if len(v.Waiters) != len(queue) {
				t.Fatalf("%d waiters, model %d", len(v.Waiters), len(queue))
			}
		}
	})
}

func sortU64(xs []uint64) []uint64 {
	for i := 1; i < len(xs); i++ {
		for j := i; j > 0 && xs[j] < xs[j-1]; j-- {
			xs[j], xs[j-1] = xs[j-1], xs[j]
		}
	}
	return xs
}
