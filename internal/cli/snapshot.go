package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/server"
)

func (a *app) snapshotCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Back up the whole state, or restore it without lowering the revision",
	}
	save := &cobra.Command{
		Use:   "save FILE",
		Short: "Write a consistent copy of the whole state to FILE (mode 0600)",
		Long: `Write a consistent copy of the whole state to FILE, sealed with a SHA-256
checksum and the cluster's id (docs/security.md, "Snapshots"). The file
holds the cluster's private signing keys and its token hashes: it is
written with mode 0600, through a temporary file in the same directory
that is synced and then renamed, so FILE is never left half-written.
JSON: {"file","bytes"}.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				var n int64
				err := writeFileAtomic(args[0], func(w io.Writer) (err error) {
					n, err = c.SaveSnapshot(ctx, w)
					return err
				})
				if err != nil {
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
	var force, replaceKeys bool
	var above uint64
	var fromCluster string
	restore := &cobra.Command{
		Use:   "restore FILE",
		Short: "Replace the whole state with a saved snapshot, never lowering the revision",
		Long: `Replace the whole state with the snapshot in FILE (disaster recovery).

FILE must be a whole, unchanged snapshot as "tenure snapshot save" (or
"etcdctl snapshot save" from the etcd API) wrote it: an empty, cut or changed file, or one saved before snapshots were
sealed, is refused with one line, --force or not. So is a snapshot whose
state is inconsistent (a token, grant, session or key above its
revision). Nothing changes when a restore is refused.

A snapshot saved by another cluster is refused unless --from-cluster ID
names that cluster (the id the refusal prints). Whichever cluster saved
it, the running cluster's ACLs (policies, tokens, identity bindings),
signing keys and cluster id are kept, unless --replace-keys takes the
snapshot's: then the snapshot's tokens work again and the running
cluster's stop working, and resources must be given the snapshot's keys.

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
			data, err := os.ReadFile(args[0])
			if err != nil {
				return err
			}
			// Checked here too, so that a damaged file is named at once
			// and never sent; the server checks it again.
			if _, _, err := fsm.OpenSnapshot(data); err != nil {
				return fmt.Errorf("%s: %s", args[0], strings.TrimPrefix(err.Error(), "tenure: ")) // exit 1
			}
			opts := []client.RestoreOption{client.AboveRevision(above)}
			if fromCluster != "" {
				opts = append(opts, client.FromCluster(fromCluster))
			}
			if replaceKeys {
				opts = append(opts, client.ReplaceKeys())
			}
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				resp, err := c.RestoreSnapshot(ctx, bytes.NewReader(data), force, opts...)
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
	restore.Flags().StringVar(&fromCluster, "from-cluster", "", "the id of the cluster that saved the snapshot, to restore a snapshot of another cluster (\"none\" for one that names no cluster)")
	restore.Flags().BoolVar(&replaceKeys, "replace-keys", false, "take the snapshot's ACLs, signing keys and cluster id instead of keeping the running cluster's")
	cmd.AddCommand(save, restore)
	return cmd
}

// writeFileAtomic writes path with mode 0600 through fill: into a
// temporary file in the same directory, synced, then renamed over path
// (and the directory synced), so that path is either its old self or the
// whole new file, never part of it. The temporary file is removed on
// failure.
func writeFileAtomic(path string, fill func(io.Writer) error) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".partial-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err = f.Chmod(0o600); err != nil { // CreateTemp's mode, whatever the umask did
		return err
	}
	if err = fill(f); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	if d, derr := os.Open(dir); derr == nil { // the rename itself, durable
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// restoreServeFlags adds serve's restore limits (per node).
func restoreServeFlags(f *pflag.FlagSet, l *server.RestoreLimits) {
	d := server.DefaultRestoreLimits()
	f.IntVar(&l.MaxStreams, "max-restore-streams", d.MaxStreams, "most snapshot restore streams this node accepts at once; more are refused with RESOURCE_EXHAUSTED")
	f.Int64Var(&l.MaxBytes, "max-restore-bytes", d.MaxBytes, "most bytes the open restore streams hold together on this node; a stream passing it is refused with RESOURCE_EXHAUSTED")
}
