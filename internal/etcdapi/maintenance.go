package etcdapi

// etcd's maintenance calls that operators script: Defragment, Snapshot
// and MoveLeader. Under auth each needs cluster write (the rights of
// etcd's root role, which etcd asks of them: IsAdminPermitted), as
// Tenure's own snapshot and transfer-leadership do.

import (
	"context"
	"crypto/sha256"
	"errors"
	"io"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/server"
)

// snapshotSendBytes is the size of the snapshot pieces Snapshot sends:
// well under every etcd client's receive limit.
const snapshotSendBytes = 64 << 10

// Defragment implements etcd's Maintenance.Defragment for this member,
// as etcd's is: it compacts what this node keeps on disk, by taking a
// snapshot of its state now and truncating the raft log the snapshot
// covers (raft keeps its trailing entries for followers a little
// behind). The replicated state, and so every other member, is
// unchanged. A node with nothing new since its last snapshot answers at
// once.
func (m *maintenanceServer) Defragment(ctx context.Context, _ *pb.DefragmentRequest) (*pb.DefragmentResponse, error) {
	s := m.s
	if err := s.authorize(ctx, "Maintenance/Defragment", server.ClusterWrite); err != nil {
		return nil, err
	}
	if err := s.front.CompactLog(ctx); err != nil {
		return nil, toGRPC(err)
	}
	return &pb.DefragmentResponse{Header: s.header(0)}, nil
}

// Snapshot implements etcd's Maintenance.Snapshot: a sealed Tenure
// snapshot of the leader's state (what `tenure snapshot save` writes,
// read after a linearizable barrier; a follower relays the leader's), in
// the frame etcd's clients check (fsm.EtcdFramePadding: zero padding to a
// multiple of 512 bytes, then the SHA-256 of what came before, as the
// last message). `tenure snapshot restore` restores the file etcdctl
// writes. It holds the cluster's private signing keys.
func (m *maintenanceServer) Snapshot(_ *pb.SnapshotRequest, stream pb.Maintenance_SnapshotServer) error {
	s := m.s
	ctx := stream.Context()
	if err := s.authorize(ctx, "Maintenance/Snapshot", server.ClusterWrite); err != nil {
		return err
	}
	if fw, err := s.forward(ctx); err != nil || fw != nil {
		if err != nil {
			return err
		}
		return s.relaySnapshot(stream, fw)
	}
	sealed, err := s.front.SaveSnapshot(ctx)
	if err != nil {
		return toGRPC(err)
	}
	data := append(sealed, make([]byte, fsm.EtcdFramePadding(len(sealed)))...)
	h := sha256.New()
	hdr := s.header(0)
	for sent := 0; sent < len(data); {
		n := min(len(data)-sent, snapshotSendBytes)
		piece := data[sent : sent+n]
		h.Write(piece)
		sent += n
		if err := stream.Send(&pb.SnapshotResponse{Header: hdr, RemainingBytes: uint64(len(data) - sent), Blob: piece}); err != nil {
			return err
		}
		hdr = nil // in the first message only
	}
	return stream.Send(&pb.SnapshotResponse{Blob: h.Sum(nil)})
}

// relaySnapshot relays the leader's snapshot stream.
func (s *Server) relaySnapshot(stream pb.Maintenance_SnapshotServer, lc *leaderConn) error {
	up, err := pb.NewMaintenanceClient(lc.conn).Snapshot(lc.ctx, &pb.SnapshotRequest{})
	if err != nil {
		return err
	}
	for {
		resp, err := up.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if resp.Header != nil {
			resp.Header.MemberId = s.memberID
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// MoveLeader implements etcd's Maintenance.MoveLeader: the leader hands
// its leadership to the voter whose etcd member id is the target
// (MemberID), as `tenure member transfer-leadership` does, and answers
// once it no longer leads. A follower forwards it to the leader. A target
// that is no voter of the configuration is etcd's "bad leader
// transferee"; the leader itself is answered at once, as etcd does.
func (m *maintenanceServer) MoveLeader(ctx context.Context, r *pb.MoveLeaderRequest) (*pb.MoveLeaderResponse, error) {
	s := m.s
	if err := s.authorize(ctx, "Maintenance/MoveLeader", server.ClusterWrite); err != nil {
		return nil, err
	}
	if fw, err := s.forward(ctx); err != nil || fw != nil {
		if err != nil {
			return nil, err
		}
		resp, err := pb.NewMaintenanceClient(fw.conn).MoveLeader(fw.ctx, r)
		return relay(s, resp, err)
	}
	ms, err := s.front.Members()
	if err != nil {
		return nil, toGRPC(err)
	}
	target := ""
	for _, mb := range ms {
		if mb.Voter && MemberID(mb.ID) == r.TargetID {
			target = mb.ID
		}
	}
	switch {
	case target == "":
		return nil, rpctypes.ErrGRPCBadLeaderTransferee
	case target == s.front.NodeID():
		return &pb.MoveLeaderResponse{Header: s.header(0)}, nil
	}
	if _, err := s.front.TransferLeadership(ctx, target); err != nil {
		return nil, toGRPC(err)
	}
	return &pb.MoveLeaderResponse{Header: s.header(0)}, nil
}
