package fsm_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

func cmdExpireMany(ids ...uint64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_ExpireSessions{ExpireSessions: &fsmpb.ExpireSessions{Sessions: ids}}}
}

// TestExpireSessionsIsOneExpiryEach: one ExpireSessions leaves the state,
// and emits the events, that one ExpireSession per session would, in its
// order (grants handed on, a lock-delay started, waits withdrawn);
// sessions already gone, or listed twice, are skipped and not counted.
func TestExpireSessionsIsOneExpiryEach(t *testing.T) {
	build := func() (*machine, []uint64) {
		m := newMachine(t)
		var ids []uint64
		for _, owner := range []string{"a", "b", "c", "d"} {
			r, _ := m.ok(cmdCreate(owner, 1000))
			ids = append(ids, r.Session)
		}
		m.ok(cmdAcquire(ids[0], "x", false, 0))
		m.ok(cmdAcquire(ids[1], "x", true, 0)) // b waits for x
		m.ok(cmdAcquire(ids[2], "x", true, 0)) // c too
		m.ok(cmdAcquire(ids[1], "y", false, 500))
		m.ok(cmdAcquire(ids[3], "y", true, 0))
		return m, ids
	}
	one, ids := build()
	var want []fsm.Event
	for _, id := range []uint64{ids[0], ids[1]} {
		_, evs := one.ok(cmdExpire(id))
		want = append(want, evs...)
	}
	batch, _ := build()
	r, got := batch.ok(cmdExpireMany(ids[0], 99, ids[1], ids[0]))
	if r.Expired != 2 {
		t.Fatalf("Expired = %d, want 2", r.Expired)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("events\n%+v\nwant\n%+v", got, want)
	}
	if string(exportBytes(t, batch.s)) != string(exportBytes(t, one.s)) {
		t.Fatal("the state after ExpireSessions differs from one ExpireSession each")
	}
	if batch.s.Revision() != one.s.Revision() {
		t.Fatalf("revision %d, want %d (one per session ended)", batch.s.Revision(), one.s.Revision())
	}
}

// TestExpireSessionsBounded: a list longer than fsm.MaxExpiryBatch is
// refused whole, and changes nothing.
func TestExpireSessionsBounded(t *testing.T) {
	m := newMachine(t)
	r, _ := m.ok(cmdCreate("a", 1000))
	ids := make([]uint64, fsm.MaxExpiryBatch+1)
	for i := range ids {
		ids[i] = r.Session
	}
	rev := m.s.Revision()
	res := m.s.Apply(cmdExpireMany(ids...), nil)
	if !errors.Is(res.Err, fsm.ErrInvalid) || m.s.Revision() != rev || m.s.SessionCount() != 1 {
		t.Fatalf("oversized expiry: %+v, revision %d (was %d), %d sessions", res, m.s.Revision(), rev, m.s.SessionCount())
	}
}
