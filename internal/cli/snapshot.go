package cli

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/tenure-io/tenure/client"
)

func (a *app) snapshotCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Back up the whole state, or restore it into a new cluster",
	}
	save := &cobra.Command{
		Use:   "save FILE",
		Short: "Write a consistent copy of the whole state to FILE",
		Long:  `Write a consistent copy of the whole state to FILE. JSON: {"file","bytes"}.`,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				tmp := args[0] + ".partial"
				f, err := os.Create(tmp)
				if err != nil {
					return err
				}
				n, err := c.SaveSnapshot(ctx, f)
				if err == nil {
					err = f.Sync()
				}
				if cerr := f.Close(); err == nil {
					err = cerr
				}
				if err == nil {
					err = os.Rename(tmp, args[0])
				}
				if err != nil {
					os.Remove(tmp)
					return err
				}
				out := struct {
					File  string `json:"file"`
					Bytes int64  `json:"bytes"`
				}{args[0], n}
				return a.emit(out, func(w io.Writer) { fmt.Fprintf(w, "saved %d bytes to %s\n", n, args[0]) })
			})
		},
	}
	var force bool
	restore := &cobra.Command{
		Use:   "restore FILE",
		Short: "Replace the state of a new cluster with a saved snapshot",
		Long: `Replace the state of a NEW cluster with the snapshot in FILE (disaster
recovery). Start the new cluster first, then run this against it.

The restore is refused when the cluster's revision is already past the
snapshot's: fencing tokens would be issued a second time. --force overrides
that, for a cluster whose tokens no resource has seen.

JSON: {"revision","sessions","locks","registers","queues","keys"}.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				resp, err := c.RestoreSnapshot(ctx, f, force)
				if err != nil {
					return err
				}
				out := struct {
					Revision  uint64 `json:"revision"`
					Sessions  uint32 `json:"sessions"`
					Locks     uint32 `json:"locks"`
					Registers uint32 `json:"registers"`
					Queues    uint32 `json:"queues"`
					Keys      uint64 `json:"keys"`
				}{resp.GetRevision(), resp.GetSessions(), resp.GetLocks(), resp.GetRegisters(), resp.GetQueues(), resp.GetKeys()}
				return a.emit(out, func(w io.Writer) {
					fmt.Fprintf(w, "restored revision %d: %d sessions, %d locks, %d registers, %d queues, %d keys\n", out.Revision, out.Sessions, out.Locks, out.Registers, out.Queues, out.Keys)
				})
			})
		},
	}
	restore.Flags().BoolVar(&force, "force", false, "restore even if the cluster's revision is past the snapshot's")
	cmd.AddCommand(save, restore)
	return cmd
}
