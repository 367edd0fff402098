package etcdcompat

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Python clients of etcd's JSON gateway, from Debian's packages
// python3-etcd3gw (2.0) and python3-tooz (3.1), which .ci/setup-gw.sh
// installs: each runs a script (python/) against real etcd and against
// Tenure, and the two transcripts must be equal. A client that is
// missing fails the test, naming the package.

// debianPython is the interpreter the Debian packages are installed
// for: $TENURE_PYTHON, or /usr/bin/python3.
func debianPython(t *testing.T, modules ...string) string {
	t.Helper()
	py := os.Getenv("TENURE_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	check := "import " + strings.Join(modules, ", ")
	if out, err := exec.Command(py, "-c", check).CombinedOutput(); err != nil {
		t.Fatalf("%s cannot %q: %v\n%s\ninstall Debian's python3-etcd3gw and python3-tooz (.ci/setup-gw.sh), or set TENURE_PYTHON", py, check, err, out)
	}
	return py
}

// pyRun is one run of a script against one server.
type pyRun struct {
	name, addr string // what it runs against, and its etcd address
	args       []string
	out        string
	err        error
}

// runScripts runs script against each run's server, all at once, and
// fails the test if a run fails.
func runScripts(t *testing.T, py, script string, runs []*pyRun) {
	t.Helper()
	var wg sync.WaitGroup
	for _, r := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			host, port, _ := net.SplitHostPort(r.addr)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, py, append([]string{filepath.Join("python", script), host, port}, r.args...)...)
			var out, errOut bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errOut
			r.err = cmd.Run()
			r.out = out.String()
			if r.err != nil {
				r.err = fmt.Errorf("%w\nstdout:\n%s\nstderr:\n%s", r.err, out.String(), errOut.String())
			}
		}()
	}
	wg.Wait()
	for _, r := range runs {
		if r.err != nil {
			t.Fatalf("%s against %s: %v", script, r.name, r.err)
		}
	}
}

// sameTranscripts fails the test unless every run printed what the first
// did.
func sameTranscripts(t *testing.T, runs []*pyRun) {
	t.Helper()
	want := runs[0]
	for _, r := range runs[1:] {
		if r.out != want.out {
			t.Errorf("%s printed, against %s:\n%s\nand against %s:\n%s", r.args, want.name, want.out, r.name, r.out)
		}
	}
	t.Logf("transcript (%s):\n%s", want.name, want.out)
}

// TestEtcd3gw: etcd3gw's functional behaviour (keys, prefixes,
// transactions, watches, leases, locks, errors) through the gateway is
// etcd's: the same transcript against etcd and Tenure, on /v3/; and on
// /v3alpha/, etcd3gw's default path, which Tenure serves too (etcd 3.5
// and later no longer do).
func TestEtcd3gw(t *testing.T) {
	py := debianPython(t, "etcd3gw")
	etcd := startEtcd(t)
	runs := []*pyRun{
		{name: "etcd", addr: etcd, args: []string{"/v3/"}},
		{name: "tenure", addr: startTenure(t).Etcd, args: []string{"/v3/"}},
		{name: "tenure on /v3alpha/", addr: startTenure(t).Etcd, args: []string{"/v3alpha/"}},
	}
	runScripts(t, py, "etcd3gw_check.py", runs)
	sameTranscripts(t, runs)
}

// TestToozEtcd3Gateway: tooz's coordination API over etcd3+http:// —
// locks, groups, capabilities, heartbeats and memberships that end with
// their lease — behaves as against etcd; also on tooz's default API
// version, v3alpha, which Tenure serves (etcd 3.5 and later no longer
// do).
func TestToozEtcd3Gateway(t *testing.T) {
	py := debianPython(t, "etcd3gw", "tooz.coordination", "tenacity")
	etcd := startEtcd(t)
	runs := []*pyRun{
		{name: "etcd", addr: etcd, args: []string{"v3"}},
		{name: "tenure", addr: startTenure(t).Etcd, args: []string{"v3"}},
		{name: "tenure on v3alpha", addr: startTenure(t).Etcd, args: []string{"v3alpha"}},
	}
	runScripts(t, py, "tooz_check.py", runs)
	sameTranscripts(t, runs)
}
