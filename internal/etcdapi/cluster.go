package etcdapi

import (
	"context"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/version"

	"github.com/tenure-io/tenure/internal/fsm"
)

// clusterServer is etcd's Cluster service: the members are the raft
// configuration's; changes go through Tenure's own API (tenure member).
type clusterServer struct {
	pb.UnimplementedClusterServer
	s *Server
}

// members lists the raft configuration as etcd members: the id derived
// from the node id (MemberID), the node id as name, the raft peer address
// as peer URL and the member's etcd API as client URL, where it is known.
func (s *Server) members() ([]*pb.Member, error) {
	ms, err := s.front.Members()
	if err != nil {
		return nil, toGRPC(err)
	}
	urls := s.clientURLs()
	out := make([]*pb.Member, 0, len(ms))
	for _, m := range ms {
		pm := &pb.Member{ID: MemberID(m.ID), Name: m.ID, IsLearner: !m.Voter}
		u := urls[m.ID]
		if strings.Contains(m.PeerAddr, ":") {
			pm.PeerURLs = []string{"tcp://" + m.PeerAddr}
		} else if u != "" {
			// A standalone node has no peer address: its peer URL is
			// its client URL (etcd's clients expect one).
			pm.PeerURLs = []string{u}
		}
		if u != "" {
			pm.ClientURLs = []string{u}
		}
		out = append(out, pm)
	}
	return out, nil
}

// clientURLs maps node ids to their etcd client URLs: those the members
// published (forward.go), and this node's own.
func (s *Server) clientURLs() map[string]string {
	var urls map[string]string
	s.front.Read(func(st *fsm.State) { urls = st.EtcdURLs() })
	urls[s.front.NodeID()] = s.cfg.ClientURL
	return urls
}

// MemberList implements etcd's Cluster.MemberList, from this node's view
// of the raft configuration.
func (c *clusterServer) MemberList(ctx context.Context, _ *pb.MemberListRequest) (*pb.MemberListResponse, error) {
	if err := c.s.authorize(ctx, "Cluster/MemberList"); err != nil {
		return nil, err // any known caller may list the members, as in etcd
	}
	ms, err := c.s.members()
	if err != nil {
		return nil, err
	}
	return &pb.MemberListResponse{Header: c.s.header(0), Members: ms}, nil
}

// MemberAdd implements etcd's Cluster.MemberAdd: not supported.
func (c *clusterServer) MemberAdd(context.Context, *pb.MemberAddRequest) (*pb.MemberAddResponse, error) {
	return nil, errUnsupported("changing members through the etcd API (use tenure member)")
}

// MemberRemove implements etcd's Cluster.MemberRemove: not supported.
func (c *clusterServer) MemberRemove(context.Context, *pb.MemberRemoveRequest) (*pb.MemberRemoveResponse, error) {
	return nil, errUnsupported("changing members through the etcd API (use tenure member)")
}

// MemberUpdate implements etcd's Cluster.MemberUpdate: not supported.
func (c *clusterServer) MemberUpdate(context.Context, *pb.MemberUpdateRequest) (*pb.MemberUpdateResponse, error) {
	return nil, errUnsupported("changing members through the etcd API (use tenure member)")
}

// MemberPromote implements etcd's Cluster.MemberPromote: not supported.
func (c *clusterServer) MemberPromote(context.Context, *pb.MemberPromoteRequest) (*pb.MemberPromoteResponse, error) {
	return nil, errUnsupported("changing members through the etcd API (use tenure member)")
}

// maintenanceServer is etcd's Maintenance service: Status and Alarm
// here, Defragment, Snapshot and MoveLeader in maintenance.go.
type maintenanceServer struct {
	pb.UnimplementedMaintenanceServer
	s *Server
}

// Status implements etcd's Maintenance.Status for this node: the etcd
// API version it implements, the size of its data directory (db_size)
// and of the part of it a restart reads (db_size_in_use: the raft log
// and the newest snapshot; Defragment shrinks it), its leader, and
// raft's index and term.
func (m *maintenanceServer) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	s := m.s
	if err := s.authorize(ctx, "Maintenance/Status"); err != nil {
		return nil, err
	}
	st := s.front.RaftStats()
	out := &pb.StatusResponse{
		Header: s.header(0), Version: version.Version, DbSize: s.front.DataSize(), DbSizeInUse: s.front.DataSizeInUse(),
		RaftIndex: st.LastIndex, RaftTerm: st.Term, RaftAppliedIndex: st.AppliedIndex,
	}
	if l := s.front.Leader(); l != "" {
		out.Leader = MemberID(l)
	}
	if ms, err := s.front.Members(); err == nil {
		for _, mb := range ms {
			if mb.ID == s.front.NodeID() {
				out.IsLearner = !mb.Voter
			}
		}
	}
	if e := s.front.StorageError(); e != "" {
		out.Errors = []string{e}
	}
	return out, nil
}

// Alarm implements etcd's Maintenance.Alarm: Tenure raises no alarms, so
// every action answers an empty list (and etcdctl endpoint health finds
// the node healthy).
func (m *maintenanceServer) Alarm(ctx context.Context, _ *pb.AlarmRequest) (*pb.AlarmResponse, error) {
	if err := m.s.authorize(ctx, "Maintenance/Alarm"); err != nil {
		return nil, err
	}
	return &pb.AlarmResponse{Header: m.s.header(0), Alarms: []*pb.AlarmMember{}}, nil
}
