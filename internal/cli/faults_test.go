//go:build !tenurefault

package cli

import (
	"strings"
	"testing"
)

// TestNoFaultSwitchesInTheProduct: without the tenurefault tag serve has no
// fault-injection flag, and passing one is a usage error that starts
// nothing. (cmd/tenure's TestNormalBuildHasNoFaultSwitches checks the
// binary `go build ./cmd/tenure` makes.)
func TestNoFaultSwitchesInTheProduct(t *testing.T) {
	for _, flag := range []string{"unsafe-skip-fence-check", "peer-route"} {
		r := run(t, "127.0.0.1:1", "serve", "--http-listen", "", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--"+flag)
		if r.code != ExitError || !strings.Contains(r.stderr, "unknown flag: --"+flag) {
			t.Errorf("serve --%s: exit %d, stderr %q; want exit %d and unknown flag", flag, r.code, r.stderr, ExitError)
		}
		h := run(t, "127.0.0.1:1", "serve", "--help")
		if strings.Contains(h.stdout+h.stderr, flag) {
			t.Errorf("serve --help mentions --%s", flag)
		}
	}
}
