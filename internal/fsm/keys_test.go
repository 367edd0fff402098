package fsm_test

import (
	"crypto/ed25519"
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/fenceproof"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// addKey adds the signing key drawn from seed byte b and returns its id.
func addKey(t *testing.T, st *fsm.State, b byte) string {
	t.Helper()
	seed := make([]byte, ed25519.SeedSize)
	seed[0] = b
	id := fenceproof.KeyID(ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey))
	must(t, st, &fsmpb.Command{Op: &fsmpb.Command_AddSigningKey{AddSigningKey: &fsmpb.AddSigningKey{ClusterId: make([]byte, fsm.ClusterIDBytes), Key: &fsmpb.SigningKey{Id: id, Seed: seed}}}})
	return id
}

func retireCmd(id string, graceMs int64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_RetireSigningKey{RetireSigningKey: &fsmpb.RetireSigningKey{Id: id, GraceMs: graceMs}}}
}

func removeCmd(id string) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_RemoveSigningKey{RemoveSigningKey: &fsmpb.RemoveSigningKey{Id: id}}}
}

// TestRetireSigningKey: the only key and the active key can be neither
// retired nor removed; an older key is retired with a grace (it stays,
// marked, and survives a snapshot) and removed by RemoveSigningKey; a
// refused command changes nothing.
func TestRetireSigningKey(t *testing.T) {
	st := fsm.NewState()
	a := addKey(t, st, 1)
	for name, cmd := range map[string]*fsmpb.Command{
		"retire the only key": retireCmd(a, 1000),
		"remove the only key": removeCmd(a),
	} {
		rev := st.Revision()
		if r := st.Apply(cmd, nil); !errors.Is(r.Err, fsm.ErrInvalid) || !strings.Contains(r.Err.Error(), "rotate first") || st.Revision() != rev {
			t.Fatalf("%s: %v (revision %d → %d)", name, r.Err, rev, st.Revision())
		}
	}
	b := addKey(t, st, 2)
	for name, cmd := range map[string]*fsmpb.Command{
		"retire the active key":  retireCmd(b, 1000),
		"remove the active key":  removeCmd(b),
		"retire an unknown key":  retireCmd("0011223344556677", 1000),
		"retire without a grace": retireCmd(a, 0),
		"retire with a negative": retireCmd(a, -1),
		"retire for two years":   retireCmd(a, 2*365*24*3600*1000),
	} {
		rev := st.Revision()
		if r := st.Apply(cmd, nil); !errors.Is(r.Err, fsm.ErrInvalid) || st.Revision() != rev {
			t.Fatalf("%s: %v (revision %d → %d)", name, r.Err, rev, st.Revision())
		}
	}
	must(t, st, retireCmd(a, 60_000))
	sec := st.Security()
	if len(sec.Keys) != 2 || sec.Keys[0].ID != a || sec.Keys[0].RetiredRevision != st.Revision() || sec.Keys[0].RetireGrace.Milliseconds() != 60_000 {
		t.Fatalf("keys after retiring %s: %+v", a, sec.Keys)
	}
	if k, _ := sec.ActiveKey(); k.ID != b {
		t.Fatalf("active key %s after retiring %s, want %s", k.ID, a, b)
	}
	back, err := fsm.Import(st.Export())
	if err != nil || !proto.Equal(back.Export(), st.Export()) {
		t.Fatalf("a retired key does not survive a snapshot: %v", err)
	}
	must(t, st, removeCmd(a))
	if keys := st.Security().Keys; len(keys) != 1 || keys[0].ID != b {
		t.Fatalf("keys after removing %s: %+v", a, keys)
	}
	if r := st.Apply(removeCmd(a), nil); !errors.Is(r.Err, fsm.ErrInvalid) {
		t.Fatalf("removing a removed key: %v", r.Err)
	}
}

// TestImportRefusesRetiredActiveKey: a snapshot whose newest key, the
// one that signs, is retired is refused.
func TestImportRefusesRetiredActiveKey(t *testing.T) {
	st := fsm.NewState()
	addKey(t, st, 1)
	snap := st.Export()
	snap.Security.SigningKeys[0].RetiredRevision = snap.GetRevision()
	snap.Security.SigningKeys[0].RetireGraceMs = 1000
	if _, err := fsm.Import(snap); !errors.Is(err, fsm.ErrInvalid) {
		t.Fatalf("import of a retired active key: %v", err)
	}
}

// TestSealedSnapshot: a sealed file opens to its cluster id and state;
// an empty file, every cut of it, a byte appended, and every single bit
// flipped are ErrSnapshotDamaged; bytes without the magic are
// ErrNotSealed. All are ErrInvalid.
func TestSealedSnapshot(t *testing.T) {
	id := []byte("0123456789abcdef")
	state := []byte("the state of a cluster")
	sealed, err := fsm.SealSnapshot(id, state)
	if err != nil {
		t.Fatal(err)
	}
	gotID, gotState, err := fsm.OpenSnapshot(sealed)
	if err != nil || string(gotID) != string(id) || string(gotState) != string(state) {
		t.Fatalf("open: %q %q %v", gotID, gotState, err)
	}
	damaged := [][]byte{nil, append(append([]byte(nil), sealed...), 0)}
	for i := range sealed {
		damaged = append(damaged, sealed[:i])
		for bit := 0; bit < 8; bit++ {
			b := append([]byte(nil), sealed...)
			b[i] ^= 1 << bit
			damaged = append(damaged, b)
		}
	}
	for i, b := range damaged {
		_, _, err := fsm.OpenSnapshot(b)
		if !errors.Is(err, fsm.ErrSnapshotDamaged) && !errors.Is(err, fsm.ErrNotSealed) {
			t.Fatalf("damaged file %d (%d bytes) opened: %v", i, len(b), err)
		}
		if !errors.Is(err, fsm.ErrInvalid) || strings.Contains(err.Error(), "\n") {
			t.Fatalf("damaged file %d: %q, want one line of ErrInvalid", i, err)
		}
	}
	if _, _, err := fsm.OpenSnapshot(state); !errors.Is(err, fsm.ErrNotSealed) {
		t.Fatalf("an unsealed state: %v, want ErrNotSealed", err)
	}
	if _, _, err := fsm.OpenSnapshot(nil); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("an empty file: %v", err)
	}
}

// FuzzOpenSnapshot: OpenSnapshot never panics, and whatever it opens
// seals back to the same bytes.
func FuzzOpenSnapshot(f *testing.F) {
	sealed, _ := fsm.SealSnapshot([]byte("0123456789abcdef"), []byte("state"))
	f.Add(sealed)
	f.Add([]byte{})
	f.Add([]byte(fsm.SnapshotMagic))
	f.Fuzz(func(t *testing.T, data []byte) {
		id, state, err := fsm.OpenSnapshot(data)
		if err != nil {
			return
		}
		again, err := fsm.SealSnapshot(id, state)
		if err != nil || string(again) != string(data) {
			t.Fatalf("opened %x, sealed back to %x (%v)", data, again, err)
		}
	})
}
