package cli

import (
	"context"
	"fmt"
	"io"

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

  {"cluster_id":"HEX","keys":[{"id","public_key","active"}]}

public_key is the Ed25519 public key in URL-safe base64; active marks the
key that signs new grants. Needs cluster read.`,
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
every verifier. Prints the keys as "tenure cluster keys". Needs cluster
write.`,
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
	keys.AddCommand(rotate)
	cmd.AddCommand(keys)
	return cmd
}

func (a *app) emitKeys(ks fenceproof.Keyset) error {
	return a.emit(ks, func(w io.Writer) {
		fmt.Fprintf(w, "cluster %s\n", ks.ClusterID)
		for _, k := range ks.Keys {
			active := ""
			if k.Active {
				active = "\t(active)"
			}
			fmt.Fprintf(w, "key %s\t%s%s\n", k.ID, k.PublicKey, active)
		}
	})
}
