package cli

import (
	"path/filepath"
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
	restored := runJSON(t, fresh.Addr(), 0, "snapshot", "restore", file)
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
	if r := run(t, fresh.Addr(), "snapshot", "restore", file); r.code != 1 {
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
