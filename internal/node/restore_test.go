package node_test

import (
	"context"
	"errors"
	"testing"

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
