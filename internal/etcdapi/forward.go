package etcdapi

// Forwarding. etcd's clients spread their requests over every endpoint
// they are given and do not retry a write elsewhere, so a follower must
// serve every request: it forwards those that need the leader to the
// leader's etcd API and relays the answer. It finds the leader's address
// in the replicated state (fsm.SetEtcdURL): every member publishes its
// own, the leader by committing it, a follower by sending it to the
// leader, authenticated with a key only members hold (a MAC keyed by the
// cluster's first signing key). A forwarded request carries a mark, and a
// node that receives one while not leading answers "no leader" instead of
// forwarding it on: requests do not bounce between nodes in an election.
//
// Under auth a forwarded request carries its caller's credential: the
// etcd auth token as it came, or the names of the client certificate the
// follower verified. The leader checks the request again; it believes
// forwarded certificate names only on a connection from a member. Over
// TLS a follower dials the leader's etcd API with the peer TLS settings
// (its peer certificate, the peers' CA) and the server name
// forwardServerName, for which the leader's listener answers with its
// peer configuration too (ServerTLS): only members, verified against the
// peers' CA, reach the leader that way.

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"io"
	"net/url"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/server"
	"github.com/tenure-io/tenure/internal/tlsconfig"
)

// Metadata keys of forwarding.
const (
	forwardedKey = "tenure-etcd-forwarded"
	macKey       = "tenure-etcd-mac"
	// forwardedCertKey: the names of a forwarded request's client
	// certificate (binary metadata: names may be any UTF-8).
	forwardedCertKey = "tenure-etcd-cert-bin"
)

// forwardServerName is the TLS server name a member dials another's etcd
// API with to forward a request (ServerTLS, forwardTLS).
const forwardServerName = "tenure-etcd-forward"

// ServerTLS is the TLS configuration of the etcd API's listener: client,
// the client API's, for etcd's clients; with peer TLS (peer not nil), a
// connection that names forwardServerName gets peer's configuration
// instead, which requires a certificate of the peers' CA: a member
// forwarding a request.
func ServerTLS(client *tls.Config, peer func() *tls.Config) *tls.Config {
	return tlsconfig.MemberServer(client, peer, forwardServerName)
}

// forwardTLS is the configuration a member dials host's etcd API with:
// the peer TLS settings, the server name forwardServerName, and the
// server's certificate verified against the peers' CA for host.
func forwardTLS(peer *tls.Config, host string) *tls.Config {
	return tlsconfig.MemberClient(peer, host, forwardServerName)
}

// publishInterval is how often a node checks that the state has its
// address.
const publishInterval = time.Second

// leaderConn is where to forward a request: a connection to the leader's
// etcd API and the context to call it with.
type leaderConn struct {
	conn *grpc.ClientConn
	ctx  context.Context
}

// conns are the connections to other members' etcd APIs, by URL.
type conns struct {
	// peerTLS: see Config.PeerTLS.
	peerTLS func() *tls.Config
	// mu guards m.
	mu sync.Mutex
	m  map[string]*grpc.ClientConn
}

func (c *conns) get(u string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc := c.m[u]; cc != nil {
		return cc, nil
	}
	parsed, err := url.Parse(u)
	if err != nil || parsed.Host == "" {
		return nil, status.Errorf(codes.Unavailable, "etcdserver: the leader's etcd URL %q does not parse", u)
	}
	creds := insecure.NewCredentials()
	if parsed.Scheme == "https" {
		if c.peerTLS == nil || c.peerTLS() == nil {
			return nil, status.Errorf(codes.Unavailable, "etcdserver: the leader's etcd API %s is TLS, and this member has no peer TLS settings to forward with", u)
		}
		creds = credentials.NewTLS(forwardTLS(c.peerTLS(), parsed.Hostname()))
	}
	cc, err := grpc.NewClient(parsed.Host, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "etcdserver: dialing the leader at %s: %v", u, err)
	}
	if c.m == nil {
		c.m = make(map[string]*grpc.ClientConn)
	}
	c.m[u] = cc
	return cc, nil
}

func (c *conns) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cc := range c.m {
		cc.Close()
	}
	c.m = nil
}

// forward returns where to forward a request that needs the leader when
// this node is a follower, or nil when this node leads and serves it.
func (s *Server) forward(ctx context.Context) (*leaderConn, error) {
	if s.front.IsLeader() {
		return nil, nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if len(md.Get(forwardedKey)) > 0 {
		return nil, rpctypes.ErrGRPCNoLeader // the sender took this node for the leader
	}
	leader := s.front.Leader()
	if leader == "" {
		return nil, rpctypes.ErrGRPCNoLeader
	}
	var u string
	s.front.Read(func(st *fsm.State) { u = st.EtcdURL(leader) })
	if u == "" {
		return nil, status.Errorf(codes.Unavailable, "etcdserver: no leader: the leader %s has not published its etcd API address yet", leader)
	}
	cc, err := s.conns.get(u)
	if err != nil {
		return nil, err
	}
	return &leaderConn{conn: cc, ctx: forwardContext(ctx, s.front.NodeID())}, nil
}

// forwardContext is the outgoing context of a request forwarded by member
// self: the forwarding mark and the caller's credential (credential).
func forwardContext(ctx context.Context, self string) context.Context {
	kv := []string{forwardedKey, self}
	md, _ := metadata.FromIncomingContext(ctx)
	if token, ok := tokenOf(md); ok {
		kv = append(kv, rpctypes.TokenFieldNameGRPC, token)
	} else {
		for _, n := range server.CertNames(ctx) {
			kv = append(kv, forwardedCertKey, n)
		}
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
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
func (s *Server) relayKeepAlive(stream pb.Lease_LeaseKeepAliveServer, lc *leaderConn) error {
	ctx, cancel := context.WithCancel(lc.ctx)
	defer cancel()
	up, err := pb.NewLeaseClient(lc.conn).LeaseKeepAlive(ctx)
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

// Run publishes this node's etcd API address in the replicated state, and
// again whenever it is missing or differs, and ends the streams that
// require a leader when the node has none (monitorLeader), until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	defer s.conns.close()
	monitored := make(chan struct{})
	go func() { defer close(monitored); s.monitorLeader(ctx) }()
	defer func() { <-monitored }()
	compacting := make(chan struct{})
	go func() { defer close(compacting); s.autoCompact(ctx) }()
	defer func() { <-compacting }()
	t := time.NewTicker(publishInterval)
	defer t.Stop()
	for {
		s.publish(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// publish makes sure the state has this node's address: the leader
// commits it, a follower sends it to the leader.
func (s *Server) publish(ctx context.Context) {
	self := s.front.NodeID()
	var cur string
	s.front.Read(func(st *fsm.State) { cur = st.EtcdURL(self) })
	if cur == s.cfg.ClientURL {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cmd := &fsmpb.SetEtcdURL{Member: self, Url: s.cfg.ClientURL}
	if s.front.IsLeader() {
		if _, err := s.propose(pctx, cmd); err != nil && ctx.Err() == nil {
			s.log.Warn("publishing the etcd API address", "err", err)
		}
		return
	}
	mac, ok := s.mac(cmd)
	lc, err := s.forward(pctx)
	if !ok || err != nil || lc == nil {
		return // no leader, or no address or key yet: the next round
	}
	err = lc.conn.Invoke(metadata.AppendToOutgoingContext(lc.ctx, macKey, mac), "/"+membersService+"/Publish", cmd, &emptypb.Empty{})
	if err != nil && ctx.Err() == nil {
		s.log.Debug("publishing the etcd API address to the leader", "err", err)
	}
}

// mac authenticates a member's address: an HMAC keyed by the cluster's
// first signing key, which only members hold.
func (s *Server) mac(c *fsmpb.SetEtcdURL) (string, bool) {
	sec := s.front.Security()
	if len(sec.Keys) == 0 {
		return "", false
	}
	key := hmac.New(sha256.New, sec.Keys[0].Seed)
	key.Write([]byte("tenure etcd member url"))
	h := hmac.New(sha256.New, key.Sum(nil))
	h.Write([]byte(c.GetMember()))
	h.Write([]byte{0})
	h.Write([]byte(c.GetUrl()))
	return hex.EncodeToString(h.Sum(nil)), true
}

// membersService is the private service members publish their addresses
// to; only the leader accepts, and only from a member.
const membersService = "tenure.etcdapi.v1.Members"

func (s *Server) registerMembers(gs *grpc.Server) {
	gs.RegisterService(&grpc.ServiceDesc{
		ServiceName: membersService,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Publish",
			Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
				c := &fsmpb.SetEtcdURL{}
				if err := dec(c); err != nil {
					return nil, err
				}
				return &emptypb.Empty{}, s.accept(ctx, c)
			},
		}},
	}, struct{}{})
}

// accept commits a member's address sent by that member.
func (s *Server) accept(ctx context.Context, c *fsmpb.SetEtcdURL) error {
	md, _ := metadata.FromIncomingContext(ctx)
	want, ok := s.mac(c)
	got := md.Get(macKey)
	if !ok || len(got) != 1 || !hmac.Equal([]byte(got[0]), []byte(want)) {
		return status.Error(codes.PermissionDenied, "etcdserver: permission denied: not a member's address")
	}
	if !s.front.IsLeader() {
		return rpctypes.ErrGRPCNotLeader
	}
	ms, err := s.front.Members()
	if err != nil {
		return toGRPC(err)
	}
	for _, m := range ms {
		if m.ID == c.GetMember() {
			_, err := s.propose(ctx, c)
			return toGRPC(err)
		}
	}
	return rpctypes.ErrGRPCMemberNotFound
}
