package server

import (
	"context"
	"fmt"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/node"
)

func (s *Server) members() (*pb.MemberListResponse, error) {
	ms, err := s.node.Members()
	if err != nil {
		return nil, toStatus(err)
	}
	out := &pb.MemberListResponse{}
	for _, m := range ms {
		out.Members = append(out.Members, &pb.Member{Id: m.ID, PeerAddr: m.PeerAddr, Voter: m.Voter, Leader: m.Leader})
	}
	return out, nil
}

func voters(ms []node.Member) int {
	n := 0
	for _, m := range ms {
		if m.Voter {
			n++
		}
	}
	return n
}

// evenRefusal explains why an even number of voters is refused.
func evenRefusal(after int) error {
	return fmt.Errorf("%w: the change leaves %d voters; an even number tolerates no more failures than one fewer voter but needs a larger quorum (use --force to do it anyway)", fsm.ErrInvalid, after)
}

// MemberList implements pb.TenureServer.
func (s *Server) MemberList(ctx context.Context, _ *pb.MemberListRequest) (*pb.MemberListResponse, error) {
	return s.members()
}

// MemberAdd implements pb.TenureServer.
func (s *Server) MemberAdd(ctx context.Context, req *pb.MemberAddRequest) (*pb.MemberListResponse, error) {
	if req.GetId() == "" || req.GetPeerAddr() == "" {
		return nil, toStatus(fmt.Errorf("%w: member add needs an id and a peer address", fsm.ErrInvalid))
	}
	ms, err := s.node.Members()
	if err != nil {
		return nil, toStatus(err)
	}
	after := voters(ms) + 1
	for _, m := range ms {
		if m.ID == req.GetId() && m.Voter {
			after--
		}
	}
	if after%2 == 0 && !req.GetForce() {
		return nil, toStatus(evenRefusal(after))
	}
	if err := s.node.AddVoter(ctx, req.GetId(), req.GetPeerAddr()); err != nil {
		return nil, toStatus(err)
	}
	return s.members()
}

// MemberRemove implements pb.TenureServer.
func (s *Server) MemberRemove(ctx context.Context, req *pb.MemberRemoveRequest) (*pb.MemberListResponse, error) {
	ms, err := s.node.Members()
	if err != nil {
		return nil, toStatus(err)
	}
	found := false
	for _, m := range ms {
		found = found || m.ID == req.GetId()
	}
	if !found {
		return nil, toStatus(fmt.Errorf("%w: no member %q", fsm.ErrInvalid, req.GetId()))
	}
	if after := voters(ms) - 1; after%2 == 0 && after > 0 && !req.GetForce() {
		return nil, toStatus(evenRefusal(after))
	}
	if err := s.node.RemoveServer(ctx, req.GetId()); err != nil {
		return nil, toStatus(err)
	}
	return s.members()
}
