package node

// Compacting what a node keeps on disk: the maintenance calls of the etcd
// API (Defragment, Status' db_size_in_use) reach it through the server's
// Front.

import (
	"context"
	"errors"
	"io/fs"
	"path/filepath"

	"github.com/hashicorp/raft"
)

// CompactLog takes a snapshot of this node's state now and lets raft
// truncate the log it covers (raft keeps its trailing entries, so that a
// follower a little behind catches up from the log). It works on any
// member, and changes only this node's files: the replicated state is
// untouched. A node with nothing new since its last snapshot has nothing
// to compact: nil.
func (n *Node) CompactLog(ctx context.Context) error {
	err := n.await(ctx, func() raft.Future { return n.raft.Snapshot() })
	if err != nil && errors.Is(err, raft.ErrNothingNewToSnapshot) {
		return nil
	}
	return err
}

// DataSizeInUse is the part of DataSize a restart of this node reads: the
// raft log and stable store, and the newest snapshot. The rest is older
// snapshots raft keeps as a fallback (and files left by an interrupted
// snapshot), which the next snapshot replaces.
func (n *Node) DataSizeInUse() int64 {
	size := dirSize(filepath.Join(n.cfg.DataDir, "raft"))
	if n.snaps == nil {
		return size
	}
	metas, err := n.snaps.List()
	if err != nil || len(metas) == 0 {
		return size
	}
	return size + dirSize(filepath.Join(snapshotsDir(n.cfg.DataDir), metas[0].ID))
}

// dirSize is the size in bytes of the regular files under dir.
func dirSize(dir string) int64 {
	var size int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, ierr := d.Info(); ierr == nil {
				size += info.Size()
			}
		}
		return nil
	})
	return size
}
