package server_test

import (
	"go/build"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/tenure-io/tenure/"

// fronts are the packages that serve a protocol of their own on a node
// (the doors besides Tenure's API): they translate their requests into
// internal/server's calls, which check identity, ACLs and limits before
// they propose, and never reach the node directly. Any other package
// under internal/ that imports internal/server is taken for a front too,
// unless it is one of wiring.
var fronts = []string{"internal/etcdapi", "internal/dashboard", "internal/zkapi"}

// wiring are the packages that build a node and its server and hand them
// to each other (the daemon, the command line, test harnesses): they may
// import both.
var wiring = []string{"internal/daemon", "internal/cli", "internal/testutil", "internal/server", "internal/node"}

// TestFrontsDoNotImportNode: no front imports internal/node (its
// non-test files), so that every request of every door goes through
// internal/server's checks.
func TestFrontsDoNotImportNode(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	checked := map[string]bool{}
	check := func(rel string, pkg *build.Package) {
		checked[rel] = true
		for _, imp := range pkg.Imports {
			if imp == module+"internal/node" || strings.HasPrefix(imp, module+"internal/node/") {
				t.Errorf("%s imports %s: a front calls internal/server's methods, never the node", rel, imp)
			}
		}
	}
	for _, rel := range fronts {
		pkg, err := build.ImportDir(filepath.Join(root, rel), 0)
		if err != nil {
			t.Fatalf("front %s: %v", rel, err)
		}
		check(rel, pkg)
	}
	// Every other importer of internal/server under internal/.
	dirs, err := os.ReadDir(filepath.Join(root, "internal"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		rel := "internal/" + d.Name()
		if !d.IsDir() || checked[rel] || slices.Contains(wiring, rel) {
			continue
		}
		pkg, err := build.ImportDir(filepath.Join(root, rel), 0)
		if err != nil {
			continue // no Go files of its own (a parent of packages)
		}
		if slices.Contains(pkg.Imports, module+"internal/server") {
			check(rel, pkg)
		}
	}
	if !checked["internal/etcdapi"] || !checked["internal/dashboard"] {
		t.Fatalf("the check read no front: %v", checked)
	}
}
