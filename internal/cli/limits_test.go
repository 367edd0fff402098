package cli

import (
	"os"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/testutil"
)

func TestLimitsGetSet(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	got := runJSON(t, srv.Addr(), ExitOK, "limits", "get")
	for _, spec := range fsm.LimitSpecs {
		if v, ok := got[spec.JSON()].(float64); !ok || uint64(v) != spec.Default {
			t.Errorf("%s = %v, want the default %d", spec.JSON(), got[spec.JSON()], spec.Default)
		}
	}
	set := runJSON(t, srv.Addr(), ExitOK, "limits", "set", "--max-sessions", "2", "--max-kv-bytes", "1000")
	if set["max_sessions"].(float64) != 2 || set["max_kv_bytes"].(float64) != 1000 || set["max_keys"].(float64) != float64(fsm.DefaultLimits().MaxKeys) {
		t.Fatalf("after set: %v", set)
	}
	if got := runJSON(t, srv.Addr(), ExitOK, "limits", "get"); got["max_sessions"].(float64) != 2 {
		t.Fatalf("get after set: %v", got)
	}
	// The limit is enforced at once, and the refusal says how to raise it.
	run(t, srv.Addr(), "kv", "put", "a", strings.Repeat("x", 600))
	r := run(t, srv.Addr(), "kv", "put", "b", strings.Repeat("x", 600))
	if r.code != ExitError || !strings.Contains(r.stderr, "tenure limits set --max-kv-bytes") {
		t.Fatalf("put past max-kv-bytes: exit %d, stderr %q", r.code, r.stderr)
	}
	for _, bad := range [][]string{{"limits", "set"}, {"limits", "set", "--max-keys", "0"}} {
		if r := run(t, srv.Addr(), bad...); r.code != ExitError || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q; want exit 1 and one line", bad, r.code, r.stderr)
		}
	}
}

// TestLimitsDocumented: docs/limits.md lists every limit flag of serve.
func TestLimitsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/limits.md")
	if err != nil {
		t.Fatal(err)
	}
	cmd := (&app{}).serveCommand()
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if strings.HasPrefix(f.Name, "max-") || strings.HasPrefix(f.Name, "watch-history") {
			if !strings.Contains(string(doc), "`--"+f.Name+"`") {
				t.Errorf("docs/limits.md does not list --%s", f.Name)
			}
		}
	})
}
