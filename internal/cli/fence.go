package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/tenure-io/tenure/client"
)

// Results of `tenure fence put` and `tenure fence delete`.
const (
	putAccepted  = "accepted"
	putStale     = "stale"
	putDuplicate = "duplicate"
	putInvalid   = "invalid" // the token was never issued, or the register is bound to another lock
	putForged    = "forged"  // --proof did not verify
)

// fencePutJSON is `tenure fence put -o json` and `tenure fence delete -o
// json`. For "invalid", token is the refused token and revision the
// service's when it refused it.
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
	// Lock is the lock the register is bound to ("" none).
	Lock string `json:"lock"`
}

func (a *app) fenceCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fence",
		Short: "Read and write fenced registers",
		Long: `Fenced registers are the server's own resource guarded by fencing tokens:
a write is applied only if its token is at least the highest token the
register has accepted.`,
	}
	cmd.AddCommand(a.fencePutCommand(), a.fenceDeleteCommand(), a.fenceGetCommand())
	return cmd
}

// fenceFlags are the flags of a fenced write.
type fenceFlags struct {
	token uint64
	opID  string
	lock  string
	proof string
}

func (ff *fenceFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.Uint64Var(&ff.token, "token", 0, "fencing token of the write (required)")
	f.StringVar(&ff.opID, "op-id", "", "operation id: a replay with the same id applies nothing")
	f.StringVar(&ff.lock, "lock", "", "the lock whose grant carried the token: the write then also needs that grant to be current")
	f.StringVar(&ff.proof, "proof", "", "the grant's fence proof (TENURE_FENCE_PROOF): the write is then refused as forged unless it verifies for the token and the lock (--lock, or a lock named like KEY)")
}

// options checks the flags and returns the client's options for them.
func (ff *fenceFlags) options(cmd *cobra.Command) ([]client.FenceOption, error) {
	if !cmd.Flags().Changed("token") {
		return nil, errors.New("--token is required")
	}
	var opts []client.FenceOption
	if cmd.Flags().Changed("lock") {
		if ff.lock == "" {
			return nil, errors.New("--lock must not be empty")
		}
		opts = append(opts, client.WithLock(ff.lock))
	}
	if cmd.Flags().Changed("proof") {
		if ff.proof == "" {
			return nil, errors.New("--proof is empty (is TENURE_FENCE_PROOF set?)")
		}
		opts = append(opts, client.WithProof(ff.proof))
	}
	return opts, nil
}

// emitFenced prints the outcome of a fenced write (what names the key in
// the text line) and returns the error that sets the exit code: nil for
// accepted and duplicate, ErrStale (3) for stale, the error (1) for an
// invalid token or anything else.
func (a *app) emitFenced(what string, r client.PutResult, err error) error {
	var ue *client.UnissuedTokenError
	var wl *client.WrongLockError
	var fe *client.ForgedProofError
	stale := errors.Is(err, client.ErrStale)
	out := fencePutJSON{Result: putAccepted, Token: r.Token, Revision: r.Revision}
	switch {
	case errors.As(err, &ue):
		out = fencePutJSON{Result: putInvalid, Token: ue.Token, Revision: ue.Revision}
	case errors.As(err, &wl):
		out = fencePutJSON{Result: putInvalid, Token: wl.Token, Revision: wl.Revision}
	case errors.As(err, &fe):
		out = fencePutJSON{Result: putForged, Token: fe.Token}
	case err != nil && !stale:
		return err
	case r.Duplicate:
		out.Result = putDuplicate
	case stale:
		out.Result = putStale
	}
	if perr := a.emit(out, func(w io.Writer) {
		switch out.Result {
		case putInvalid:
			if wl != nil {
				fmt.Fprintf(w, "%s (%s is bound to lock %q; the write named lock %q)\n", out.Result, what, wl.Bound, wl.Lock)
				return
			}
			fmt.Fprintf(w, "%s (%s: token %d was never issued; the revision is %d)\n", out.Result, what, out.Token, out.Revision)
			return
		case putForged:
			fmt.Fprintf(w, "%s (%s: the proof does not verify for token %d of lock %q: %s)\n", out.Result, what, out.Token, fe.Lock, fe.Reason)
			return
		}
		fmt.Fprintf(w, "%s (%s token %d)\n", out.Result, what, out.Token)
	}); perr != nil {
		return perr
	}
	return err
}

func (a *app) fencePutCommand() *cobra.Command {
	var (
		ff  fenceFlags
		val valueArg
	)
	cmd := &cobra.Command{
		Use:   "put KEY VALUE|-|--file F --token N [--lock NAME] [--proof P] [--op-id ID]",
		Short: "Write a register if the token is not stale",
		Long: `Write VALUE ("-": read it from stdin; --file F: from a file) to the
register KEY if --token is at least the highest token the
register has accepted (after a delete of KEY: at least the delete's token).
With --lock, the token must also be a current grant of that lock (any of its
holders): a holder whose grant has ended is stale even before a newer holder
writes. The first accepted write naming a lock binds the register to it:
every later write is checked against that lock, named or not, and one
naming another lock is refused as "invalid". docs/fencing.md says when to
name the lock.

JSON: {"result":"accepted"|"stale"|"duplicate"|"invalid"|"forged","token":N,"revision":N}
where token is the register's accepted token after the call. "duplicate"
means --op-id was seen before: nothing was applied, and the first outcome
stands. "invalid" means the token was never issued (it is above the
service's revision) or --lock names another lock than the register's:
nothing was stored; token is then the refused token and revision the
service's. With --proof (under tenure lock:
--proof "$TENURE_FENCE_PROOF"), "forged" means the proof does not verify
with the cluster's keys for the token and the lock (--lock, or else a lock
named like KEY): nothing was stored; token is then the refused token.

Exit codes: 0 accepted or duplicate, 3 stale, 1 invalid, forged and other
errors.`,
		Args: func(cmd *cobra.Command, args []string) error { return val.args(cmd, args) },
		RunE: func(cmd *cobra.Command, args []string) error {
			opts, err := ff.options(cmd)
			if err != nil {
				return err
			}
			key := args[0]
			value, err := val.read(args, a.streams.In)
			if err != nil {
				return err
			}
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				r, err := c.FencedPut(ctx, key, value, ff.token, ff.opID, opts...)
				return a.emitFenced("register "+key, r, err)
			})
		},
	}
	ff.add(cmd)
	val.add(cmd)
	return cmd
}

func (a *app) fenceDeleteCommand() *cobra.Command {
	var ff fenceFlags
	cmd := &cobra.Command{
		Use:   "delete KEY --token N [--lock NAME] [--proof P] [--op-id ID]",
		Short: "Delete a register if the token is not stale",
		Long: `Delete the register KEY, with the checks of "tenure fence put": --token at
least the register's accepted token, --lock, --proof, --op-id, a token never
issued.
The key keeps the delete's token and its register's lock: a later write to
KEY needs at least that token, checked against that lock (docs/fencing.md
says for how long). Deleting a register that does not
exist is accepted and raises the key's token all the same.

JSON: {"result":"accepted"|"stale"|"duplicate"|"invalid"|"forged","token":N,"revision":N}
where token is the key's accepted token after the call; see "tenure fence
put".

Exit codes: 0 accepted or duplicate, 3 stale, 1 invalid, forged and other
errors.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts, err := ff.options(cmd)
			if err != nil {
				return err
			}
			key := args[0]
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				r, err := c.FencedDelete(ctx, key, ff.token, ff.opID, opts...)
				return a.emitFenced("register "+key, r, err)
			})
		},
	}
	ff.add(cmd)
	return cmd
}

func (a *app) fenceGetCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "get KEY",
		Short: "Read a register (linearizable)",
		Long: `Read the register KEY.

JSON: {"key","value","token","found","mod_revision","lock"}; value is the
stored bytes as a string ("" and found=false for a register never
written); lock is the lock the register is bound to ("" none: no write
naming a lock yet), which every write is checked against.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				r, err := c.FencedGet(ctx, args[0])
				if err != nil {
					return err
				}
				out := fenceGetJSON{Key: args[0], Value: string(r.Value), Token: r.Token, Found: r.Found, ModRevision: r.ModRevision, Lock: r.Lock}
				return a.emit(out, func(w io.Writer) {
					if !out.Found {
						fmt.Fprintf(w, "register %s: not found\n", out.Key)
						return
					}
					if out.Lock != "" {
						fmt.Fprintf(w, "%s\t(token %d, lock %s)\n", out.Value, out.Token, out.Lock)
						return
					}
					fmt.Fprintf(w, "%s\t(token %d)\n", out.Value, out.Token)
				})
			})
		},
	}
}
