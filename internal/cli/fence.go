package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/tenure-io/tenure/client"
)

// Results of `tenure fence put`.
const (
	putAccepted  = "accepted"
	putStale     = "stale"
	putDuplicate = "duplicate"
)

// fencePutJSON is `tenure fence put -o json`.
type fencePutJSON struct {
	Result   string `json:"result"`
	Token    uint64 `json:"token"`
	Revision uint64 `json:"revision"`
}

// fenceGetJSON is `tenure fence get -o json`.
type fenceGetJSON struct {
	Key         string `json:"key"`
	Value       string `json:"value"`
	Token       uint64 `json:"token"`
	Found       bool   `json:"found"`
	ModRevision uint64 `json:"mod_revision"`
}

func (a *app) fenceCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fence",
		Short: "Read and write fenced registers",
		Long: `Fenced registers are the server's own resource guarded by fencing tokens:
a write is applied only if its token is at least the highest token the
register has accepted.`,
	}
	cmd.AddCommand(a.fencePutCommand(), a.fenceGetCommand())
	return cmd
}

func (a *app) fencePutCommand() *cobra.Command {
	var (
		token uint64
		opID  string
	)
	cmd := &cobra.Command{
		Use:   "put KEY VALUE --token N [--op-id ID]",
		Short: "Write a register if the token is not stale",
		Long: `Write VALUE to the register KEY if --token is at least the highest token the
register has accepted.

JSON: {"result":"accepted"|"stale"|"duplicate","token":N,"revision":N} where
token is the register's accepted token after the call. "duplicate" means
--op-id was seen before: nothing was applied, and the first outcome stands.

Exit codes: 0 accepted or duplicate, 3 stale, 1 other errors.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("token") {
				return errors.New("--token is required")
			}
			key, value := args[0], args[1]
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				r, err := c.FencedPut(ctx, key, []byte(value), token, opID)
				stale := errors.Is(err, client.ErrStale)
				if err != nil && !stale {
					return err
				}
				out := fencePutJSON{Result: putAccepted, Token: r.Token, Revision: r.Revision}
				switch {
				case r.Duplicate:
					out.Result = putDuplicate
				case stale:
					out.Result = putStale
				}
				if perr := a.emit(out, func(w io.Writer) {
					fmt.Fprintf(w, "%s (register %s token %d)\n", out.Result, key, out.Token)
				}); perr != nil {
					return perr
				}
				return err
			})
		},
	}
	f := cmd.Flags()
	f.Uint64Var(&token, "token", 0, "fencing token of the write (required)")
	f.StringVar(&opID, "op-id", "", "operation id: a replay with the same id applies nothing")
	return cmd
}

func (a *app) fenceGetCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "get KEY",
		Short: "Read a register (linearizable)",
		Long: `Read the register KEY.

JSON: {"key","value","token","found","mod_revision"}; value is the stored
bytes as a string ("" and found=false for a register never written).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				r, err := c.FencedGet(ctx, args[0])
				if err != nil {
					return err
				}
				out := fenceGetJSON{Key: args[0], Value: string(r.Value), Token: r.Token, Found: r.Found, ModRevision: r.ModRevision}
				return a.emit(out, func(w io.Writer) {
					if !out.Found {
						fmt.Fprintf(w, "register %s: not found\n", out.Key)
						return
					}
					fmt.Fprintf(w, "%s\t(token %d)\n", out.Value, out.Token)
				})
			})
		},
	}
}
