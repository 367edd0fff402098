package fsm

import (
	"errors"
	"testing"
	"unsafe"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// TestIdleSessionKeepsNoMaps: a session keeps no map of the names it holds
// or waits on while it has none, gets them when it acquires and waits,
// and gives them up when it no longer holds or waits on anything; a
// snapshot round trip keeps that so.
func TestIdleSessionKeepsNoMaps(t *testing.T) {
	s := NewState()
	noop := func(Event) {}
	apply := func(c *fsmpb.Command) Result {
		t.Helper()
		r := s.Apply(c, noop)
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		return r
	}
	a := apply(&fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: "a", TtlMs: 10_000}}}).Session
	b := apply(&fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: "b", TtlMs: 10_000}}}).Session
	maps := func(id uint64) (held, waits bool) { return s.sessions[id].held != nil, s.sessions[id].waits != nil }
	if h, w := maps(a); h || w {
		t.Fatalf("a new session has maps: held %v, waits %v", h, w)
	}
	g := apply(&fsmpb.Command{Op: &fsmpb.Command_Acquire{Acquire: &fsmpb.Acquire{Session: a, Name: "L", Wait: true}}})
	apply(&fsmpb.Command{Op: &fsmpb.Command_Acquire{Acquire: &fsmpb.Acquire{Session: b, Name: "L", Wait: true}}})
	if h, _ := maps(a); !h {
		t.Fatal("the holder keeps no held map")
	}
	if _, w := maps(b); !w {
		t.Fatal("the waiter keeps no waits map")
	}
	apply(&fsmpb.Command{Op: &fsmpb.Command_Release{Release: &fsmpb.Release{Session: a, Name: "L", Token: g.Token}}})
	if h, w := maps(a); h || w {
		t.Fatalf("a session that released its only lock keeps maps: held %v, waits %v", h, w)
	}
	if h, w := maps(b); !h || w {
		t.Fatalf("the waiter granted the lock: held map %v (want true), waits map %v (want false)", h, w)
	}
	r, err := Import(s.Export())
	if err != nil {
		t.Fatal(err)
	}
	if ra, rb := r.sessions[a], r.sessions[b]; ra.held != nil || ra.waits != nil || rb.held == nil || rb.waits != nil {
		t.Fatal("the maps of the restored sessions differ")
	}
}

// TestSnapshotRefusesASecretHashOfTheWrongSize: a snapshot whose session
// has a secret hash of neither 0 nor 32 bytes is refused with a clear
// error, as a CreateSession with one is.
func TestSnapshotRefusesASecretHashOfTheWrongSize(t *testing.T) {
	s := NewState()
	r := s.Apply(&fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: "a", TtlMs: 10_000, SecretHash: []byte("short")}}}, func(Event) {})
	if !errors.Is(r.Err, ErrInvalid) {
		t.Fatalf("CreateSession with a 5-byte hash: %v, want ErrInvalid", r.Err)
	}
	ok := s.Apply(&fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: "a", TtlMs: 10_000, SecretHash: HashSecret([]byte("s"))}}}, func(Event) {})
	snap := s.Export()
	snap.Sessions[0].SecretHash = []byte("short")
	if _, err := Import(snap); !errors.Is(err, ErrInvalid) {
		t.Fatalf("import of a 5-byte secret hash: %v, want ErrInvalid", err)
	}
	snap.Sessions[0].SecretHash = HashSecret([]byte("s"))
	back, err := Import(snap)
	if err != nil {
		t.Fatal(err)
	}
	if err := back.CheckSession(ok.Session, []byte("s")); err != nil {
		t.Fatalf("restored session refuses its secret: %v", err)
	}
	if err := back.CheckSession(ok.Session, []byte("t")); !errors.Is(err, ErrPermissionDenied) {
		t.Fatalf("restored session with a wrong secret: %v, want ErrPermissionDenied", err)
	}
}

// TestSessionSize: the state machine's session is at most 80 bytes (its
// secret hash in one more allocation of 32), since a million idle
// sessions keep a million of them.
func TestSessionSize(t *testing.T) {
	if n := unsafe.Sizeof(session{}); n > 80 {
		t.Errorf("session is %d bytes, want at most 80", n)
	}
}
