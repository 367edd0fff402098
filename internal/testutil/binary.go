package testutil

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// FaultTag is the build tag that gives tenure serve its fault-injection
// switches (--peer-route, --unsafe-skip-fence-check). Only tests build with
// it; `go build ./cmd/tenure` has none of them.
const FaultTag = "tenurefault"

// BuildTenure builds the tenure command into dir with the given build tags
// and returns the binary's path. Its output goes to stderr.
func BuildTenure(dir string, tags ...string) (string, error) {
	bin := filepath.Join(dir, "tenure")
	args := []string{"build", "-o", bin}
	for _, tag := range tags {
		args = append(args, "-tags", tag)
	}
	build := exec.Command("go", append(args, "github.com/tenure-io/tenure/cmd/tenure")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("building tenure: %w", err)
	}
	return bin, nil
}

// MainWithTenure is the TestMain of a package whose tests run the tenure
// binary: it builds tenure with FaultTag into a new temporary directory,
// calls setBin with the binary's path, runs the tests and returns their
// exit code (for os.Exit), removing the directory afterwards. With -short
// it builds nothing and runs no test: such packages are not part of the
// quick gate.
func MainWithTenure(m *testing.M, setBin func(path string)) int {
	flag.Parse()
	if testing.Short() {
		fmt.Println("skipped with -short: these tests build and run the tenure binary")
		return 0
	}
	dir, err := os.MkdirTemp("", "tenure-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin, err := BuildTenure(dir, FaultTag)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	setBin(bin)
	return m.Run()
}
