package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/server"
)

func (a *app) snapshotCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Back up the whole state, or restore it without lowering the revision",
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
	var above uint64
	restore := &cobra.Command{
		Use:   "restore FILE",
		Short: "Replace the whole state with a saved snapshot, never lowering the revision",
		Long: `Replace the whole state with the snapshot in FILE (disaster recovery).

A restore never moves the revision, and so the fencing tokens, backwards:
the restored state continues above the highest of the snapshot's
revision, the cluster's current one and the highest the leader has
recorded. Every token issued before the restore stays stale at every
fenced register (also at registers the snapshot does not have), and holds
restored from the snapshot keep their old tokens, so their holders should
acquire again before writing.

A snapshot older than the cluster's state is refused unless --force: it
would bring back older values, drop newer registers, keys, locks and
sessions.

--above-revision N restores onto an EMPTY data directory after the old
one was lost: N is the revision it had reached (the number a node names
when it refuses to start on a damaged log). The state then continues
above N and tokens up to N stay stale.

JSON: {"revision","sessions","locks","registers","queues","keys"}, with the
revision the restored state continues from.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			var snap io.Reader = f
			if above > 0 {
				data, err := io.ReadAll(f)
				if err == nil {
					data, err = raiseRevision(data, above)
				}
				if err != nil {
					return fmt.Errorf("%s: %w", args[0], err)
				}
				snap = bytes.NewReader(data)
			}
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				resp, err := c.RestoreSnapshot(ctx, snap, force)
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
	restore.Flags().BoolVar(&force, "force", false, "restore even though the snapshot is older than the cluster's state (the revision still never goes back)")
	restore.Flags().Uint64Var(&above, "above-revision", 0, "continue above this revision, and keep tokens up to it stale (the revision of a lost data directory)")
	cmd.AddCommand(save, restore)
	return cmd
}

// raiseRevision returns the snapshot in data with its revision and fence
// floor raised to at least rev.
func raiseRevision(data []byte, rev uint64) ([]byte, error) {
	snap := &fsmpb.Snapshot{}
	if err := proto.Unmarshal(data, snap); err != nil {
		return nil, fmt.Errorf("not a Tenure snapshot: %w", err)
	}
	snap.Revision = max(snap.GetRevision(), rev)
	snap.FenceFloor = max(snap.GetFenceFloor(), rev)
	return proto.MarshalOptions{Deterministic: true}.Marshal(snap)
}

// restoreServeFlags adds serve's restore limits (per node).
func restoreServeFlags(f *pflag.FlagSet, l *server.RestoreLimits) {
	d := server.DefaultRestoreLimits()
	f.IntVar(&l.MaxStreams, "max-restore-streams", d.MaxStreams, "most snapshot restore streams this node accepts at once; more are refused with RESOURCE_EXHAUSTED")
	f.Int64Var(&l.MaxBytes, "max-restore-bytes", d.MaxBytes, "most bytes the open restore streams hold together on this node; a stream passing it is refused with RESOURCE_EXHAUSTED")
}
