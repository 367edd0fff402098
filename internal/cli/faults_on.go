//go:build tenurefault

package cli

import (
	"github.com/spf13/pflag"

	"github.com/tenure-io/tenure/internal/node"
)

// faultFlags adds serve's fault-injection switches. They exist only in a
// build with the tenurefault tag, which the fault-injection suite and the
// end-to-end tests use; a normal build has neither flag.
func faultFlags(f *pflag.FlagSet, fl *node.Faults) {
	f.BoolVar(&fl.SkipFenceCheck, "unsafe-skip-fence-check", false, "accept every fenced write regardless of token (fault-injection build only)")
	f.Var(peersFlag{&fl.PeerRoutes}, "peer-route", "dial these peers at these addresses instead: id=addr,... (fault-injection build only)")
}
