// Package etcdapi serves etcd's v3 gRPC API (go.etcd.io/etcd/api/v3) on a
// Tenure node, beside Tenure's own API, so that etcdctl, clientv3's
// concurrency package and etcd's clients in other languages run against
// Tenure unmodified.
//
// # The mapping
//
// Keys are the keys of Tenure's key-value store, with their create
// revision, mod revision and version; etcd's revision is Tenure's global
// revision, so an etcd Mutex's fence (its key's create revision) compares
// directly with Tenure's lock tokens. Leases are Tenure sessions created
// as etcd leases (fsm.CheckEtcdLease): they have no secret, because etcd's
// model is that a lease's id is all a client needs to keep it alive,
// revoke it or attach keys to it; and for the same reason they are apart
// from Tenure's own sessions: the etcd API reaches no session that has a
// secret, and Tenure's API none that has not.
//
// Requests that must reach the leader (writes, linearizable reads,
// keepalives, TimeToLive) are forwarded by a follower to the leader's etcd
// API (forward.go), because etcd's clients do not retry a write on
// another member. Watches are served by the node that receives them, from
// its own watch history (server.KVCursor), as etcd serves them, and from
// the state machine's history window (fsm/kvhistory.go) for the revisions
// the watch history no longer holds (watch.go, history.go).
//
// The same listener serves etcd's JSON gateway, /version and /health
// beside gRPC (listen.go, gateway.go); the gateway is a client of the
// same gRPC server, so its requests meet every check gRPC's do.
//
// Errors are etcd's (rpctypes), mapped in one place (errors.go). What is
// not supported, and where Tenure differs, is listed in docs/etcd.md.
package etcdapi

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/server"
)

// Etcd's lease TTL bounds, in seconds: a shorter TTL is raised to
// MinLeaseTTL without a word (etcd's minimum with its default election
// timeout), a longer one than MaxLeaseTTL is refused with etcd's error.
const (
	MinLeaseTTL = 2
	MaxLeaseTTL = 9_000_000_000
)

// maxRequestBytes is etcd's default request size limit plus its gRPC
// overhead: a watch response above it is split for a watcher that asked
// for fragments, and a request above it is refused.
const maxRequestBytes = 1.5*1024*1024 + 512*1024

// streamWorkers is how many goroutines serve requests (GRPCOptions): about
// as many as the requests a busy client has open at once; beyond them, a
// request gets a goroutine of its own.
const streamWorkers = 64

// Config configures the etcd API of one node.
type Config struct {
	// ClientURL is how etcd clients reach this node's etcd API (as
	// MemberList reports it), e.g. http://127.0.0.1:2379.
	ClientURL string
	// Logger receives the API's log; nil: the server's.
	Logger *slog.Logger
	// PeerTLS, when the members' etcd APIs serve TLS, is the node's peer
	// TLS configuration (node.Config.PeerTLS): a follower forwards to the
	// leader's etcd API with it (forward.go).
	PeerTLS func() *tls.Config
	// MaxResponseBytes bounds one answer (the keys and values of a Range,
	// of every range of a Txn together, of a DeleteRange's previous
	// values), decided before it is built; 0: DefaultMaxResponseBytes.
	MaxResponseBytes int
	// AutoCompaction is etcd's automatic compaction of the history of
	// past revisions, run by the leader (history.go); zero: none.
	AutoCompaction AutoCompaction
}

// DefaultMaxResponseBytes is the default Config.MaxResponseBytes: well
// under gRPC's message limits and etcd's clients' receive limit.
const DefaultMaxResponseBytes = 8 << 20

// Server serves etcd's KV, Watch, Lease, Cluster and Maintenance services.
// It is safe for concurrent use.
type Server struct {
	front    server.Front // every request reaches the node through it
	srv      *server.Server
	cfg      Config
	log      *slog.Logger
	limits   server.KVLimits
	memberID uint64
	conns    conns // to the leader, for forwarding (forward.go)
	// leaderStreams: the open streams that require a leader.
	leaderStreams leaderStreams
	// roleMu serialises this node's changes of a role's permissions (a
	// read of the policy, then its replacement: users.go).
	roleMu sync.Mutex
	// hashSlot holds a token while a HashKV walks (hash.go): one walk at
	// a time on this node.
	hashSlot chan struct{}
}

// New returns the etcd API of the node whose Tenure API is srv: it
// reaches the node only through srv (Server.Front), and the watch
// history, the watch limits and the key-value limits are srv's.
func New(srv *server.Server, cfg Config) *Server {
	front := srv.Front()
	if cfg.Logger == nil {
		cfg.Logger = front.Logger()
	}
	if cfg.MaxResponseBytes <= 0 {
		cfg.MaxResponseBytes = DefaultMaxResponseBytes
	}
	return &Server{front: front, srv: srv, cfg: cfg, log: cfg.Logger, limits: srv.KVLimits(), memberID: MemberID(front.NodeID()), conns: conns{peerTLS: cfg.PeerTLS},
		hashSlot: make(chan struct{}, 1)}
}

// GRPCOptions are the options of the gRPC server the API is registered
// on and Serve serves: the transport credentials of Serve's listener
// (which does the TLS handshake itself), etcd's request size, keepalive pings as often as etcdctl sends them
// (every 2 s by default), and etcd's check of a request that requires a
// leader (clientv3.WithRequireLeader): on a node that knows no leader it
// is refused with "no leader".
func (s *Server) GRPCOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		// Serve does any TLS handshake; these report it (listen.go).
		grpc.Creds(connCreds{}),
		grpc.MaxRecvMsgSize(maxRequestBytes),
		// Fixed flow-control windows, as on Tenure's own API
		// (server.GRPCOptions): gRPC's dynamic window is sized by ping
		// probes, about one per round trip on a busy connection, for
		// windows etcd's small messages never need.
		grpc.InitialWindowSize(1 << 20), grpc.InitialConnWindowSize(1 << 24),
		// Handlers run on long-lived workers, whose stacks have grown
		// already, rather than each on a new goroutine that grows its
		// stack again (a copy on every request).
		grpc.NumStreamWorkers(streamWorkers),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second, PermitWithoutStream: true}),
		grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
			start := time.Now()
			defer func() { s.srv.Answered(methodLabel(info.FullMethod), err, true, time.Since(start)) }()
			if err := s.requireLeader(ctx); err != nil {
				return nil, err
			}
			return handler(ctx, req)
		}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
			defer func() { s.srv.Answered(methodLabel(info.FullMethod), err, false, 0) }()
			if err := s.requireLeader(ss.Context()); err != nil {
				return err
			}
			if !requiresLeader(ss.Context()) {
				return handler(srv, ss)
			}
			// A stream that requires a leader is ended with "no leader"
			// once this node has known none for a while (Run), as etcd
			// does: its client then goes on at another endpoint.
			ctx, cancel := context.WithCancelCause(ss.Context())
			defer cancel(nil)
			forget := s.leaderStreams.add(cancel)
			defer forget()
			err = handler(srv, &ctxStream{ServerStream: ss, ctx: ctx})
			if errors.Is(context.Cause(ctx), rpctypes.ErrGRPCNoLeader) {
				return rpctypes.ErrGRPCNoLeader
			}
			return err
		}),
	}
}

// methodLabel is the method label of an etcd API request in Tenure's
// metrics: "etcd." and the method, such as etcd.KV/Range (etcd's gRPC
// services name a fixed set of methods).
func methodLabel(fullMethod string) string {
	return "etcd." + strings.TrimPrefix(fullMethod, "/etcdserverpb.")
}

// requiresLeader reports whether a request requires a leader
// (clientv3.WithRequireLeader: the hasleader metadata).
func requiresLeader(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	ks := md[rpctypes.MetadataRequireLeaderKey]
	return len(ks) > 0 && ks[0] == rpctypes.MetadataHasLeader
}

// ctxStream is a server stream with a context of its own.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (c *ctxStream) Context() context.Context { return c.ctx }

// Watching for the loss of the leader: how often, and after how many
// checks in a row that find none the streams that require a leader end
// (etcd: three election timeouts).
const (
	leaderCheckInterval = 500 * time.Millisecond
	maxNoLeaderChecks   = 3
)

// leaderStreams are the open streams that require a leader, by the
// function that ends each one.
type leaderStreams struct {
	// mu guards m and next.
	mu   sync.Mutex
	m    map[uint64]context.CancelCauseFunc
	next uint64
}

func (l *leaderStreams) add(cancel context.CancelCauseFunc) (forget func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = make(map[uint64]context.CancelCauseFunc)
	}
	l.next++
	id := l.next
	l.m[id] = cancel
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		delete(l.m, id)
	}
}

// endAll ends every stream that requires a leader with err.
func (l *leaderStreams) endAll(err error) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, cancel := range l.m {
		cancel(err)
	}
	return len(l.m)
}

// monitorLeader ends the streams that require a leader once this node has
// known no leader for maxNoLeaderChecks checks in a row, until ctx ends.
func (s *Server) monitorLeader(ctx context.Context) {
	t := time.NewTicker(leaderCheckInterval)
	defer t.Stop()
	none := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.front.Leader() != "" {
			none = 0
			continue
		}
		if none++; none >= maxNoLeaderChecks {
			if n := s.leaderStreams.endAll(rpctypes.ErrGRPCNoLeader); n > 0 {
				s.log.Warn("no leader: ended the etcd streams that require one", "streams", n)
			}
		}
	}
}

// requireLeader refuses a request that requires a leader when this node
// knows none (a stream is checked when it opens, and ended later if the
// node loses its leader: see monitorLeader).
func (s *Server) requireLeader(ctx context.Context) error {
	if requiresLeader(ctx) && s.front.Leader() == "" {
		return rpctypes.ErrGRPCNoLeader
	}
	return nil
}

// Register registers the API's services on gs.
func (s *Server) Register(gs *grpc.Server) {
	pb.RegisterKVServer(gs, &kvServer{s: s})
	pb.RegisterWatchServer(gs, &watchServer{s: s})
	pb.RegisterLeaseServer(gs, &leaseServer{s: s})
	pb.RegisterClusterServer(gs, &clusterServer{s: s})
	pb.RegisterMaintenanceServer(gs, &maintenanceServer{s: s})
	pb.RegisterAuthServer(gs, &authServer{s: s})
	s.registerMembers(gs)
}

// MemberID is the etcd member id of the node with id nodeID: stable, as
// it depends on the id alone, and never 0.
func MemberID(nodeID string) uint64 {
	sum := sha256.Sum256([]byte("tenure etcd member " + nodeID))
	if id := binary.BigEndian.Uint64(sum[:8]); id != 0 {
		return id
	}
	return 1
}

// clusterID is the etcd cluster id: the first 8 bytes of Tenure's cluster
// id (0 before the first leader has drawn it).
func (s *Server) clusterID() uint64 {
	id := s.front.Security().ClusterID
	if len(id) < 8 {
		return 0
	}
	return binary.BigEndian.Uint64(id[:8])
}

// header fills a response header; rev 0 stands for this node's current
// revision.
func (s *Server) header(rev uint64) *pb.ResponseHeader {
	if rev == 0 {
		rev = s.revision()
	}
	return &pb.ResponseHeader{ClusterId: s.clusterID(), MemberId: s.memberID, Revision: int64(rev), RaftTerm: s.front.Term()}
}

// revision is this node's current revision.
func (s *Server) revision() uint64 {
	var rev uint64
	s.front.Read(func(st *fsm.State) { rev = st.Revision() })
	return rev
}

// propose commits op through the server (server.Front.Propose); a
// refusal of the state machine is the error. When the client gave up
// (ctx ended) it is answered as etcd answers it: with the context's error.
func (s *Server) propose(ctx context.Context, op any) (fsm.Result, error) {
	res, err := s.front.Propose(ctx, op)
	if err == nil {
		err = res.Err
	} else if cerr := ctx.Err(); cerr != nil {
		err = cerr
	}
	return res, err
}

// linearizable waits until a read of this node's state sees every write
// completed before the call (server.Front.LinearizableRead).
func (s *Server) linearizable(ctx context.Context) error {
	return s.front.LinearizableRead(ctx)
}
