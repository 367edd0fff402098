package etcdcompat

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestNodeEtcd3 runs node/etcd3.test.mjs, Node's etcd3 client (the npm
// package, pinned in node/package-lock.json), against Tenure's etcd API:
// KV, lock, lease, election and watch. It needs node and npm; .ci/run
// installs them, and under CI a missing one fails the test.
func TestNodeEtcd3(t *testing.T) {
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is not installed (.ci/run installs it)", tool)
			}
			t.Skipf("%s is not installed", tool)
		}
	}
	ci := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--loglevel", "error")
	ci.Dir = "node"
	if out, err := ci.CombinedOutput(); err != nil {
		t.Fatalf("npm ci: %v\n%s", err, out)
	}
	ep := startTenure(t).Etcd
	run := exec.Command("node", "--test", "--test-reporter", "spec", "etcd3.test.mjs")
	run.Dir = "node"
	run.Env = append(os.Environ(), "ETCD_ENDPOINT="+ep)
	out, err := run.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "pass 5") {
		t.Fatalf("node --test passed fewer than its 5 tests:\n%s", out)
	}
	t.Logf("%s", out)
}
