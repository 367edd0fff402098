//go:build !tenurefault

package cli

import (
	"github.com/spf13/pflag"

	"github.com/tenure-io/tenure/internal/node"
)

// faultFlags adds nothing: a normal build of tenure has no fault-injection
// switches. A build with the tenurefault tag (the fault-injection suite's)
// uses faults_on.go instead.
func faultFlags(*pflag.FlagSet, *node.Faults) {}
