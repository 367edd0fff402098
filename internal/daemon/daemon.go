// Package daemon assembles a Tenure server process: node, gRPC service and
// listener. cmd/tenure and the in-process test harness both use it.
package daemon

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tenure-io/tenure/internal/clock"
	"github.com/tenure-io/tenure/internal/dashboard"
	"github.com/tenure-io/tenure/internal/etcdapi"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/metrics"
	"github.com/tenure-io/tenure/internal/node"
	"github.com/tenure-io/tenure/internal/server"
	"github.com/tenure-io/tenure/internal/tlsconfig"
	"github.com/tenure-io/tenure/internal/zkapi"
)

// Config configures a daemon.
type Config struct {
	NodeID  string
	DataDir string
	// Listen is the client API address, e.g. 127.0.0.1:7070 (":0" picks a
	// free port; see Addr).
	Listen string
	// Advertise is the address clients reach this node's client API at,
	// if not Listen's. The node publishes it to the cluster (MemberList,
	// and the leader's address in a follower's "not the leader"); with
	// neither it nor a Listen host to dial (0.0.0.0, ::), none.
	Advertise string
	// Clock drives session deadlines; nil means the real clock.
	Clock clock.Clock
	// Logger receives the server's log (raft's included); nil means text
	// at info on LogOutput.
	Logger *slog.Logger
	// LogOutput is where the default Logger writes; nil means stderr.
	LogOutput io.Writer
	// LogStore names the raft log engine: "bolt" or "wal"; "" is the data
	// directory's own, or wal for a new one.
	LogStore string
	// PeerListen is the raft peer address; empty for a standalone node.
	PeerListen string
	// PeerAdvertise is the peer address others dial, if not PeerListen.
	PeerAdvertise string
	// Limits are this node's own admission limits (zero fields: defaults).
	Limits server.Limits
	// ClusterLimits: the replicated limits this node proposes when it
	// leads (zero fields keep the cluster's); see node.Config.Limits.
	ClusterLimits fsm.Limits
	// Faults: see node.Config (empty unless built with the tenurefault tag).
	Faults node.Faults
	// BootstrapPeers: id → peer address of every initial voter (used only
	// for a new data directory).
	BootstrapPeers map[string]string
	// Join: a new data directory waits to be added to a cluster instead of
	// bootstrapping (see node.Config.Join).
	Join bool
	// LockHistory and RegisterOpMemory: see node.Config (0 keeps the
	// cluster's setting).
	LockHistory, RegisterOpMemory int
	// GroupCommitWait: see node.Config (0 is the default wait, negative
	// disables it).
	GroupCommitWait time.Duration
	// HeartbeatTimeout, ElectionTimeout and LeaderLeaseTimeout: raft's
	// failure detection, see node.Config (0: the defaults).
	HeartbeatTimeout, ElectionTimeout, LeaderLeaseTimeout time.Duration
	// HTTPListen is the address of the metrics, health and dashboard
	// listener (http.go); empty: none.
	HTTPListen string
	// Pprof serves Go's profiles under /debug/pprof/ on HTTPListen.
	Pprof bool
	// HTTPTLS, if set, serves HTTPListen over TLS only; a client
	// certificate it verifies identifies its caller as on the client API.
	HTTPTLS *tls.Config
	// HTTPAllowedHosts are Host names the HTTP listener answers besides
	// its listen address's (http.go: hostCheck).
	HTTPAllowedHosts []string
	// MetricsPublic serves /metrics without a credential under Auth.
	MetricsPublic bool
	// MetricsQueues is how many queues (the first by name) have metrics
	// of their own; the others are summed. 0 means DefaultMetricsQueues,
	// negative none.
	MetricsQueues int
	// TLS, if set, is the client API's TLS configuration: the API then
	// serves TLS only (a plaintext client is refused).
	TLS *tls.Config
	// PeerTLS: see node.Config (raft over mutual TLS).
	PeerTLS func() *tls.Config
	// Auth (serve --auth) makes this member enforce the ACLs whatever
	// the cluster's replicated setting, and makes the cluster enforce
	// them for good once this member leads (server.WithAuth). A member
	// without it enforces them as soon as the cluster does
	// (server.Server.AuthEnforced). Denials are logged to LogOutput.
	Auth bool
	// EtcdListen, if set, serves etcd's v3 API there too (internal/etcdapi),
	// with TLS when the client API has it, under the same ACLs as the
	// client API when Auth is set. In a cluster with TLS it needs PeerTLS:
	// followers forward to the leader's etcd API with it.
	EtcdListen string
	// EtcdAdvertise is the address etcd clients and the other members
	// reach this node's etcd API at, if not EtcdListen's.
	EtcdAdvertise string
	// EtcdAutoCompaction is etcd's automatic compaction of the history
	// of past revisions (--auto-compaction-mode and
	// --auto-compaction-retention), run by the leader's etcd API.
	EtcdAutoCompaction etcdapi.AutoCompaction
	// ZkListen, if set, serves ZooKeeper's client protocol there too
	// (internal/zkapi); ZkAdvertise is the address the other members
	// reach it at, if not ZkListen's. ZkMinSessionTimeout and
	// ZkMaxSessionTimeout bound a negotiated session timeout, ZkMaxWatches
	// the watches of a connection, ZkContainerCheckInterval how often the
	// leader removes emptied containers (zero: zkapi's defaults).
	ZkListen                                 string
	ZkAdvertise                              string
	ZkMinSessionTimeout, ZkMaxSessionTimeout time.Duration
	ZkMaxWatches                             int
	ZkContainerCheckInterval                 time.Duration
	// ZkTTLNodes lets ZooKeeper clients create TTL nodes
	// (--zk-ttl-nodes; zkapi.Config.TTLNodes).
	ZkTTLNodes bool
	// ZkSecureListen, if set, serves ZooKeeper's client protocol over TLS
	// there (ZooKeeper's secureClientPort), with TLS's certificate; its
	// client CA, if any, then requires client certificates, which
	// identify their callers. It needs TLS.
	ZkSecureListen string
	// ZkMaxWatchBytes bounds the watches of all ZooKeeper connections
	// together, ZkMaxClientCnxns the connections from one IP address
	// (zkapi.Config's; zero: zkapi's defaults, -1: no per-IP bound).
	ZkMaxWatchBytes  int64
	ZkMaxClientCnxns int
	// MaxConnections bounds the connections of each listener (client API,
	// HTTP, etcd API); at the bound, or at what the descriptor limit
	// leaves, the quietest connection is closed to make room (conns.go).
	// 0 means DefaultMaxConnections.
	MaxConnections int
}

// DefaultMetricsQueues is the default Config.MetricsQueues.
const DefaultMetricsQueues = 20

// DefaultConfig is what `tenure serve` runs with no flags.
func DefaultConfig() Config {
	return Config{NodeID: "n1", DataDir: "tenure-data", Listen: "127.0.0.1:7070", HTTPListen: DefaultHTTPListen, MetricsQueues: DefaultMetricsQueues}
}

// Daemon is a running server.
type Daemon struct {
	Node *node.Node
	Hub  *server.Hub
	lis  net.Listener
	gs   *grpc.Server
	srv  *server.Server // closed after the listeners stop, before the node
	// httpLis, httpSrv, httpTLS and httpDoor: the HTTP listener, if any
	// (http.go).
	httpLis  net.Listener
	httpSrv  *http.Server
	httpTLS  *tls.Config
	httpDoor httpDoor
	// etcdLis, etcdGS, etcdTLS and etcd: the etcd API's listener, gRPC
	// server, TLS configuration (nil: plaintext) and service, if any. The
	// listener serves gRPC and etcd's JSON gateway (etcdapi.Server.Serve).
	etcdLis net.Listener
	etcdGS  *grpc.Server
	etcdTLS *tls.Config
	etcd    *etcdapi.Server
	// zkLis, zkSecureLis and zk: the ZooKeeper front's listeners
	// (plaintext, TLS; either may be nil) and server, if any.
	zkLis, zkSecureLis net.Listener
	zk                 *zkapi.Server
	// conns bounds the connections of every listener (conns.go).
	conns *connTable
	// fwdLis and fwdGS: the forward door, where followers relay the
	// requests that need the leader over the peer port (nil standalone;
	// internal/server's forward.go).
	fwdLis net.Listener
	fwdGS  *grpc.Server
	// clientFaults: the client API listener's fault switches (empty
	// unless built with the tenurefault tag).
	clientFaults clientFaults
}

// Start opens the node and the listener. The daemon serves after Run is
// called; Ready() tells when it is leader with its state caught up.
func Start(cfg Config) (*Daemon, error) {
	if err := cfg.Limits.Validate(); err != nil {
		return nil, err
	}
	if cfg.ZkSecureListen != "" && cfg.TLS == nil {
		return nil, errors.New("--zk-secure-listen needs --tls-cert and --tls-key")
	}
	if cfg.EtcdListen != "" && cfg.TLS != nil && cfg.PeerListen != "" && cfg.PeerTLS == nil {
		return nil, errors.New("--etcd-listen with --tls-cert in a cluster needs peer TLS (--peer-tls-cert, --peer-tls-key, --peer-tls-ca): followers forward etcd requests to the leader's etcd API with it")
	}
	hub := server.NewHub()
	n, err := node.Open(node.Config{NodeID: cfg.NodeID, DataDir: cfg.DataDir, Clock: cfg.Clock, Logger: cfg.Logger, LogOutput: cfg.LogOutput, LogStore: cfg.LogStore, PeerAddr: cfg.PeerListen, PeerAdvertise: cfg.PeerAdvertise, PeerTLS: cfg.PeerTLS, BootstrapPeers: cfg.BootstrapPeers, Join: cfg.Join, Faults: cfg.Faults, LockHistory: cfg.LockHistory, RegisterOpMemory: cfg.RegisterOpMemory, Limits: cfg.ClusterLimits, GroupCommitWait: cfg.GroupCommitWait, Observer: hub.Metrics(),
		HeartbeatTimeout: cfg.HeartbeatTimeout, ElectionTimeout: cfg.ElectionTimeout, LeaderLeaseTimeout: cfg.LeaderLeaseTimeout}, hub.Sink)
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	listeners := 1
	for _, a := range []string{cfg.HTTPListen, cfg.EtcdListen, cfg.ZkListen, cfg.ZkSecureListen} {
		if a != "" {
			listeners++
		}
	}
	conns := newConnTable(cfg.MaxConnections, listeners)
	n.Logger().Info("connection limits", "per_listener", conns.perListener, "all_listeners", conns.total, "descriptor_limit", conns.fds)
	lis = conns.wrap(lis)
	lis, faults := newClientFaults(lis)
	opts := append(server.GRPCOptions(), server.ConnectionOptions()...)
	if cfg.TLS != nil {
		// Members dial it too, with their peer certificates (memberDial).
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsconfig.MemberServer(cfg.TLS, cfg.PeerTLS, tlsconfig.MemberServerName))))
	}
	gs := grpc.NewServer(opts...)
	var sopts []server.Option
	if cfg.Auth {
		sopts = append(sopts, server.WithAuth())
	}
	if addr := clientAdvertise(cfg.Advertise, lis.Addr()); addr != "" {
		sopts = append(sopts, server.WithClientAddr(addr, memberDial(cfg)))
	}
	srv := server.New(n, hub, cfg.Limits, sopts...)
	server.Register(gs, srv)
	queues := max(cmp.Or(cfg.MetricsQueues, DefaultMetricsQueues), 0)
	d := &Daemon{Node: n, Hub: hub, lis: lis, gs: gs, srv: srv, conns: conns, clientFaults: faults}
	hub.Metrics().SetSource(func() metrics.Sample {
		s := srv.Sample(queues)
		if d.zk != nil { // set before the daemon serves, never changed
			z := d.zk.Stats()
			s.Zk = metrics.ZkSample{Connections: z.Connections, Relayed: z.Relayed, Watches: z.Watches, WatchBytes: z.WatchBytes, QueuedBytes: z.QueuedBytes}
		}
		return s
	})
	if fl := n.ForwardListener(); fl != nil {
		d.fwdLis, d.fwdGS = fl, grpc.NewServer(server.ForwardOptions()...)
		server.RegisterForwarded(d.fwdGS, srv)
	}
	if cfg.EtcdListen != "" {
		if err := d.listenEtcd(cfg, srv); err != nil {
			lis.Close()
			n.Close()
			return nil, err
		}
	}
	if cfg.ZkListen != "" || cfg.ZkSecureListen != "" {
		if err := d.listenZk(cfg, srv); err != nil {
			lis.Close()
			if d.etcdLis != nil {
				d.etcdLis.Close()
			}
			n.Close()
			return nil, err
		}
	}
	if cfg.HTTPListen != "" {
		d.httpTLS = cfg.HTTPTLS
		d.httpDoor = httpDoor{srv: srv, metricsPublic: cfg.MetricsPublic, hosts: newHostCheck(cfg.HTTPListen, cfg.HTTPAllowedHosts)}
		if err := d.listenHTTP(cfg.HTTPListen, cfg.Pprof, dashboard.Handler(srv.Dashboard())); err != nil {
			lis.Close()
			if d.etcdLis != nil {
				d.etcdLis.Close()
			}
			d.closeZkListeners()
			n.Close()
			return nil, err
		}
	}
	return d, nil
}

// listenZk opens the ZooKeeper front's listeners.
func (d *Daemon) listenZk(cfg Config, srv *server.Server) error {
	var advertise string
	if cfg.ZkListen != "" {
		lis, err := net.Listen("tcp", cfg.ZkListen)
		if err != nil {
			return fmt.Errorf("listen on %s (--zk-listen): %w", cfg.ZkListen, err)
		}
		advertise = cmp.Or(cfg.ZkAdvertise, clientAdvertise("", lis.Addr()))
		d.zkLis = d.conns.wrap(lis)
	}
	if cfg.ZkSecureListen != "" {
		lis, err := net.Listen("tcp", cfg.ZkSecureListen)
		if err != nil {
			d.closeZkListeners()
			return fmt.Errorf("listen on %s (--zk-secure-listen): %w", cfg.ZkSecureListen, err)
		}
		// The client API's certificate, re-read as it changes; its client
		// CA, if any, requires client certificates (tlsconfig).
		d.zkSecureLis = tls.NewListener(d.conns.wrap(lis), cfg.TLS)
	}
	z, err := zkapi.New(srv, zkapi.Config{Advertise: advertise, MinSessionTimeout: cfg.ZkMinSessionTimeout, MaxSessionTimeout: cfg.ZkMaxSessionTimeout, MaxWatches: cfg.ZkMaxWatches,
		ContainerCheckInterval: cfg.ZkContainerCheckInterval, TTLNodes: cfg.ZkTTLNodes, MaxWatchBytes: cfg.ZkMaxWatchBytes, MaxClientCnxns: cfg.ZkMaxClientCnxns})
	if err != nil {
		d.closeZkListeners()
		return err
	}
	d.zk = z
	return nil
}

// closeZkListeners closes the ZooKeeper front's listeners.
func (d *Daemon) closeZkListeners() {
	for _, l := range []net.Listener{d.zkLis, d.zkSecureLis} {
		if l != nil {
			l.Close()
		}
	}
}

// ZkAddr is the ZooKeeper front's plaintext address ("" when it is off).
func (d *Daemon) ZkAddr() string {
	if d.zkLis == nil {
		return ""
	}
	return d.zkLis.Addr().String()
}

// ZkSecureAddr is the ZooKeeper front's TLS address ("" when it is off).
func (d *Daemon) ZkSecureAddr() string {
	if d.zkSecureLis == nil {
		return ""
	}
	return d.zkSecureLis.Addr().String()
}

// listenEtcd opens the etcd API's listener.
func (d *Daemon) listenEtcd(cfg Config, srv *server.Server) error {
	lis, err := net.Listen("tcp", cfg.EtcdListen)
	if err != nil {
		return fmt.Errorf("listen on %s (--etcd-listen): %w", cfg.EtcdListen, err)
	}
	scheme := "http://"
	if cfg.TLS != nil {
		scheme = "https://"
	}
	advertise := cmp.Or(cfg.EtcdAdvertise, lis.Addr().String())
	lis = d.conns.wrap(lis)
	api := etcdapi.New(srv, etcdapi.Config{ClientURL: scheme + advertise, PeerTLS: cfg.PeerTLS, MaxResponseBytes: cmp.Or(cfg.Limits.MaxResponseBytes, server.DefaultMaxResponseBytes), AutoCompaction: cfg.EtcdAutoCompaction})
	gs := grpc.NewServer(append(api.GRPCOptions(), server.ConnectionOptions()...)...)
	api.Register(gs)
	d.etcdLis, d.etcdGS, d.etcd = lis, gs, api
	if cfg.TLS != nil {
		d.etcdTLS = etcdapi.ServerTLS(cfg.TLS, cfg.PeerTLS) // the listener's handshake (etcdapi.Server.Serve)
	}
	return nil
}

// memberDial is how a follower dials the leader's client API to publish
// its own address: in plaintext when the client API is; with TLS, with
// its peer certificate (tlsconfig.MemberClient), and not at all without
// peer TLS (nil).
func memberDial(cfg Config) func(addr string) []grpc.DialOption {
	switch {
	case cfg.TLS == nil:
		return func(string) []grpc.DialOption {
			return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		}
	case cfg.PeerTLS == nil:
		return nil
	}
	return func(addr string) []grpc.DialOption {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tlsconfig.MemberClient(cfg.PeerTLS(), host, tlsconfig.MemberServerName)))}
	}
}

// clientAdvertise is the client API address a node publishes: advertise,
// or the listener's address unless its host is unspecified (0.0.0.0, ::),
// which no client can dial ("").
func clientAdvertise(advertise string, lis net.Addr) string {
	if advertise != "" {
		return advertise
	}
	if ta, ok := lis.(*net.TCPAddr); ok && ta.IP.IsUnspecified() {
		return ""
	}
	return lis.String()
}

// EtcdAddr is the etcd API's address ("" when it is off).
func (d *Daemon) EtcdAddr() string {
	if d.etcdLis == nil {
		return ""
	}
	return d.etcdLis.Addr().String()
}

// Addr is the client API's address.
func (d *Daemon) Addr() string { return d.lis.Addr().String() }

// Ready is closed once the node serves as leader.
func (d *Daemon) Ready() <-chan struct{} { return d.Node.Ready() }

// Run serves until ctx ends, then stops gracefully and closes the node.
func (d *Daemon) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	nctx, cancel := context.WithCancel(ctx)
	wg.Add(3)
	go func() { defer wg.Done(); errc <- d.Node.Run(nctx) }()
	go func() { defer wg.Done(); errc <- d.gs.Serve(d.lis) }()
	go func() { defer wg.Done(); d.srv.PublishClientAddr(nctx) }()
	if d.httpSrv != nil {
		wg.Add(1)
		go func() { defer wg.Done(); errc <- d.serveHTTP(nctx) }()
	}
	if d.fwdGS != nil {
		wg.Add(1)
		go func() { defer wg.Done(); errc <- d.fwdGS.Serve(d.fwdLis) }()
	}
	if d.zk != nil {
		wg.Add(1)
		go func() { defer wg.Done(); errc <- d.zk.Serve(nctx, d.zkLis, d.zkSecureLis) }()
	}
	if d.etcdGS != nil {
		wg.Add(2)
		go func() { defer wg.Done(); errc <- d.etcd.Serve(nctx, d.etcdLis, d.etcdGS, d.etcdTLS) }()
		go func() { defer wg.Done(); _ = d.etcd.Run(nctx) }()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	cancel()
	d.gs.Stop() // streams are long-lived: close them rather than wait for them
	if d.fwdGS != nil {
		d.fwdGS.Stop()
	}
	if d.etcdGS != nil {
		d.etcdGS.Stop()
	}
	if d.zk != nil {
		d.zk.Close()
	}
	wg.Wait()
	d.srv.Close() // its workers end before the node they propose to
	if cerr := d.Node.Close(); err == nil {
		err = cerr
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, grpc.ErrServerStopped) {
		err = nil
	}
	return err
}
