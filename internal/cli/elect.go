package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// leaderJSON is one line of `tenure elect NAME --observe -o json`.
type leaderJSON struct {
	Leader string `json:"leader"`
	Value  string `json:"value"`
	Token  uint64 `json:"token"`
}

func (a *app) electCommand() *cobra.Command {
	var lf lockFlags
	var (
		observe bool
		count   int
	)
	cmd := &cobra.Command{
		Use:   "elect NAME VALUE [flags] -- COMMAND [ARG...] | elect NAME --observe",
		Short: "Run a command while leader of an election, or observe an election",
		Long: `Campaign in the election NAME with VALUE and run COMMAND while leader.
TENURE_FENCE_TOKEN is the leader token: pass it with every effect. When
COMMAND exits, leadership is resigned. Signals, the suspect rule and exit
codes are those of 'tenure lock'.

With --observe, print the current leader and then every change of leader
or value, one line (one JSON object with -o json) each:
{"leader":OWNER,"value":VALUE,"token":N}, leader empty when there is none.
It runs until interrupted (exit 0), until --count N lines were printed
(exit 0), or until the observation fails (exit 1, with the reason).`,
		Example: `  tenure elect scheduler "$(hostname)" -- ./scheduler
  tenure elect scheduler --observe -o json`,
		Args: func(cmd *cobra.Command, args []string) error {
			if observe {
				if len(args) != 1 || cmd.ArgsLenAtDash() >= 0 {
					return errors.New("usage: tenure elect NAME --observe")
				}
				return nil
			}
			if cmd.ArgsLenAtDash() != 2 || len(args) < 3 {
				return errors.New("usage: tenure elect NAME VALUE [flags] -- COMMAND [ARG...]")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if observe {
				if count < 0 {
					return errors.New("--count must not be negative")
				}
				return a.observe(cmd.Context(), args[0], count)
			}
			lf.election, lf.value = true, args[1]
			return a.runLock(cmd.Context(), args[0], args[2:], lf)
		},
	}
	lockRunFlags(cmd, &lf)
	cmd.Flags().BoolVar(&observe, "observe", false, "print every change of leader or value")
	cmd.Flags().IntVar(&count, "count", 0, "with --observe: stop after this many lines (0: run until interrupted)")
	return cmd
}

func (a *app) observe(ctx context.Context, name string, count int) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	c, err := a.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	obs, err := c.Observe(ctx, name)
	if err != nil {
		return a.describe(err)
	}
	for l := range obs.C {
		out := leaderJSON{Leader: l.Owner, Value: string(l.Value), Token: l.Token}
		if err := a.emit(out, func(w io.Writer) {
			if l.Session == 0 {
				fmt.Fprintf(w, "%s: no leader\n", name)
				return
			}
			fmt.Fprintf(w, "%s: leader %s (token %d): %s\n", name, out.Leader, out.Token, out.Value)
		}); err != nil {
			return err
		}
		if count--; count == 0 {
			return nil
		}
	}
	if err := obs.Err(); ctx.Err() == nil {
		return a.describe(fmt.Errorf("observation of %s ended: %w", name, err))
	}
	return nil
}
