package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/tenure-io/tenure/internal/testutil"
)

// TestNormalBuildHasNoFaultSwitches builds tenure the way users do (`go
// build ./cmd/tenure`, no tags) and checks that serve knows none of the
// fault-injection switches: they are not in its help, and passing one is
// refused before anything starts. A build with testutil.FaultTag, which the
// fault-injection suite uses, has them (checked too, so that this test
// notices if the flags are renamed).
func TestNormalBuildHasNoFaultSwitches(t *testing.T) {
	testutil.Slow(t)
	flags := []string{"--unsafe-skip-fence-check", "--peer-route"}
	for _, tc := range []struct {
		name string
		tags []string
		has  bool
	}{
		{"go build", nil, false},
		{"fault build", []string{testutil.FaultTag}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin, err := testutil.BuildTenure(t.TempDir(), tc.tags...)
			if err != nil {
				t.Fatal(err)
			}
			help, err := exec.Command(bin, "serve", "--help").CombinedOutput()
			if err != nil {
				t.Fatalf("serve --help: %v\n%s", err, help)
			}
			for _, flag := range flags {
				if got := strings.Contains(string(help), flag); got != tc.has {
					t.Errorf("serve --help lists %s: %v, want %v", flag, got, tc.has)
				}
				if tc.has {
					continue
				}
				out, err := exec.Command(bin, "serve", "--http-listen", "", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", flag, "x").CombinedOutput()
				if err == nil || !strings.Contains(string(out), "unknown flag: "+flag) {
					t.Errorf("serve %s: err %v, output %q; want it refused as an unknown flag", flag, err, out)
				}
			}
		})
	}
}
