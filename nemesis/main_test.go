//go:build linux || darwin

package nemesis

import (
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tenure-io/tenure/internal/testutil"

	// The tests run a tenure binary built from source; importing what it
	// is made of makes Go's test cache see changes to it.
	_ "github.com/tenure-io/tenure/internal/cli"
)

var (
	flagDuration = flag.Duration("duration", 30*time.Second, "how long TestNemesis drives its workload under faults")
	flagHistory  = flag.String("history", "", "write TestNemesis's history (JSON lines) here (default: history.jsonl in a new temp dir)")
	flagSeed     = flag.Uint64("seed", 0, "seed for fault targets and think times (0: from the clock)")
	flagFaults   = flag.String("faults", "", "comma-separated fault kinds TestNemesisRealFaults injects, in order, instead of its schedule (e.g. disk-full,disk-full: the leader's disk, then a follower's)")
)

// tenureBin is the tenure binary built by TestMain; selfBin is this test
// binary, which `tenure lock` runs as its command (see helperMain).
var tenureBin, selfBin string

func TestMain(m *testing.M) {
	if os.Getenv(envHelper) != "" {
		os.Exit(helperMain())
	}
	var err error
	if selfBin, err = os.Executable(); err != nil {
		fmt.Fprintln(os.Stderr, "locating the test binary:", err)
		os.Exit(1)
	}
	os.Exit(testutil.MainWithTenure(m, func(bin string) { tenureBin = bin }))
}

// monoNow reads the system-wide monotonic clock in nanoseconds. The test
// process and the helper processes it starts read the same clock, so their
// timestamps can be compared (wall-clock time could step between them).
func monoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(fmt.Sprintf("clock_gettime: %v", err))
	}
	return ts.Nano()
}
