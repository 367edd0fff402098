package cli

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tenure-io/tenure/internal/testutil"
)

func TestSnapshotSaveRestoreAndMembers(t *testing.T) {
	old := testutil.Start(t, "", nil)
	runJSON(t, old.Addr(), 0, "queue", "push", "jobs", "job-1")
	runJSON(t, old.Addr(), 0, "kv", "put", "a", "1")
	runJSON(t, old.Addr(), 0, "kv", "put", "b", "2")
	put := runJSON(t, old.Addr(), 0, "fence", "put", "reg", "v1", "--token", "3") // tokens up to the revision are issued
	if put["result"] != "accepted" {
		t.Fatalf("put: %v", put)
	}
	file := filepath.Join(t.TempDir(), "backup.snap")
	saved := runJSON(t, old.Addr(), 0, "snapshot", "save", file)
	hasKeys(t, saved, map[string]string{"file": "string", "bytes": "number"})

	fresh := testutil.Start(t, "", nil)
	// Another cluster's snapshot: its id must be named.
	restored := runJSON(t, fresh.Addr(), 0, "snapshot", "restore", "--from-cluster", clusterID(t, old.Addr()), file)
	hasKeys(t, restored, map[string]string{"revision": "number", "sessions": "number", "locks": "number", "registers": "number", "queues": "number", "keys": "number"})
	if num(t, restored, "registers") != 1 || num(t, restored, "queues") != 1 || num(t, restored, "keys") != 2 {
		t.Fatalf("restored %v", restored)
	}
	got := runJSON(t, fresh.Addr(), 0, "fence", "get", "reg")
	if got["value"] != "v1" || num(t, got, "token") != 3 {
		t.Fatalf("register after restore: %v", got)
	}
	// Moving on, then restoring the older snapshot again is refused.
	runJSON(t, fresh.Addr(), 0, "fence", "put", "reg", "v2", "--token", "4")
	if r := run(t, fresh.Addr(), "snapshot", "restore", "--from-cluster", clusterID(t, old.Addr()), file); r.code != 1 {
		t.Fatalf("restore over newer state: exit %d, stderr %q", r.code, r.stderr)
	}

	members := runJSON(t, fresh.Addr(), 0, "member", "list")
	list, ok := members["members"].([]any)
	if !ok || len(list) != 1 {
		t.Fatalf("members: %v", members)
	}
	hasKeys(t, list[0].(map[string]any), map[string]string{"id": "string", "peer_addr": "string", "voter": "bool", "leader": "bool"})
	// A second voter would make two: refused without --force.
	if r := run(t, fresh.Addr(), "member", "add", "n2", "127.0.0.1:1"); r.code != 1 {
		t.Fatalf("member add to an even count: exit %d, stderr %q", r.code, r.stderr)
	}
}

// clusterID returns the id of the cluster at addr.
func clusterID(t *testing.T, addr string) string {
	t.Helper()
	id, _ := runJSON(t, addr, 0, "cluster", "keys")["cluster_id"].(string)
	if id == "" {
		t.Fatalf("cluster at %s has no id", addr)
	}
	return id
}

// lockToken takes lock name with `tenure lock` and returns the token its
// command saw.
func lockToken(t *testing.T, addr, name string) uint64 {
	t.Helper()
	r := run(t, addr, "lock", name, "--", "sh", "-c", `echo "$TENURE_FENCE_TOKEN"`)
	if r.code != 0 {
		t.Fatalf("lock %s: exit %d, stderr %q", name, r.code, r.stderr)
	}
	var tok uint64
	if _, err := fmt.Sscan(r.stdout, &tok); err != nil {
		t.Fatalf("token %q: %v", r.stdout, err)
	}
	return tok
}

// TestForcedRestoreOfOlderSnapshotKeepsTokensGrowing: `snapshot restore
// --force` of a snapshot older than the server's state does not move the
// revision back: the next grant's token is above every token issued
// before, and a pre-restore token is stale also on a register created
// after the snapshot. The JSON keeps its fields.
func TestForcedRestoreOfOlderSnapshotKeepsTokensGrowing(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	addr := srv.Addr()
	for i := 0; i < 3; i++ {
		lockToken(t, addr, "job")
	}
	file := filepath.Join(t.TempDir(), "old.snap")
	runJSON(t, addr, 0, "snapshot", "save", file)
	var last uint64
	for i := 0; i < 10; i++ {
		last = lockToken(t, addr, "job")
	}
	put := runJSON(t, addr, 0, "fence", "put", "ledger", "v", "--token", fmt.Sprint(last))
	before := num(t, put, "revision")

	if r := run(t, addr, "snapshot", "restore", file); r.code != ExitError || !strings.Contains(r.stderr, "--force") {
		t.Fatalf("restore of an older snapshot without --force: exit %d, stderr %q", r.code, r.stderr)
	}
	restored := runJSON(t, addr, 0, "snapshot", "restore", "--force", file)
	hasKeys(t, restored, map[string]string{"revision": "number", "sessions": "number", "locks": "number", "registers": "number", "queues": "number", "keys": "number"})
	if num(t, restored, "revision") < before {
		t.Fatalf("restored revision %d, the server was at %d", num(t, restored, "revision"), before)
	}
	if tok := lockToken(t, addr, "job"); tok <= last || tok <= before {
		t.Fatalf("token %d after the restore; %d was issued before it (revision %d)", tok, last, before)
	}
	if r := run(t, addr, "fence", "put", "ledger", "v2", "--token", fmt.Sprint(last)); r.code != ExitStale {
		t.Fatalf("put with a pre-restore token: exit %d, stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
}

// TestRestoreAboveRevision: restoring a backup onto an empty server with
// --above-revision N continues above N (the revision a lost data
// directory had reached), and tokens up to N are stale.
func TestRestoreAboveRevision(t *testing.T) {
	old := testutil.Start(t, "", nil)
	lockToken(t, old.Addr(), "job")
	file := filepath.Join(t.TempDir(), "backup.snap")
	runJSON(t, old.Addr(), 0, "snapshot", "save", file)

	fresh := testutil.Start(t, "", nil)
	const lost = 5000
	restored := runJSON(t, fresh.Addr(), 0, "snapshot", "restore", "--above-revision", fmt.Sprint(lost), "--from-cluster", clusterID(t, old.Addr()), "--replace-keys", file)
	if num(t, restored, "revision") < lost {
		t.Fatalf("restored revision %d, want at least %d", num(t, restored, "revision"), lost)
	}
	if tok := lockToken(t, fresh.Addr(), "job"); tok <= lost {
		t.Fatalf("token %d after a restore above %d", tok, lost)
	}
	if r := run(t, fresh.Addr(), "fence", "put", "reg", "v", "--token", fmt.Sprint(lost)); r.code != ExitStale {
		t.Fatalf("put with token %d: exit %d, stderr %q", lost, r.code, r.stderr)
	}
}
