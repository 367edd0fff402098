package etcdapi

import (
	"context"
	"errors"
	"io"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/server"
)

// leaseServer is etcd's Lease service. A lease is a Tenure session
// created as an etcd lease; anyone who knows its id may keep it alive,
// revoke it or attach keys to it, as in etcd.
type leaseServer struct {
	pb.UnimplementedLeaseServer
	s *Server
}

// checkLease answers whether id is a live etcd lease on this node.
func (s *Server) checkLease(id int64) error {
	if id <= 0 {
		return rpctypes.ErrGRPCLeaseNotFound
	}
	var err error
	s.front.Read(func(st *fsm.State) { err = st.CheckEtcdLease(uint64(id)) })
	return toGRPC(err)
}

// LeaseGrant implements etcd's Lease.LeaseGrant. The id is Tenure's (the
// revision of the grant); a client may not choose it. The TTL is raised
// to MinLeaseTTL and refused above MaxLeaseTTL, as etcd does.
func (l *leaseServer) LeaseGrant(ctx context.Context, r *pb.LeaseGrantRequest) (*pb.LeaseGrantResponse, error) {
	s := l.s
	if r.TTL > MaxLeaseTTL {
		return nil, rpctypes.ErrGRPCLeaseTTLTooLarge
	}
	if r.ID != 0 {
		return nil, status.Error(codes.InvalidArgument, "etcdserver: Tenure assigns lease IDs; grant a lease with ID 0 (see docs/etcd.md)")
	}
	if err := s.authorize(ctx, "Lease/LeaseGrant", leaseWrite); err != nil {
		return nil, err
	}
	if fw, err := s.forward(ctx); err != nil || fw != nil {
		if err != nil {
			return nil, err
		}
		resp, err := pb.NewLeaseClient(fw.conn).LeaseGrant(fw.ctx, r)
		return relay(s, resp, err)
	}
	ttl := max(r.TTL, MinLeaseTTL)
	owner := "etcd"
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		owner = "etcd " + p.Addr.String()
	}
	res, err := s.propose(ctx, &fsmpb.CreateSession{Owner: owner, TtlMs: ttl * 1000, EtcdLease: true})
	if err != nil {
		return nil, toGRPC(err)
	}
	return &pb.LeaseGrantResponse{Header: s.header(res.Revision), ID: int64(res.Session), TTL: ttl}, nil
}

// LeaseRevoke implements etcd's Lease.LeaseRevoke: the lease ends and its
// keys are deleted, at one revision.
func (l *leaseServer) LeaseRevoke(ctx context.Context, r *pb.LeaseRevokeRequest) (*pb.LeaseRevokeResponse, error) {
	s := l.s
	if err := s.authorize(ctx, "Lease/LeaseRevoke", leaseWrite); err != nil {
		return nil, err
	}
	if fw, err := s.forward(ctx); err != nil || fw != nil {
		if err != nil {
			return nil, err
		}
		resp, err := pb.NewLeaseClient(fw.conn).LeaseRevoke(fw.ctx, r)
		return relay(s, resp, err)
	}
	if err := s.checkLease(r.ID); err != nil {
		return nil, err
	}
	// Revoking a lease deletes its keys: as etcd does, the caller needs
	// write on each of them.
	if err := s.authorizeLeaseKeys(ctx, "Lease/LeaseRevoke", r.ID, fsm.AccessWrite); err != nil {
		return nil, err
	}
	res, err := s.propose(ctx, &fsmpb.CloseSession{Session: uint64(r.ID)})
	if err != nil {
		return nil, toGRPC(err)
	}
	return &pb.LeaseRevokeResponse{Header: s.header(res.Revision)}, nil
}

// authorizeLeaseKeys checks that the caller has need on every key bound
// to lease id (nil when auth is off).
func (s *Server) authorizeLeaseKeys(ctx context.Context, method string, id int64, need fsm.Access) error {
	if !s.srv.AuthEnforced() || id <= 0 {
		return nil
	}
	var keys []string
	s.front.Read(func(st *fsm.State) { keys = st.SessionKeys(uint64(id)) })
	rights := make([]server.Right, len(keys))
	for i, k := range keys {
		rights[i] = spanRight([]byte(k), nil, need)
	}
	return s.authorize(ctx, method, rights...)
}

// renew keeps lease id alive on the leader and returns its TTL in
// seconds; 0 for a lease that does not exist, as etcd answers.
func (s *Server) renew(ctx context.Context, id int64) (int64, error) {
	if s.checkLease(id) != nil {
		return 0, nil
	}
	ttl, err := s.front.KeepAlive(ctx, uint64(id))
	switch {
	case errors.Is(err, fsm.ErrSessionNotFound):
		return 0, nil
	case err != nil:
		return 0, toGRPC(err)
	}
	return int64(ttl / time.Second), nil
}

// LeaseKeepAlive implements etcd's Lease.LeaseKeepAlive: one answer per
// request, in order, with the lease's TTL, or TTL 0 for a lease that does
// not exist. On a follower the stream is relayed to the leader.
func (l *leaseServer) LeaseKeepAlive(stream pb.Lease_LeaseKeepAliveServer) error {
	s := l.s
	ctx := stream.Context()
	// The caller's credential is kept, and checked again before every
	// renewal and every revokeCheckInterval: a revoked token or a changed
	// policy ends the stream with "permission denied" (on a follower, the
	// leader's end of the relayed stream ends it).
	cred := credentialOf(ctx)
	if err := s.authorizeCred(ctx, cred, "Lease/LeaseKeepAlive", leaseWrite); err != nil {
		return err
	}
	if fw, err := s.forward(ctx); err != nil || fw != nil {
		if err != nil {
			return err
		}
		return s.relayKeepAlive(stream, fw)
	}
	// aclChanged closes at the next change of the node's ACLs: the
	// caller's right is checked again then, and before every renewal.
	aclChanged := s.srv.ACLChanged()
	// Requests are read on a goroutine of their own, so that the stream
	// ends when its context does (a stream that requires a leader is
	// ended when the node has none), not at the next request.
	reqs := make(chan *pb.LeaseKeepAliveRequest)
	recvErr := make(chan error, 1)
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reqs <- req:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		var req *pb.LeaseKeepAliveRequest
		select {
		case req = <-reqs:
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-aclChanged:
			aclChanged = s.srv.ACLChanged() // first, so that no change is missed
			if err := s.stillAllowed(ctx, cred, "Lease/LeaseKeepAlive", leaseWrite); err != nil {
				return err
			}
			continue
		}
		if err := s.stillAllowed(ctx, cred, "Lease/LeaseKeepAlive", leaseWrite); err != nil {
			return err
		}
		// The header first, as etcd: its revision is no later than the
		// renewal.
		resp := &pb.LeaseKeepAliveResponse{ID: req.ID, Header: s.header(0)}
		ttl, err := s.renew(ctx, req.ID)
		if err != nil {
			return err
		}
		resp.TTL = ttl
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// LeaseTimeToLive implements etcd's Lease.LeaseTimeToLive: the seconds
// left and granted, and with keys the lease's keys; TTL -1 for a lease
// that does not exist. Only the leader times leases.
func (l *leaseServer) LeaseTimeToLive(ctx context.Context, r *pb.LeaseTimeToLiveRequest) (*pb.LeaseTimeToLiveResponse, error) {
	s := l.s
	if err := s.authorize(ctx, "Lease/LeaseTimeToLive", leaseWrite); err != nil {
		return nil, err
	}
	if fw, err := s.forward(ctx); err != nil || fw != nil {
		if err != nil {
			return nil, err
		}
		resp, err := pb.NewLeaseClient(fw.conn).LeaseTimeToLive(fw.ctx, r)
		return relay(s, resp, err)
	}
	if err := s.linearizable(ctx); err != nil {
		return nil, toGRPC(err)
	}
	out := &pb.LeaseTimeToLiveResponse{ID: r.ID, TTL: -1}
	var (
		granted int64
		found   bool
		keys    []string
		rev     uint64
	)
	s.front.Read(func(st *fsm.State) {
		rev = st.Revision()
		if r.ID > 0 {
			granted, found = st.EtcdLease(uint64(r.ID))
		}
		if found && r.Keys {
			keys = st.SessionKeys(uint64(r.ID))
		}
	})
	out.Header = s.header(rev)
	if !found {
		return out, nil
	}
	if r.Keys {
		// The keys' names are answered: as etcd does, the caller needs
		// read on each of them.
		if err := s.authorizeLeaseKeys(ctx, "Lease/LeaseTimeToLive", r.ID, fsm.AccessRead); err != nil {
			return nil, err
		}
	}
	out.GrantedTTL, out.TTL = granted/1000, granted/1000
	if left, ok := s.front.SessionsTimeLeft([]uint64{uint64(r.ID)}); ok && left[0] >= 0 {
		out.TTL = int64(left[0] / time.Second)
	}
	for _, k := range keys {
		out.Keys = append(out.Keys, []byte(k))
	}
	return out, nil
}

// LeaseLeases implements etcd's Lease.LeaseLeases: every etcd lease, from
// this node's state.
func (l *leaseServer) LeaseLeases(ctx context.Context, _ *pb.LeaseLeasesRequest) (*pb.LeaseLeasesResponse, error) {
	s := l.s
	if err := s.authorize(ctx, "Lease/LeaseLeases", leaseRead); err != nil {
		return nil, err
	}
	out := &pb.LeaseLeasesResponse{Leases: []*pb.LeaseStatus{}}
	var rev uint64
	s.front.Read(func(st *fsm.State) {
		rev = st.Revision()
		for _, id := range st.EtcdLeases() {
			out.Leases = append(out.Leases, &pb.LeaseStatus{ID: int64(id)})
		}
	})
	out.Header = s.header(rev)
	return out, nil
}
