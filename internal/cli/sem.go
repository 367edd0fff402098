package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/tenure-io/tenure/client"
)

func (a *app) semCommand() *cobra.Command {
	var lf lockFlags
	use := "tenure sem NAME --limit N [flags] -- COMMAND [ARG...]"
	cmd := &cobra.Command{
		Use:   "sem NAME --limit N [flags] -- COMMAND [ARG...]",
		Short: "Run a command while holding one of a semaphore's N permits; inspect semaphores",
		Long: `Run COMMAND while holding one of the N permits of the semaphore NAME.

Waiting is FIFO; every permit's grant has its own fencing token, passed to
COMMAND as TENURE_FENCE_TOKEN. The first use of a name fixes its number of
permits; --limit with another number is refused. Signals, the suspect rule
and exit codes are those of 'tenure lock'.

"status" is a subcommand, so it cannot be used as a semaphore name here.`,
		Example: `  tenure sem encoders --limit 2 -- ./encode.sh
  tenure sem status encoders -o json`,
		Args: lockArgs(use, "semaphore"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if lf.permits < 1 {
				return errors.New("--limit N (at least 1) is required")
			}
			return a.runLock(cmd.Context(), args[0], args[1:], lf)
		},
	}
	lockRunFlags(cmd, &lf)
	cmd.Flags().IntVar(&lf.permits, "limit", 0, "number of permits (1..10000)")
	cmd.AddCommand(a.semStatusCommand())
	return cmd
}

// semStatusJSON is `tenure sem status -o json`.
type semStatusJSON struct {
	Name    string       `json:"name"`
	Limit   uint32       `json:"limit"`
	Holders []holderJSON `json:"holders"`
	Waiters int          `json:"waiters"`
}

func (a *app) semStatusCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "status NAME",
		Short: "Show a semaphore's holders and waiters",
		Long:  `JSON: {"name","limit":N,"holders":[{"owner","session","token"}],"waiters":N}.`,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				st, err := c.LockStatus(ctx, args[0])
				if err != nil {
					return err
				}
				out := semStatusJSON{Name: st.GetName(), Limit: st.GetPermits(), Holders: []holderJSON{}, Waiters: len(st.GetWaiters())}
				for _, h := range st.GetHolders() {
					out.Holders = append(out.Holders, holderJSON{Owner: h.GetOwner(), Session: h.GetSession(), Token: h.GetToken()})
				}
				return a.emit(out, func(w io.Writer) {
					fmt.Fprintf(w, "semaphore %s: %d of %d permits held, %d waiting\n", out.Name, len(out.Holders), out.Limit, out.Waiters)
					for _, h := range out.Holders {
						fmt.Fprintf(w, "  %s (session %d, token %d)\n", h.Owner, h.Session, h.Token)
					}
				})
			})
		},
	}
}
