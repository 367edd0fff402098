package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/fenceproof"
)

// clusterCommand is `tenure cluster`.
func (a *app) clusterCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "The cluster's identity: the public keys of its fence proofs",
	}
	keys := &cobra.Command{
		Use:   "keys",
		Short: "Print the cluster's id and the public keys of its fence proofs",
		Long: `Print the cluster's id and the public keys that verify its fence proofs
(every grant's TENURE_FENCE_PROOF, client.Hold.Proof). Give this to every
resource that verifies proofs: with -o json it is exactly what
fenceproof.ParseKeyset reads:

  {"cluster_id":"HEX","keys":[{"id","public_key","active","retired"}]}

public_key is the Ed25519 public key in URL-safe base64; active marks the
key that signs new grants; retired (present only when true) a key that
still verifies but is removed once its grace has passed. Needs cluster
read.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				ks, err := c.ClusterKeys(ctx)
				if err != nil {
					return err
				}
				return a.emitKeys(ks)
			})
		},
	}
	rotate := &cobra.Command{
		Use:   "rotate",
		Short: "Add a new signing key, which signs every grant from now on",
		Long: `Add a new signing key: it signs every grant from now on. The older keys
stay listed, at most 16 in all (the oldest is dropped first), so that proofs
they signed still verify where they are configured: give the new keyset to
every verifier. Retire the old key when its holds have ended ("tenure
cluster keys retire KID --after DURATION", or --now for a leaked key).
Prints the keys as "tenure cluster keys". Needs cluster write.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				ks, err := c.RotateClusterKey(ctx)
				if err != nil {
					return err
				}
				return a.emitKeys(ks)
			})
		},
	}
	var after time.Duration
	var now bool
	retire := &cobra.Command{
		Use:   "retire KID",
		Short: "Retire a signing key: remove it from the keys after a grace (--after) or at once (--now)",
		Long: `Retire signing key KID (an id "tenure cluster keys" lists). The active
key, which signs new grants, cannot be retired: rotate first.

--after DURATION: the key stays listed, marked retired, and keeps
verifying the proofs it signed for DURATION (measured on the leader; a
change of leader starts it again, so it is never shorter); then the
leader removes it. Use it for a planned rotation: holds granted before the
rotation keep working until they end.

--now: the key is removed at once. Use it for a leaked key: proofs it
signed, forged ones included, stop verifying on the server at once, and at
every resource as soon as its keyset is refreshed (refresh or redistribute
"tenure cluster keys -o json").

Prints the keys as "tenure cluster keys". Needs cluster write.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case now && after != 0:
				return fmt.Errorf("%w: give --after DURATION or --now, not both", client.ErrInvalid)
			case !now && after <= 0:
				return fmt.Errorf("%w: give the grace before the key is removed (--after DURATION, e.g. --after 1h) or --now", client.ErrInvalid)
			}
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				ks, err := c.RetireClusterKey(ctx, args[0], after)
				if err != nil {
					return err
				}
				return a.emitKeys(ks)
			})
		},
	}
	retire.Flags().DurationVar(&after, "after", 0, "the grace: how long the retired key keeps verifying before it is removed")
	retire.Flags().BoolVar(&now, "now", false, "remove the key at once (a leaked key)")
	keys.AddCommand(rotate, retire)
	cmd.AddCommand(keys)
	return cmd
}

func (a *app) emitKeys(ks fenceproof.Keyset) error {
	return a.emit(ks, func(w io.Writer) {
		fmt.Fprintf(w, "cluster %s\n", ks.ClusterID)
		for _, k := range ks.Keys {
			active := ""
			switch {
			case k.Active:
				active = "\t(active)"
			case k.Retired:
				active = "\t(retired)"
			}
			fmt.Fprintf(w, "key %s\t%s%s\n", k.ID, k.PublicKey, active)
		}
	})
}
