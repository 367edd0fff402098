package etcdapi

import (
	"context"

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
// this node, never forwarded, and reads every key under the state's
// lock.
func (m *maintenanceServer) HashKV(ctx context.Context, r *pb.HashKVRequest) (*pb.HashKVResponse, error) {
	s := m.s
	if err := s.authorize(ctx, "Maintenance/HashKV", server.ClusterRead); err != nil {
		return nil, err
	}
	if r.Revision < 0 {
		return nil, toGRPC(fsm.ErrCompactedRevision)
	}
	var hash uint32
	var hashRev, compactRev, cur uint64
	var err error
	s.front.Read(func(st *fsm.State) {
		cur = st.Revision()
		hash, hashRev, compactRev, err = st.HashKV(uint64(r.Revision))
	})
	if err != nil {
		return nil, toGRPC(err)
	}
	return &pb.HashKVResponse{Header: s.header(cur), Hash: hash, CompactRevision: int64(compactRev), HashRevision: int64(hashRev)}, nil
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
