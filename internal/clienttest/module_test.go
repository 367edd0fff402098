package clienttest

import (
	"os/exec"
	"strings"
	"testing"
)

// heavy are the server's dependencies that a program importing the client
// must not require: the client module's graph must name none of them.
var heavy = []string{
	"github.com/hashicorp/raft",
	"go.etcd.io/bbolt",
	"github.com/jackc/pgx",
	"github.com/chromedp/chromedp",
	"github.com/spf13/cobra",
	"github.com/prometheus/",
	"github.com/anishathalye/porcupine",
	"pgregory.net/rapid",
}

// TestClientModuleIsLight: `go list -m all` in the client's module names
// none of the server's heavy dependencies (raft, bbolt, pgx, chromedp,
// cobra, prometheus, porcupine, rapid), and the packages the client
// imports come from the api and fenceproof modules, not the server's.
func TestClientModuleIsLight(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	// -e: list every module even when one's details cannot be fetched
	// (offline); the names are all this test needs.
	cmd := exec.Command(goBin, "list", "-m", "-e", "-f", "{{.Path}}", "all")
	cmd.Dir = "../../client"
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list -m all in client/: %v\n%s", err, out)
	}
	mods := strings.Fields(string(out))
	has := func(p string) bool {
		for _, m := range mods {
			if m == p {
				return true
			}
		}
		return false
	}
	for _, want := range []string{"github.com/tenure-io/tenure/client", "github.com/tenure-io/tenure/api", "github.com/tenure-io/tenure/fenceproof", "google.golang.org/grpc"} {
		if !has(want) {
			t.Errorf("the client's module graph does not name %s:\n%s", want, out)
		}
	}
	if has("github.com/tenure-io/tenure") {
		t.Errorf("the client's module graph names the server's module github.com/tenure-io/tenure")
	}
	for _, m := range mods {
		for _, h := range heavy {
			if strings.HasPrefix(m, h) {
				t.Errorf("the client's module graph names %s (a server dependency)", m)
			}
		}
	}
}
