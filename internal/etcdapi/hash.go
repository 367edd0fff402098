package etcdapi

import (
	"context"
	"sync/atomic"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/server"
)

// HashKV implements etcd's Maintenance.HashKV for this node: a hash of the
// key-value store at the revision (0: this node's current one) over the
// keys as they were then and the history window's changes up to it
// (fsm.State.HashKV), with the window's start (compact_revision) and the
// revision hashed (hash_revision). Every member that has applied the
// revision answers the same hash: it is how operators check that the
// replicas agree. A revision this node has not applied yet answers
// "future revision", one before the window "compacted". It is answered by
// this node, never forwarded.
//
// The walk costs time in proportion to the keys and the window (about a
// second per GiB), so it reads a copy-on-write view of the state taken in
// O(1) (fsm.KVView), never the state under its lock: writes go on while
// it runs. The node walks for one call at a time (hashSlot); the others
// wait their turn, or their context's end.
func (m *maintenanceServer) HashKV(ctx context.Context, r *pb.HashKVRequest) (*pb.HashKVResponse, error) {
	s := m.s
	if err := s.authorize(ctx, "Maintenance/HashKV", server.ClusterRead); err != nil {
		return nil, err
	}
	if r.Revision < 0 {
		return nil, toGRPC(fsm.ErrCompactedRevision)
	}
	select {
	case s.hashSlot <- struct{}{}:
	case <-ctx.Done():
		return nil, toGRPC(ctx.Err())
	}
	defer func() { <-s.hashSlot }()
	v := s.front.KVView() // after the wait: the newest state, pinned for the walk only
	if hook := hashWalkHook.Load(); hook != nil {
		(*hook)()
	}
	hash, hashRev, compactRev, err := v.HashKV(uint64(r.Revision))
	if err != nil {
		return nil, toGRPC(err)
	}
	return &pb.HashKVResponse{Header: s.header(v.Revision()), Hash: hash, CompactRevision: int64(compactRev), HashRevision: int64(hashRev)}, nil
}

// Hash implements etcd's Maintenance.Hash for this node: etcd hashes its
// whole backend; Tenure answers the hash of the key-value store and its
// history window at this node's current revision (HashKV at 0).
func (m *maintenanceServer) Hash(ctx context.Context, _ *pb.HashRequest) (*pb.HashResponse, error) {
	resp, err := m.HashKV(ctx, &pb.HashKVRequest{})
	if err != nil {
		return nil, err
	}
	return &pb.HashResponse{Header: resp.Header, Hash: resp.Hash}, nil
}

// hashWalkHook, when set (tests: SetHashWalkHook), runs as a walk of
// HashKV begins, on the goroutine that walks.
var hashWalkHook atomic.Pointer[func()]
