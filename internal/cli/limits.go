package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/fsm"
)

// clusterLimitFlags registers one flag per replicated limit on f, each
// writing into l; help prefixes each flag's description.
func clusterLimitFlags(f *pflag.FlagSet, l *fsm.Limits, help string) {
	for _, spec := range fsm.LimitSpecs {
		f.Uint64Var(spec.Field(l), spec.Name, spec.Default, help+spec.Help+" (RESOURCE_EXHAUSTED past it)")
	}
}

// changedLimits keeps only the limits whose flags were given, so that a
// node started without them keeps the cluster's values.
func changedLimits(f *pflag.FlagSet, l fsm.Limits) fsm.Limits {
	var out fsm.Limits
	for _, spec := range fsm.LimitSpecs {
		if f.Changed(spec.Name) {
			*spec.Field(&out) = *spec.Field(&l)
		}
	}
	return out
}

// emitLimits prints the limits: JSON {"max_sessions":N,...,"revision":N}.
func (a *app) emitLimits(resp *pb.LimitsResponse) error {
	l := fsm.LimitsFromMessage(resp.GetLimits())
	out := map[string]uint64{"revision": resp.GetRevision()}
	for _, spec := range fsm.LimitSpecs {
		out[spec.JSON()] = *spec.Field(&l)
	}
	return a.emit(out, func(w io.Writer) {
		for _, spec := range fsm.LimitSpecs {
			fmt.Fprintf(w, "%-20s %d\n", spec.Name, *spec.Field(&l))
		}
	})
}

func (a *app) limitsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "limits",
		Short: "Show or change the cluster's admission limits",
		Long: `The cluster's admission limits: how many sessions, waiters, locks,
registers, queues and keys the state may hold, and how many bytes. They are
replicated settings, the same on every member, enforced where commands are
applied, so concurrent requests cannot race past them. A request past one
is refused with RESOURCE_EXHAUSTED naming the limit; lowering a limit below
what is stored refuses new growth only. docs/limits.md lists them all.

JSON: {"max_sessions":N,"max_waiters":N,...,"revision":N}.`,
	}
	get := &cobra.Command{
		Use:   "get",
		Short: "Show the limits",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				resp, err := c.Limits(ctx)
				if err != nil {
					return err
				}
				return a.emitLimits(resp)
			})
		},
	}
	var want fsm.Limits
	set := &cobra.Command{
		Use:   "set --max-NAME N ...",
		Short: "Change limits (the others keep their values)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			change := changedLimits(cmd.Flags(), want)
			if change.IsZero() {
				return fmt.Errorf("name at least one limit to set, e.g. --max-sessions 200000 (see '%s --help')", cmd.CommandPath())
			}
			for _, spec := range fsm.LimitSpecs {
				if cmd.Flags().Changed(spec.Name) && *spec.Field(&change) == 0 {
					return fmt.Errorf("--%s must be at least 1", spec.Name)
				}
			}
			limits := &pb.ClusterLimits{}
			fsm.LimitsToMessage(change, limits)
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				resp, err := c.SetLimits(ctx, limits)
				if err != nil {
					return err
				}
				return a.emitLimits(resp)
			})
		},
	}
	clusterLimitFlags(set.Flags(), &want, "")
	cmd.AddCommand(get, set)
	return cmd
}
