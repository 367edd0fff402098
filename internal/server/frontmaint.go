package server

// The maintenance calls of the node, for the other fronts (etcd's
// Maintenance service): backups, compacting the node's files, handing
// over leadership, and the sizes of the data directory. Each is what
// Tenure's own API does for `tenure snapshot save` and `tenure member
// transfer-leadership`; a front checks its caller's rights first (these
// need cluster write, as on Tenure's API).

import "context"

// SaveSnapshot returns a sealed snapshot of the whole state
// (fsm.SealSnapshot: what `tenure snapshot save` writes and `tenure
// snapshot restore` reads), read after a linearizable read barrier: on
// the leader only (ErrNotLeader elsewhere). It holds the cluster's private
// signing keys.
func (f Front) SaveSnapshot(ctx context.Context) ([]byte, error) {
	return f.s.node.SaveSnapshot(ctx)
}

// CompactLog takes a snapshot of this node's state and truncates the raft
// log it covers, on this node only; nil when there is nothing new to
// snapshot.
func (f Front) CompactLog(ctx context.Context) error {
	if err := f.s.node.CompactLog(ctx); err != nil {
		return err
	}
	f.s.log.Info("log compacted: snapshot taken", "data_bytes", f.s.node.DataSize(), "in_use_bytes", f.s.node.DataSizeInUse())
	return nil
}

// TransferLeadership hands the leadership of this node, which must lead
// (ErrNotLeader), to the voter id, and returns the new leader once this
// node no longer leads. Giving it to itself or to a member that is not
// another voter is fsm.ErrInvalid.
func (f Front) TransferLeadership(ctx context.Context, id string) (string, error) {
	leader, err := f.s.node.TransferLeadership(ctx, id)
	if err == nil {
		f.s.log.Info("leadership transferred", "to", leader)
	}
	return leader, err
}

// DataSizeInUse is the part of DataSize a restart reads: the raft log
// and stable store and the newest snapshot (older snapshots are kept as
// a fallback until the next one).
func (f Front) DataSizeInUse() int64 { return f.s.node.DataSizeInUse() }
