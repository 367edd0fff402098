package cli

import (
	"strings"
	"testing"

	"github.com/tenure-io/tenure/internal/testutil"
)

func TestRWLockCommand(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	if r := run(t, srv.Addr(), "rwlock", "rw", "--read", "--", "sh", "-c", `test -n "$TENURE_FENCE_TOKEN" && exit 7`); r.code != 7 {
		t.Fatalf("reader command: exit %d (stderr %q), want its status 7", r.code, r.stderr)
	}
	if r := run(t, srv.Addr(), "rwlock", "rw", "--write", "--", "true"); r.code != 0 {
		t.Fatalf("writer: exit %d (stderr %q)", r.code, r.stderr)
	}
	for _, args := range [][]string{{"rwlock", "rw", "--", "true"}, {"rwlock", "rw", "--read", "--write", "--", "true"}} {
		if r := run(t, srv.Addr(), args...); r.code != 1 || !strings.Contains(r.stderr, "--read or --write") {
			t.Fatalf("%v: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
	hist := runJSON(t, srv.Addr(), 0, "lock", "history", "rw")
	if g, ok := hist["grants"].([]any); !ok || len(g) != 2 {
		t.Fatalf("history %v", hist)
	}
}
