package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// ErrSnapshotBehind: a restore without force of a snapshot older than the
// cluster's state.
var ErrSnapshotBehind = errors.New("tenure: snapshot is older than this cluster's state")

// ErrForeignSnapshot: a restore of a snapshot that another cluster saved,
// without RestoreOptions.FromCluster naming it. It is also fsm.ErrInvalid.
var ErrForeignSnapshot = fmt.Errorf("%w: the snapshot is of another cluster", fsm.ErrInvalid)

// SaveSnapshot returns a consistent copy of the whole state, read on the
// leader after a linearizable read barrier, sealed (fsm.SealSnapshot) with
// the cluster's id. It holds the private signing keys.
func (n *Node) SaveSnapshot(ctx context.Context) ([]byte, error) {
	if err := n.LinearizableRead(ctx); err != nil {
		return nil, err
	}
	snap := n.fsm.ConsistentExport()
	state, err := proto.MarshalOptions{Deterministic: true}.Marshal(snap)
	if err != nil {
		return nil, fmt.Errorf("node: encoding the snapshot: %w", err)
	}
	return fsm.SealSnapshot(snap.GetSecurity().GetClusterId(), state)
}

// RestoreOptions say how RestoreSnapshot may replace the state.
type RestoreOptions struct {
	// Force restores a snapshot older than the cluster's state (the
	// revision still never goes back).
	Force bool
	// FromCluster names, as fsm.ClusterIDString writes it, the cluster
	// that saved a snapshot of another cluster; without it such a
	// snapshot is refused (ErrForeignSnapshot).
	FromCluster string
	// ReplaceKeys takes the snapshot's ACLs, signing keys and cluster id;
	// without it the running cluster's are kept, whichever cluster saved
	// the snapshot.
	ReplaceKeys bool
	// AboveRevision: the restored state continues above it, and tokens up
	// to it stay stale (the revision a lost data directory had reached).
	AboveRevision uint64
}

// RestoreSnapshot replaces the replicated state with a saved one, through
// raft (the leader installs it and followers receive it as a raft
// snapshot), and returns the state as restored. Sessions in the snapshot
// start a fresh TTL.
//
// data must be a sealed snapshot file (fsm.OpenSnapshot): an empty, cut,
// changed or unsealed file is refused, force or not, and so is a state
// that fails validation (fsm.ValidateSnapshot: every token, grant and id
// at or below its revision; then fsm.Import). A snapshot of another cluster is refused unless
// opt.FromCluster names it. The running cluster's ACLs, signing keys and
// cluster id are kept unless opt.ReplaceKeys. Nothing changes when it is
// refused.
//
// A restore never lowers the revision, so tokens never go backwards: the
// restored state continues above the highest of the snapshot's revision,
// the cluster's (read on the leader after a barrier, with no command
// admitted until the restore is done), this node's applied record and
// opt.AboveRevision. Its fence floor is set to that revision, so every
// token issued until then is stale at every fenced register. A snapshot
// older than the cluster's state is refused (ErrSnapshotBehind) unless
// opt.Force. A cluster that enforces its ACLs still does after the
// restore, whatever the snapshot says (--replace-keys included). The
// cluster version stays as it is; a snapshot saved at a newer one is
// refused (fsm.ErrVersion).
func (n *Node) RestoreSnapshot(ctx context.Context, data []byte, opt RestoreOptions) (*fsmpb.Snapshot, error) {
	fileID, state, err := fsm.OpenSnapshot(data)
	if err != nil {
		return nil, err
	}
	snap := &fsmpb.Snapshot{}
	if err := proto.Unmarshal(state, snap); err != nil {
		return nil, fmt.Errorf("%w: the snapshot's state does not decode: %v", fsm.ErrInvalid, err)
	}
	if !bytes.Equal(fileID, snap.GetSecurity().GetClusterId()) {
		return nil, fmt.Errorf("%w: the file's header names cluster %s, its state cluster %s", fsm.ErrSnapshotDamaged, fsm.ClusterIDString(fileID), fsm.ClusterIDString(snap.GetSecurity().GetClusterId()))
	}
	if err := fsm.ValidateSnapshot(snap); err != nil {
		return nil, err
	}
	if _, err := fsm.Import(snap); err != nil {
		if errors.Is(err, fsm.ErrInvalid) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", fsm.ErrInvalid, err)
	}
	// A state of a newer cluster version than this cluster's is not
	// installed on members that may not read it. A cluster whose voters
	// all speak it may not have raised its version yet: ask them first.
	if v := max(snap.GetClusterVersion(), snap.GetFormatVersion(), 1); v > n.fsm.ClusterVersion() {
		if n.raft.State() == raft.Leader {
			n.raiseForRestore(ctx, v)
		}
		if cv := n.fsm.ClusterVersion(); v > cv {
			return nil, fmt.Errorf("%w: the snapshot was saved at cluster version %d and this cluster is at version %d: finish upgrading every member first (docs/operations.md)", fsm.ErrVersion, v, cv)
		}
	}
	// Take every batcher slot: no command enters raft from here until the
	// restore is installed, so the revision read below is the last one
	// before the restore.
	held := 0
	defer func() {
		for ; held > 0; held-- {
			<-n.slots
		}
	}()
	for ; held < maxInflight; held++ {
		select {
		case n.slots <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-n.quit:
			return nil, ErrClosed
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err // a timeout of 0 would mean none to raft
	}
	if err := mapReadErr(n.await(ctx, func() raft.Future { return n.raft.Barrier(n.timeout(ctx)) })); err != nil {
		return nil, err
	}
	var cur uint64
	var running *fsm.Security
	n.fsm.Read(func(s *fsm.State) { cur, running = s.Revision(), s.Security() })
	if len(running.ClusterID) > 0 && !bytes.Equal(fileID, running.ClusterID) && opt.FromCluster != fsm.ClusterIDString(fileID) {
		return nil, fmt.Errorf("%w: it was saved by cluster %s and this is cluster %s; to restore it here give --from-cluster %s (this cluster's ACLs and signing keys are kept unless --replace-keys)", ErrForeignSnapshot, fsm.ClusterIDString(fileID), fsm.ClusterIDString(running.ClusterID), fsm.ClusterIDString(fileID))
	}
	floor := max(cur, n.rec.record().Revision)
	if snap.GetRevision() < floor && !opt.Force {
		return nil, fmt.Errorf("%w: the cluster is at revision %d, the snapshot at %d; with --force the restored state continues above revision %d and every token issued so far stays stale", ErrSnapshotBehind, floor, snap.GetRevision(), floor)
	}
	// The cluster version is never lowered (checked above).
	cv := n.fsm.ClusterVersion()
	snap.ClusterVersion, snap.FormatVersion = cv, cv
	floor = max(floor, opt.AboveRevision)
	snap.Revision = max(snap.GetRevision(), floor)
	snap.FenceFloor = max(snap.GetFenceFloor(), floor)
	if !opt.ReplaceKeys {
		snap.Security = fsm.ExportSecurity(running)
	}
	if running.Enforced {
		// Nothing turns the enforcement of the ACLs off, a restore of a
		// snapshot from before it included.
		if snap.Security == nil {
			snap.Security = &fsmpb.Security{}
		}
		snap.Security.AclEnforced = true
	}
	data, err = proto.MarshalOptions{Deterministic: true}.Marshal(snap)
	if err != nil {
		return nil, fmt.Errorf("node: encoding the snapshot: %w", err)
	}
	meta := &raft.SnapshotMeta{Version: raft.SnapshotVersionMax, Size: int64(len(data))}
	if err := n.raft.Restore(meta, bytes.NewReader(data), n.timeout(ctx)); err != nil {
		return nil, mapRaftErr(err)
	}
	for ; held > 0; held-- {
		<-n.slots
	}
	n.lessor.Promote(n.servingTerm(), 0) // times the restored sessions if this node still serves
	return snap, nil
}

// Snapshot asks raft to take a snapshot now (used by tests and operators).
func (n *Node) Snapshot() error {
	return n.await(context.Background(), func() raft.Future { return n.raft.Snapshot() })
}

// restoreRaiseWait bounds how long a restore waits for the voters to
// report their versions (a cluster just started is ready with a quorum,
// before its last member answers).
const restoreRaiseWait = 10 * time.Second

// raiseForRestore raises the cluster version towards v before a restore,
// asking the voters again until they all report it, for up to
// restoreRaiseWait (or ctx): a member that is still starting may not
// answer yet, or close the probe as a release before versions does.
func (n *Node) raiseForRestore(ctx context.Context, v uint32) {
	deadline := time.Now().Add(restoreRaiseWait)
	for {
		err := n.tryRaise(ctx) // upgrade.go
		if err == nil || n.fsm.ClusterVersion() >= v || time.Now().After(deadline) {
			return
		}
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return
		case <-n.quit:
			return
		}
	}
}
