package server

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/emptypb"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// The members' Tenure API addresses. Each member publishes where clients
// reach it (WithClientAddr) into the replicated state (fsm's
// SetClientAddr): the leader commits its own; a follower sends its own to
// the leader's Tenure API, on a private method that only the leader
// accepts and only with an HMAC keyed by the cluster's signing key, which
// only members hold. From the state, MemberList reports every member's
// address (so a client given one endpoint finds the others), and a
// member that answers NOT_LEADER names the leader's (pb.Error's
// leader_addr), so that the client goes there at once.

// clientAddrs is a member's side of publishing its address.
type clientAddrs struct {
	// addr is where clients reach this member ("": it publishes none).
	addr string
	// dial returns the options a follower dials the leader's Tenure API
	// at addr with, to publish its address; nil: it does not (its address
	// is then committed only while it leads).
	dial func(addr string) []grpc.DialOption

	// mu guards the connection to the leader.
	mu       sync.Mutex
	conn     *grpc.ClientConn
	connAddr string
}

// WithClientAddr makes the member publish addr (host:port) as its Tenure
// API's address for clients. dial returns the gRPC options a follower
// dials the leader's Tenure API at an address with, to publish it (nil: a
// follower does not send it; a member's address is then known from the
// first time it leads).
func WithClientAddr(addr string, dial func(addr string) []grpc.DialOption) Option {
	return func(s *Server) { s.clientAddrs.addr, s.clientAddrs.dial = addr, dial }
}

// publishEvery is how often a member checks that the state has its
// address.
const publishEvery = time.Second

// memberService is the private service members publish their addresses
// to.
const memberService = "tenure.server.v1.Members"

// memberMACKey is the metadata key of a published address's HMAC.
const memberMACKey = "tenure-member-mac"

// PublishClientAddr keeps this member's address (WithClientAddr) in the
// replicated state until ctx ends: it checks every second and, when the
// state has none or another one, commits it (leader) or sends it to the
// leader (follower). It returns at once without an address.
func (s *Server) PublishClientAddr(ctx context.Context) {
	a := &s.clientAddrs
	if a.addr == "" {
		return
	}
	defer func() {
		a.mu.Lock()
		if a.conn != nil {
			a.conn.Close()
			a.conn = nil
		}
		a.mu.Unlock()
	}()
	t := time.NewTicker(publishEvery)
	defer t.Stop()
	for {
		if err := s.publishClientAddr(ctx); err != nil && ctx.Err() == nil {
			s.log.Debug("publishing the client address", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// publishClientAddr is one round of PublishClientAddr.
func (s *Server) publishClientAddr(ctx context.Context) error {
	a := &s.clientAddrs
	self, leader := s.node.ID(), s.node.Leader()
	var cur, leaderAddr string
	s.node.Read(func(st *fsm.State) { cur, leaderAddr = st.ClientAddr(self), st.ClientAddr(leader) })
	if cur == a.addr {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cmd := &fsmpb.SetEtcdURL{Member: self, Url: a.addr}
	if s.node.IsLeader() {
		_, err := s.proposeOp(pctx, setClientAddr{cmd})
		return err
	}
	mac, ok := s.memberMAC(cmd)
	if !ok || a.dial == nil || leaderAddr == "" || leader == self {
		return nil // no key, no way or no leader to send it to yet: the next round
	}
	cc, err := a.leaderConn(leaderAddr)
	if err != nil {
		return err
	}
	return cc.Invoke(metadata.AppendToOutgoingContext(pctx, memberMACKey, mac), "/"+memberService+"/PublishClientAddr", cmd, &emptypb.Empty{})
}

// leaderConn is a connection to the leader's Tenure API at addr, kept
// while the leader stays there.
func (a *clientAddrs) leaderConn(addr string) (*grpc.ClientConn, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn != nil && a.connAddr == addr {
		return a.conn, nil
	}
	if a.conn != nil {
		a.conn.Close()
		a.conn = nil
	}
	cc, err := grpc.NewClient(addr, a.dial(addr)...)
	if err != nil {
		return nil, err
	}
	a.conn, a.connAddr = cc, addr
	return cc, nil
}

// memberMAC authenticates a member's address: an HMAC keyed by the
// cluster's first signing key, which only members hold (false: no key
// yet).
func (s *Server) memberMAC(c *fsmpb.SetEtcdURL) (string, bool) {
	sec := s.node.Security()
	if sec == nil || len(sec.Keys) == 0 {
		return "", false
	}
	key := hmac.New(sha256.New, sec.Keys[0].Seed)
	key.Write([]byte("tenure member client address"))
	h := hmac.New(sha256.New, key.Sum(nil))
	h.Write([]byte(c.GetMember()))
	h.Write([]byte{0})
	h.Write([]byte(c.GetUrl()))
	return hex.EncodeToString(h.Sum(nil)), true
}

// registerMembers registers the private service on gs. It is outside the
// ACLs (no identity: the HMAC proves a member sent it) and answers only
// on the leader.
func (s *Server) registerMembers(gs grpc.ServiceRegistrar) {
	gs.RegisterService(&grpc.ServiceDesc{
		ServiceName: memberService,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "PublishClientAddr",
			Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
				c := &fsmpb.SetEtcdURL{}
				if err := dec(c); err != nil {
					return nil, status.Error(codes.InvalidArgument, "server: a member address that does not decode")
				}
				return &emptypb.Empty{}, s.acceptClientAddr(ctx, c)
			},
		}},
	}, struct{}{})
}

// acceptClientAddr commits a member's address sent by that member.
func (s *Server) acceptClientAddr(ctx context.Context, c *fsmpb.SetEtcdURL) error {
	md, _ := metadata.FromIncomingContext(ctx)
	want, ok := s.memberMAC(c)
	got := md.Get(memberMACKey)
	if !ok || len(got) != 1 || !hmac.Equal([]byte(got[0]), []byte(want)) {
		return toStatus(fsm.ErrPermissionDenied)
	}
	ms, err := s.node.Members()
	if err != nil {
		return toStatus(err)
	}
	for _, m := range ms {
		if m.ID == c.GetMember() {
			_, err := s.proposeOp(ctx, setClientAddr{c})
			return toStatus(err)
		}
	}
	return toStatus(fsm.ErrInvalid)
}

// leaderClientAddr is the leader's Tenure API address, as far as this
// member knows it ("" unknown, or no leader).
func (s *Server) leaderClientAddr() string {
	leader := s.node.Leader()
	if leader == "" {
		return ""
	}
	var addr string
	s.node.Read(func(st *fsm.State) { addr = st.ClientAddr(leader) })
	return addr
}

// hintLeader adds the leader's address to a NOT_LEADER answer of a unary
// call (pb.Error's leader_addr), when this member knows it.
func (s *Server) hintLeader(err error) error {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return err
	}
	p := st.Proto()
	for i, d := range p.GetDetails() {
		var e pb.Error
		if d.UnmarshalTo(&e) != nil || e.GetReason() != pb.ErrorReason_ERROR_REASON_NOT_LEADER || e.GetLeaderAddr() != "" {
			continue
		}
		if e.LeaderAddr = s.leaderClientAddr(); e.LeaderAddr == "" {
			return err
		}
		hinted, aerr := anypb.New(&e)
		if aerr != nil {
			return err
		}
		p.Details[i] = hinted
		return status.FromProto(p).Err()
	}
	return err
}

// hintLeaderProto adds the leader's address to a NOT_LEADER answer on a
// session stream.
func (s *Server) hintLeaderProto(e *pb.Error) {
	if e.GetReason() == pb.ErrorReason_ERROR_REASON_NOT_LEADER && e.GetLeaderAddr() == "" {
		e.LeaderAddr = s.leaderClientAddr()
	}
}
