package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/testutil"
)

// oneLine checks that a refused command exited 1 with one line on stderr
// that contains want.
func oneLine(t *testing.T, what string, r result, want string) {
	t.Helper()
	if r.code != ExitError || !strings.HasPrefix(r.stderr, "tenure: ") || strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, want) {
		t.Fatalf("%s: exit %d, stderr %q; want exit 1 and one line containing %q", what, r.code, r.stderr, want)
	}
}

// TestSnapshotSaveWritesOwnerOnlyFile: `snapshot save` writes the file
// with mode 0600 (it holds the cluster's private signing keys), also over
// an existing file of another mode, and leaves no partial file behind.
func TestSnapshotSaveWritesOwnerOnlyFile(t *testing.T) {
	s := testutil.Start(t, "", nil)
	dir := t.TempDir()
	file := filepath.Join(dir, "backup.snap")
	if err := os.WriteFile(file, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	runJSON(t, s.Addr(), 0, "snapshot", "save", file)
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("saved snapshot has mode %v, want 0600", fi.Mode().Perm())
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 1 {
		t.Fatalf("directory after save: %v %v, want only the snapshot", entries, err)
	}
}

// TestSnapshotRestoreOfEmptyFileOnAuthNode: `snapshot restore --force` of a
// 0-byte file on an --auth node is refused with one line, and nothing
// changes: the management token keeps working, the policies stay, and an
// anonymous `acl bootstrap` is still refused.
func TestSnapshotRestoreOfEmptyFileOnAuthNode(t *testing.T) {
	s := testutil.StartConfig(t, daemon.Config{Auth: true})
	admin := runJSON(t, s.Addr(), 0, "acl", "bootstrap")["secret"].(string)
	runJSON(t, s.Addr(), 0, "acl", "policy", "create", "jobs", "--rule", "lock:jobs/:write", "--auth-token", admin)
	empty := filepath.Join(t.TempDir(), "empty.snap")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	oneLine(t, "restore --force of an empty file", run(t, s.Addr(), "snapshot", "restore", "--force", empty, "--auth-token", admin), "empty")

	pols := runJSON(t, s.Addr(), 0, "acl", "policy", "list", "--auth-token", admin)
	if !strings.Contains(policyNames(pols), "jobs") {
		t.Fatalf("policies after the refused restore: %v", pols)
	}
	if r := run(t, s.Addr(), "acl", "bootstrap"); r.code != ExitError || !strings.Contains(r.stderr, "permission denied") {
		t.Fatalf("anonymous bootstrap after the refused restore: exit %d, %q", r.code, r.stderr)
	}
}

func policyNames(m map[string]any) string {
	var names []string
	for _, p := range m["policies"].([]any) {
		names = append(names, p.(map[string]any)["name"].(string))
	}
	return strings.Join(names, " ")
}

// TestSnapshotRestoreRefusesDamagedFiles: a saved snapshot with a byte
// flipped, cut short, with a byte appended, or not sealed at all is
// refused with one line, --force or not, and the state does not change.
func TestSnapshotRestoreRefusesDamagedFiles(t *testing.T) {
	s := testutil.Start(t, "", nil)
	runJSON(t, s.Addr(), 0, "kv", "put", "a", "1")
	lockToken(t, s.Addr(), "job")
	dir := t.TempDir()
	file := filepath.Join(dir, "backup.snap")
	runJSON(t, s.Addr(), 0, "snapshot", "save", file)
	good, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	runJSON(t, s.Addr(), 0, "kv", "put", "b", "2") // after the snapshot
	flip := func(i int) []byte {
		b := append([]byte(nil), good...)
		b[i] ^= 0x10
		return b
	}
	for _, c := range []struct {
		name string
		data []byte
		want string
	}{
		{"a byte flipped in the middle", flip(len(good) / 2), "checksum"},
		{"a byte flipped at the end", flip(len(good) - 1), "checksum"},
		{"a byte flipped in the header", flip(12), ""},
		{"cut to half", good[:len(good)/2], "truncated"},
		{"the last byte missing", good[:len(good)-1], "truncated"},
		{"one byte", good[:1], "truncated"},
		{"a byte appended", append(append([]byte(nil), good...), 0), ""},
		{"not a snapshot", []byte("not a snapshot"), "not a sealed Tenure snapshot"},
	} {
		t.Run(c.name, func(t *testing.T) {
			bad := filepath.Join(dir, "bad.snap")
			if err := os.WriteFile(bad, c.data, 0o600); err != nil {
				t.Fatal(err)
			}
			before := runJSON(t, s.Addr(), 0, "status")["revision"]
			for _, args := range [][]string{{"snapshot", "restore", bad}, {"snapshot", "restore", "--force", bad}} {
				oneLine(t, strings.Join(args, " "), run(t, s.Addr(), args...), c.want)
			}
			if after := runJSON(t, s.Addr(), 0, "status")["revision"]; after != before {
				t.Fatalf("revision %v before the refused restores, %v after", before, after)
			}
			if got := runJSON(t, s.Addr(), 0, "kv", "get", "b"); got["value"] != "2" {
				t.Fatalf("kv after the refused restores: %v", got)
			}
		})
	}
}

// TestSnapshotRestoreOfAnotherCluster: a snapshot saved by another cluster
// is refused unless --from-cluster names that cluster; with it the
// running cluster's ACLs, signing keys and id are kept (its management
// token works, the snapshot's does not) unless --replace-keys takes the
// snapshot's. Across both restores every token is above every token the
// running cluster issued before.
func TestSnapshotRestoreOfAnotherCluster(t *testing.T) {
	a := testutil.StartConfig(t, daemon.Config{Auth: true})
	adminA := runJSON(t, a.Addr(), 0, "acl", "bootstrap")["secret"].(string)
	t.Setenv(envAuthToken, adminA)
	runJSON(t, a.Addr(), 0, "kv", "put", "from", "a")
	lockToken(t, a.Addr(), "job")
	idA := clusterID(t, a.Addr())
	file := filepath.Join(t.TempDir(), "a.snap")
	runJSON(t, a.Addr(), 0, "snapshot", "save", file)

	b := testutil.StartConfig(t, daemon.Config{Auth: true})
	adminB := runJSON(t, b.Addr(), 0, "acl", "bootstrap")["secret"].(string)
	t.Setenv(envAuthToken, adminB)
	runJSON(t, b.Addr(), 0, "acl", "policy", "create", "b-only", "--rule", "kv:b/:read")
	var last uint64
	for i := 0; i < 20; i++ { // b's tokens pass a's revision
		last = lockToken(t, b.Addr(), "job")
	}
	keysB := runJSON(t, b.Addr(), 0, "cluster", "keys")

	oneLine(t, "restore of another cluster's snapshot", run(t, b.Addr(), "snapshot", "restore", "--force", file), "--from-cluster "+idA)
	oneLine(t, "restore naming the wrong cluster", run(t, b.Addr(), "snapshot", "restore", "--force", "--from-cluster", clusterID(t, b.Addr()), file), "--from-cluster "+idA)

	runJSON(t, b.Addr(), 0, "snapshot", "restore", "--force", "--from-cluster", idA, file)
	if got := runJSON(t, b.Addr(), 0, "kv", "get", "from"); got["value"] != "a" {
		t.Fatalf("a's data after the restore: %v", got)
	}
	if keys := runJSON(t, b.Addr(), 0, "cluster", "keys"); fmt.Sprint(keys) != fmt.Sprint(keysB) {
		t.Fatalf("keys after a restore without --replace-keys: %v, before %v", keys, keysB)
	}
	if !strings.Contains(policyNames(runJSON(t, b.Addr(), 0, "acl", "policy", "list")), "b-only") {
		t.Fatal("b's policies were replaced")
	}
	if r := run(t, b.Addr(), "status", "--auth-token", adminA); r.code != ExitError {
		t.Fatalf("a's management token on b after a restore that kept b's ACLs: exit %d", r.code)
	}
	if tok := lockToken(t, b.Addr(), "job"); tok <= last {
		t.Fatalf("token %d after the restore; b issued %d before it", tok, last)
	}

	runJSON(t, b.Addr(), 0, "snapshot", "restore", "--force", "--from-cluster", idA, "--replace-keys", file)
	t.Setenv(envAuthToken, adminA) // a's ACLs now
	if id := clusterID(t, b.Addr()); id != idA {
		t.Fatalf("cluster id after --replace-keys: %s, want a's %s", id, idA)
	}
	runJSON(t, b.Addr(), 0, "status", "--auth-token", adminA)
	if r := run(t, b.Addr(), "status", "--auth-token", adminB); r.code != ExitError {
		t.Fatalf("b's management token after --replace-keys: exit %d", r.code)
	}
}

// TestClusterKeysRetire: `cluster keys retire` needs --after or --now;
// the active key is refused with one line; after a rotation the old key is
// listed as retired with --after and gone with --now.
func TestClusterKeysRetire(t *testing.T) {
	s := testutil.Start(t, "", nil)
	first := runJSON(t, s.Addr(), 0, "cluster", "keys")["keys"].([]any)[0].(map[string]any)["id"].(string)
	oneLine(t, "retire without a grace", run(t, s.Addr(), "cluster", "keys", "retire", first), "--after")
	oneLine(t, "retire with both", run(t, s.Addr(), "cluster", "keys", "retire", first, "--now", "--after", "1m"), "not both")
	oneLine(t, "retire the only key", run(t, s.Addr(), "cluster", "keys", "retire", first, "--now"), "rotate first")
	runJSON(t, s.Addr(), 0, "cluster", "keys", "rotate")
	keys := runJSON(t, s.Addr(), 0, "cluster", "keys", "retire", first, "--after", "1h")["keys"].([]any)
	if len(keys) != 2 || keys[0].(map[string]any)["retired"] != true || keys[1].(map[string]any)["retired"] != nil {
		t.Fatalf("keys after retire --after 1h: %v", keys)
	}
	if r := run(t, s.Addr(), "cluster", "keys"); !strings.Contains(r.stdout, "(retired)") {
		t.Fatalf("cluster keys does not mark the retired key: %q", r.stdout)
	}
	keys = runJSON(t, s.Addr(), 0, "cluster", "keys", "retire", first, "--now")["keys"].([]any)
	if len(keys) != 1 || keys[0].(map[string]any)["id"] == first {
		t.Fatalf("keys after retire --now: %v", keys)
	}
}
