package fsm_test

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

func cmdSetTTL(sess uint64, ttlMs int64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_SetSessionTtl{SetSessionTtl: &fsmpb.SetSessionTTL{Session: sess, TtlMs: ttlMs}}}
}

// sessionTTL reads id's TTL the three ways the state answers it: Session,
// Sessions (which the leader's lessor times sessions from at a promotion)
// and the snapshot's export.
func sessionTTL(t *testing.T, st *fsm.State, id uint64) int64 {
	t.Helper()
	ttl, ok := st.Session(id)
	if !ok {
		t.Fatalf("session %d not found", id)
	}
	for _, v := range st.Sessions() {
		if v.ID == id && v.TTLMs != ttl {
			t.Fatalf("Sessions says TTL %d, Session %d", v.TTLMs, ttl)
		}
	}
	for _, ss := range st.Export().GetSessions() {
		if ss.GetId() == id && ss.GetTtlMs() != ttl {
			t.Fatalf("the snapshot says TTL %d, Session %d", ss.GetTtlMs(), ttl)
		}
	}
	return ttl
}

// TestSetSessionTTL: SetSessionTTL changes a live session's TTL, as every
// reader of it sees (Session, Sessions, the snapshot, a state restored
// from it), emits the TTL for the leader's timers, and takes no revision.
func TestSetSessionTTL(t *testing.T) {
	m := newMachine(t)
	r, _ := m.ok(cmdCreateSessionSecret("zookeeper", 10_000, []byte("0123456789abcdef")))
	id := r.Session
	other, _ := m.ok(cmdCreate("b", 10_000))
	rev := m.s.Revision()

	r, evs := m.ok(cmdSetTTL(id, 30_000))
	if want := []fsm.Event{{Kind: fsm.EventSessionTTL, Session: id, TTLMs: 30_000}}; !reflect.DeepEqual(evs, want) {
		t.Fatalf("events %+v, want %+v", evs, want)
	}
	if r.Revision != rev || m.s.Revision() != rev {
		t.Fatalf("revision %d after SetSessionTTL, want %d (unchanged)", m.s.Revision(), rev)
	}
	if got := sessionTTL(t, m.s, id); got != 30_000 {
		t.Fatalf("TTL %d, want 30000", got)
	}
	if got := sessionTTL(t, m.s, other.Session); got != 10_000 {
		t.Fatalf("the other session's TTL %d, want 10000", got)
	}
	if err := m.s.CheckSession(id, []byte("0123456789abcdef")); err != nil {
		t.Fatalf("the session's secret after SetSessionTTL: %v", err)
	}

	// A state restored from the snapshot is the same state.
	restored, err := fsm.Import(m.s.Export())
	if err != nil {
		t.Fatal(err)
	}
	if got := sessionTTL(t, restored, id); got != 30_000 {
		t.Fatalf("restored TTL %d, want 30000", got)
	}
	if !bytes.Equal(exportBytes(t, restored), exportBytes(t, m.s)) {
		t.Fatal("the restored state differs")
	}
	// ... and goes on the same way.
	m.ok(cmdSetTTL(id, 10_000))
	if _, err := applyOK(restored, cmdSetTTL(id, 10_000)); err != nil {
		t.Fatal(err)
	}
	if got := sessionTTL(t, m.s, id); got != 10_000 {
		t.Fatalf("TTL %d after setting it back, want 10000", got)
	}
	if !bytes.Equal(exportBytes(t, restored), exportBytes(t, m.s)) {
		t.Fatal("the restored state diverged after the same command")
	}

	// Its end forgets it: the state is the one where it never changed.
	m.ok(cmdSetTTL(id, 20_000))
	m.ok(cmdClose(id))
	plain := newMachine(t)
	plain.ok(cmdCreateSessionSecret("zookeeper", 10_000, []byte("0123456789abcdef")))
	plain.ok(cmdCreate("b", 10_000))
	plain.ok(cmdClose(id))
	if !bytes.Equal(exportBytes(t, plain.s), exportBytes(t, m.s)) {
		t.Fatal("a closed session's changed TTL left a trace in the state")
	}
}

func applyOK(st *fsm.State, cmd *fsmpb.Command) (fsm.Result, error) {
	r := st.Apply(cmd, nil)
	return r, r.Err
}

// TestSetSessionTTLRefusals: a TTL outside a session's bounds, no
// session, an unknown one or an etcd lease is refused, and the state is
// left as it was.
func TestSetSessionTTLRefusals(t *testing.T) {
	m := newMachine(t)
	r, _ := m.ok(cmdCreate("a", 10_000))
	id := r.Session
	lease, _ := m.ok(cmdEtcdLease(60_000))
	cases := []struct {
		name  string
		sess  uint64
		ttlMs int64
		want  error
	}{
		{"below 1s", id, fsm.MinSessionTTLMs - 1, fsm.ErrInvalid},
		{"zero", id, 0, fsm.ErrInvalid},
		{"negative", id, -5_000, fsm.ErrInvalid},
		{"above 1h", id, fsm.MaxSessionTTLMs + 1, fsm.ErrInvalid},
		{"no session", 0, 10_000, fsm.ErrInvalid},
		{"unknown session", id + 100, 10_000, fsm.ErrSessionNotFound},
		{"etcd lease", lease.Session, 10_000, fsm.ErrInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := exportBytes(t, m.s)
			r, evs := m.apply(cmdSetTTL(c.sess, c.ttlMs))
			if !errors.Is(r.Err, c.want) {
				t.Fatalf("SetSessionTTL(%d, %d): %v, want %v", c.sess, c.ttlMs, r.Err, c.want)
			}
			if len(evs) != 0 || !bytes.Equal(exportBytes(t, m.s), before) {
				t.Fatalf("refused, but the state changed or events were emitted: %+v", evs)
			}
			if err := fsm.ValidateSessionTTL(c.sess, c.ttlMs); (err != nil) != errors.Is(c.want, fsm.ErrInvalid) && c.name != "etcd lease" {
				t.Fatalf("ValidateSessionTTL: %v", err)
			}
		})
	}
	for _, ttl := range []int64{fsm.MinSessionTTLMs, fsm.MaxSessionTTLMs} {
		m.ok(cmdSetTTL(id, ttl))
		if got := sessionTTL(t, m.s, id); got != ttl {
			t.Fatalf("TTL %d, want the bound %d", got, ttl)
		}
	}
}

// TestSetSessionTTLGated: below cluster version 3 SetSessionTTL is
// refused at the proposal and by Apply, changing nothing (as a member
// that does not know it leaves the state); at version 3 it applies.
func TestSetSessionTTLGated(t *testing.T) {
	cmd := cmdSetTTL(1, 30_000)
	for _, v := range []uint32{1, 2} {
		if err := fsm.CheckVersion(cmd, v); !errors.Is(err, fsm.ErrVersion) {
			t.Fatalf("proposal at version %d: %v, want ErrVersion", v, err)
		}
		st := fsm.NewStateAt(v)
		if _, err := applyOK(st, cmdCreate("a", 10_000)); err != nil {
			t.Fatal(err)
		}
		before := exportBytes(t, st)
		var evs []fsm.Event
		r := st.Apply(cmd, func(e fsm.Event) { evs = append(evs, e) })
		if !errors.Is(r.Err, fsm.ErrVersion) {
			t.Fatalf("Apply at version %d: %v, want ErrVersion", v, r.Err)
		}
		if ttl, _ := st.Session(1); ttl != 10_000 || len(evs) != 0 || !bytes.Equal(exportBytes(t, st), before) {
			t.Fatalf("Apply at version %d changed the state: TTL %d, events %+v", v, ttl, evs)
		}
	}
	if err := fsm.CheckVersion(cmd, 3); err != nil {
		t.Fatalf("proposal at version 3: %v", err)
	}
}

// TestSnapshotKeepsTTLOfItsMoment: a snapshot taken before a
// SetSessionTTL writes the TTL of its moment, though Apply changes it
// before the snapshot is persisted (run with -race: the snapshot reads
// its copy while Apply writes).
func TestSnapshotKeepsTTLOfItsMoment(t *testing.T) {
	f := fsm.New(nil)
	cmds := []*fsmpb.Command{
		cmdSetClusterVersion(3),
		cmdCreate("a", 10_000), // rev 2: session 2
		cmdSetTTL(2, 20_000),
	}
	var logs []*raft.Log
	for i, cmd := range cmds {
		logs = append(logs, logOf(t, uint64(i+1), cmd))
	}
	f.ApplyBatch(logs)
	want := fsmExport(t, f)
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Release()
	if r := fsm.TakeResult(f.Apply(logOf(t, 4, cmdSetTTL(2, 40_000)))); r.Err != nil {
		t.Fatal(r.Err)
	}
	g := restored(t, snap)
	if !bytes.Equal(fsmExport(t, g), want) {
		t.Fatal("the snapshot differs from the state at Snapshot")
	}
	g.Read(func(s *fsm.State) {
		if ttl, _ := s.Session(2); ttl != 20_000 {
			t.Fatalf("restored TTL %d, want 20000 (the TTL when the snapshot was taken)", ttl)
		}
	})
	f.Read(func(s *fsm.State) {
		if ttl, _ := s.Session(2); ttl != 40_000 {
			t.Fatalf("TTL %d after the later SetSessionTTL, want 40000", ttl)
		}
	})
}
