package node_test

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/node"
)

func acquireCmd(sess uint64, name string) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_Acquire{Acquire: &fsmpb.Acquire{Session: sess, Name: name}}}
}

func releaseCmd(sess uint64, name string, token uint64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_Release{Release: &fsmpb.Release{Session: sess, Name: name, Token: token}}}
}

func fencedPutCmd(key string, token uint64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_FencedPut{FencedPut: &fsmpb.FencedPut{Key: key, Value: []byte("v"), Token: token}}}
}

func revision(n *node.Node) (rev uint64) {
	n.Read(func(s *fsm.State) { rev = s.Revision() })
	return rev
}

// TestForcedRestoreOfOlderSnapshotNeverReissuesTokens: restoring, with
// force, a snapshot older than the node's state does not move the revision
// back: the next grant's token is above every token issued before the
// restore, and a fenced write with a token issued before the restore is
// stale, also on a register the snapshot does not know.
func TestForcedRestoreOfOlderSnapshotNeverReissuesTokens(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	n := openConfig(t, node.Config{DataDir: dir})
	sess := propose(t, n, &fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: "a", TtlMs: 60_000}}}).Session
	grantAndRelease := func() uint64 {
		g := propose(t, n, acquireCmd(sess, "l"))
		if !g.Granted {
			t.Fatalf("not granted: %+v", g)
		}
		propose(t, n, releaseCmd(sess, "l", g.Token))
		return g.Token
	}
	for i := 0; i < 5; i++ {
		grantAndRelease()
	}
	old, err := n.SaveSnapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var last uint64
	for i := 0; i < 20; i++ {
		last = grantAndRelease()
	}
	ledger := grantAndRelease() // a grant whose holder writes a register the snapshot lacks
	if r := propose(t, n, fencedPutCmd("ledger", ledger)); r.Put != fsm.PutAccepted {
		t.Fatalf("ledger put %+v", r)
	}
	last = max(last, ledger)
	before := revision(n)

	// Without force an older snapshot is refused.
	if _, err := n.RestoreSnapshot(ctx, old, node.RestoreOptions{}); !errors.Is(err, node.ErrSnapshotBehind) {
		t.Fatalf("restore of an older snapshot without force: %v", err)
	}
	snap, err := n.RestoreSnapshot(ctx, old, node.RestoreOptions{Force: true})
	if err != nil {
		t.Fatal(err)
	}
	if after := revision(n); after < before || snap.GetRevision() < before {
		t.Fatalf("revision %d before the restore, %d after (reported %d)", before, after, snap.GetRevision())
	}
	g := propose(t, n, acquireCmd(sess, "l"))
	if !g.Granted || g.Token <= last || g.Token <= before {
		t.Fatalf("grant after the restore %+v; tokens up to %d were issued before it (revision %d)", g, last, before)
	}
	// Tokens from before the restore stay dead: on the register the
	// snapshot does not have, and at the pre-restore revision itself.
	for _, tok := range []uint64{ledger, before} {
		if r := propose(t, n, fencedPutCmd("ledger", tok)); r.Put != fsm.PutStale {
			t.Fatalf("put with pre-restore token %d answered %+v, want stale", tok, r)
		}
	}
	if r := propose(t, n, fencedPutCmd("ledger", g.Token)); r.Put != fsm.PutAccepted {
		t.Fatalf("put with the new grant's token %d: %+v", g.Token, r)
	}

	// A restart after the restore (which left a hole in the log that only
	// the restored snapshot covers) starts, with the same state.
	state := export(n)
	n.Close()
	n = openConfig(t, node.Config{DataDir: dir})
	if string(export(n)) != string(state) {
		t.Fatal("state after a restart differs from the restored state")
	}
	if r := propose(t, n, fencedPutCmd("ledger", before)); r.Put != fsm.PutStale {
		t.Fatalf("after a restart, put with pre-restore token %d: %+v", before, r)
	}
}

// reseal returns the sealed snapshot data with its state changed by edit
// and sealed again, as someone who can write the file could.
func reseal(t *testing.T, data []byte, edit func(*fsmpb.Snapshot)) []byte {
	t.Helper()
	id, state, err := fsm.OpenSnapshot(data)
	if err != nil {
		t.Fatal(err)
	}
	snap := &fsmpb.Snapshot{}
	if err := proto.Unmarshal(state, snap); err != nil {
		t.Fatal(err)
	}
	edit(snap)
	state, err = proto.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	out, err := fsm.SealSnapshot(id, state)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRestoreRefusesInconsistentSnapshot: a snapshot edited so that a
// number drawn from the revision is above it (a holder's token, a
// register's, a session id, a key's revision, ...) is refused, also with
// force and resealed, and nothing changes: once that holder's hold ended
// the next grant would have been below its token, tokens going backwards.
// The untouched snapshot is restored, and the next grant is above every
// token issued before.
func TestRestoreRefusesInconsistentSnapshot(t *testing.T) {
	ctx := context.Background()
	n := openConfig(t, node.Config{DataDir: t.TempDir()})
	sess := propose(t, n, &fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: "a", TtlMs: 60_000}}}).Session
	g := propose(t, n, acquireCmd(sess, "l"))
	if r := propose(t, n, fencedPutCmd("reg", g.Token)); r.Put != fsm.PutAccepted {
		t.Fatalf("put %+v", r)
	}
	propose(t, n, &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: "k", Value: []byte("v")}}})
	saved, err := n.SaveSnapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(s *fsmpb.Snapshot){
		"holder token above the revision":   func(s *fsmpb.Snapshot) { s.Locks[0].Holders[0].Token = s.Revision + 1000 },
		"holder token 0":                    func(s *fsmpb.Snapshot) { s.Locks[0].Holders[0].Token = 0 },
		"two exclusive holders":             func(s *fsmpb.Snapshot) { s.Locks[0].Holders = append(s.Locks[0].Holders, s.Locks[0].Holders[0]) },
		"register token above the revision": func(s *fsmpb.Snapshot) { s.Registers[0].Token = s.Revision + 1 },
		"session id above the revision": func(s *fsmpb.Snapshot) {
			s.Sessions[0].Id = s.Revision + 1
			s.Locks[0].Holders[0].Session = s.Revision + 1
		},
		"key modified above the revision":   func(s *fsmpb.Snapshot) { s.Kv[0].ModRevision = s.Revision + 1 },
		"fence floor above the revision":    func(s *fsmpb.Snapshot) { s.FenceFloor = s.Revision + 1 },
		"signing key above the revision":    func(s *fsmpb.Snapshot) { s.Security.SigningKeys[0].CreateRevision = s.Revision + 1 },
		"revision lowered under the tokens": func(s *fsmpb.Snapshot) { s.Revision = s.Locks[0].Holders[0].Token - 1 },
	} {
		t.Run(name, func(t *testing.T) {
			before := export(n)
			_, err := n.RestoreSnapshot(ctx, reseal(t, saved, edit), node.RestoreOptions{Force: true, ReplaceKeys: true})
			if !errors.Is(err, fsm.ErrInvalid) {
				t.Fatalf("restore: %v, want a refusal (invalid)", err)
			}
			t.Logf("refused: %v", err)
			if string(export(n)) != string(before) {
				t.Fatal("a refused restore changed the state")
			}
		})
	}
	last := revision(n)
	if _, err := n.RestoreSnapshot(ctx, saved, node.RestoreOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	propose(t, n, releaseCmd(sess, "l", g.Token))
	if g2 := propose(t, n, acquireCmd(sess, "l")); !g2.Granted || g2.Token <= last {
		t.Fatalf("grant after the restore %+v; the revision was %d before it", g2, last)
	}
}

// TestRestoreRefusesDamagedFiles: RestoreSnapshot refuses an empty file,
// every cut of a saved one, any byte of it changed, and an unsealed state,
// force or not; nothing changes.
func TestRestoreRefusesDamagedFiles(t *testing.T) {
	ctx := context.Background()
	n := openConfig(t, node.Config{DataDir: t.TempDir()})
	propose(t, n, &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: "k", Value: []byte("v")}}})
	saved, err := n.SaveSnapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, state, err := fsm.OpenSnapshot(saved)
	if err != nil {
		t.Fatal(err)
	}
	before := export(n)
	bad := [][]byte{nil, state}
	for i := range saved {
		bad = append(bad, saved[:i])
		flipped := append([]byte(nil), saved...)
		flipped[i] ^= 1 << (i % 8)
		bad = append(bad, flipped)
	}
	for i, data := range bad {
		for _, force := range []bool{false, true} {
			if _, err := n.RestoreSnapshot(ctx, data, node.RestoreOptions{Force: force, ReplaceKeys: true}); !errors.Is(err, fsm.ErrInvalid) {
				t.Fatalf("damaged file %d (%d bytes), force %v: %v, want a refusal", i, len(data), force, err)
			}
		}
	}
	if string(export(n)) != string(before) {
		t.Fatal("a refused restore changed the state")
	}
	t.Logf("%d damaged files of a %d-byte snapshot refused", len(bad), len(saved))
}
