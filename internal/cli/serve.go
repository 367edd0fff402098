package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/etcdapi"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/logging"
	"github.com/tenure-io/tenure/internal/node"
	"github.com/tenure-io/tenure/internal/server"
	"github.com/tenure-io/tenure/internal/zkapi"
)

// ServeGCPercent is the Go collector's target (GOGC) of `tenure serve`
// when the environment sets none: the heap may grow 75 % over what is live
// before a collection, not the runtime's 100 %. A server's live heap is
// mostly its sessions, and the garbage its keepalives leave behind is what
// the headroom holds: at a million idle sessions 75 keeps the server within
// 1 GiB of RSS (100 takes about 1.1 GiB) for about a tenth of a core more
// (docs/benchmarks.md). GOGC in the environment wins.
const ServeGCPercent = 75

// serveGCPercent sets the collector's target to ServeGCPercent unless GOGC
// is set.
func serveGCPercent() {
	if _, ok := os.LookupEnv("GOGC"); !ok {
		debug.SetGCPercent(ServeGCPercent)
	}
}

// serveOutput is `tenure serve -o json`'s ready line.
type serveOutput struct {
	Serving string `json:"serving"`
	Node    string `json:"node"`
	DataDir string `json:"data_dir"`
	// HTTP is the metrics, health and dashboard address ("" none).
	HTTP string `json:"http"`
	// Etcd is the etcd API's address (--etcd-listen; "" none).
	Etcd string `json:"etcd"`
	// ZooKeeper is the ZooKeeper front's address (--zk-listen; "" none).
	ZooKeeper string `json:"zookeeper"`
	// ZooKeeperSecure is its TLS address (--zk-secure-listen; "" none).
	ZooKeeperSecure string `json:"zookeeper_secure"`
}

// maxGroupCommitWait bounds --group-commit-wait: past a few milliseconds
// the wait costs more than the write it saves.
const maxGroupCommitWait = 10 * time.Millisecond

func (a *app) serveCommand() *cobra.Command {
	cfg := daemon.DefaultConfig()
	var (
		groupWait           time.Duration
		compactionMode      string
		compactionRetention string
		configFile          string
		logFormat, logLevel string
		sec                 serveSecurity
		zkTick              time.Duration
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run a single-node Tenure server",
		Long: `Run a single-node Tenure server with its state in --data-dir.

Prints one line on stdout once it serves (with -o json: {"serving","node",
"data_dir","http","etcd","zookeeper","zookeeper_secure"}, http being the
--http-listen address, etcd the --etcd-listen address, zookeeper and
zookeeper_secure the --zk-listen and --zk-secure-listen ones, "" for none; the
log's "serving" record names it too); the log (leadership changes, session expiries,
lock-delays, membership changes, restores, storage errors; refusals for
limits or rights at warn; raft's own warnings and errors) goes to stderr,
as text or JSON lines (--log-format, --log-level).

--http-listen serves /metrics (Prometheus), /healthz, /readyz, the
dashboard at / and, with --pprof, /debug/pprof/ (docs/monitoring.md). With
--auth everything there but /healthz and /readyz needs an ACL token
(Authorization: Bearer SECRET) or a client certificate (--http-tls-cert);
docs/security.md, "The HTTP listener". SIGINT or SIGTERM stops it cleanly
(exit 0).

Cluster mode: --peer-listen. A new data directory bootstraps the voters of
--bootstrap-peers, or this node alone; with --join it bootstraps nothing and
waits (printing its ready line only then) until the cluster's leader adds
it: run "tenure member add ID PEER_ADDR", or "tenure member rebuild ID
PEER_ADDR" for a member whose data directory was lost or damaged.

--config FILE reads flag values from a YAML file whose keys are the flag
names (see examples/deploy/tenure.yaml); flags on the command line win.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			serveGCPercent()
			if configFile != "" {
				if err := applyConfigFile(cmd.Flags(), configFile); err != nil {
					return err
				}
			}
			if cfg.ZkListen != "" || cfg.ZkSecureListen != "" {
				if zkTick <= 0 {
					return fmt.Errorf("--zk-tick-time must be positive, not %s", zkTick)
				}
				if cfg.ZkContainerCheckInterval <= 0 {
					return fmt.Errorf("--zk-container-check-interval must be positive, not %s", cfg.ZkContainerCheckInterval)
				}
				if cfg.ZkMinSessionTimeout == 0 {
					cfg.ZkMinSessionTimeout = max(2*zkTick, time.Second)
				}
				if cfg.ZkMaxSessionTimeout == 0 {
					cfg.ZkMaxSessionTimeout = min(20*zkTick, time.Hour)
				}
				if cfg.ZkMaxClientCnxns < 0 || cfg.ZkMaxWatchBytes <= 0 {
					return fmt.Errorf("--zk-max-client-cnxns must be 0 (no bound) or more, --zk-max-watch-bytes positive")
				}
				if cfg.ZkMaxClientCnxns == 0 {
					cfg.ZkMaxClientCnxns = -1 // ZooKeeper's 0: no bound
				}
			}
			switch {
			case groupWait < 0 || groupWait > maxGroupCommitWait:
				return fmt.Errorf("--group-commit-wait must be 0..%s, not %s", maxGroupCommitWait, groupWait)
			case groupWait == 0:
				cfg.GroupCommitWait = -1 // never wait
			default:
				cfg.GroupCommitWait = groupWait
			}
			ac, err := etcdapi.ParseAutoCompaction(compactionMode, compactionRetention)
			if err != nil {
				return err
			}
			cfg.EtcdAutoCompaction = ac
			if len(cfg.BootstrapPeers) > 0 && cfg.PeerListen == "" {
				return errors.New("--bootstrap-peers needs --peer-listen")
			}
			if cfg.Join && (cfg.PeerListen == "" || len(cfg.BootstrapPeers) > 0) {
				return errors.New("--join needs --peer-listen and no --bootstrap-peers")
			}
			self := cfg.PeerListen
			if cfg.PeerAdvertise != "" {
				self = cfg.PeerAdvertise
			}
			if addr, ok := cfg.BootstrapPeers[cfg.NodeID]; len(cfg.BootstrapPeers) > 0 && (!ok || addr != self) {
				return fmt.Errorf("--bootstrap-peers must list this node as %s=%s", cfg.NodeID, self)
			}
			switch {
			case cfg.MetricsQueues < 0:
				return fmt.Errorf("--metrics-queues must not be negative, not %d", cfg.MetricsQueues)
			case cfg.MetricsQueues == 0:
				cfg.MetricsQueues = -1 // none of its own (the config's 0 is the default)
			}
			cfg.ClusterLimits = changedLimits(cmd.Flags(), cfg.ClusterLimits)
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			logger, err := logging.New(a.streams.Err, logFormat, logLevel)
			if err != nil {
				return fmt.Errorf("--log-format/--log-level: %w", err)
			}
			cfg.Logger, cfg.LogOutput = logger, a.streams.Err
			if err := serveTiming(cmd.Flags(), &cfg, logger); err != nil {
				return err
			}
			reloaders, err := sec.configure(&cfg, a.streams.Err)
			if err != nil {
				return err
			}
			reloadOnHUP(ctx, reloaders, a.streams.Err)
			d, err := daemon.Start(cfg)
			if err != nil {
				return err
			}
			// The daemon runs until the signal (or the caller) ends ctx
			// and, if it leads, it has handed leadership on.
			runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
			defer cancelRun()
			go func() {
				select {
				case <-ctx.Done():
					handOffLeadership(d.Node, logger)
					cancelRun()
				case <-runCtx.Done():
				}
			}()
			done := make(chan error, 1)
			go func() { done <- d.Run(runCtx) }()
			select {
			case <-d.Ready():
			case err := <-done:
				if err == nil && ctx.Err() == nil {
					err = errors.New("server stopped before it was ready")
				}
				return err
			}
			out := serveOutput{Serving: d.Addr(), Node: cfg.NodeID, DataDir: cfg.DataDir, HTTP: d.HTTPAddr(), Etcd: d.EtcdAddr(), ZooKeeper: d.ZkAddr(), ZooKeeperSecure: d.ZkSecureAddr()}
			logger.Info("serving", "listen", out.Serving, "http", out.HTTP, "etcd", out.Etcd, "zookeeper", out.ZooKeeper, "zookeeper_secure", out.ZooKeeperSecure, "node", out.Node, "data_dir", out.DataDir)
			if err := a.emit(out, func(w io.Writer) {
				fmt.Fprintf(w, "tenure: serving on %s (node %s, data %s)", out.Serving, out.Node, out.DataDir)
				if out.Etcd != "" {
					fmt.Fprintf(w, "; etcd API on %s", out.Etcd)
				}
				if out.ZooKeeper != "" {
					fmt.Fprintf(w, "; ZooKeeper API on %s", out.ZooKeeper)
				}
				if out.ZooKeeperSecure != "" {
					fmt.Fprintf(w, "; ZooKeeper API over TLS on %s", out.ZooKeeperSecure)
				}
				fmt.Fprintln(w)
			}); err != nil {
				stop()
				<-done
				return err
			}
			return <-done
		},
	}
	f := cmd.Flags()
	f.StringVar(&configFile, "config", "", "YAML file of flag values (keys are flag names, e.g. data-dir: /var/lib/tenure); flags given on the command line win")
	f.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory holding the server's state")
	f.StringVar(&cfg.Listen, "listen", cfg.Listen, "client API address (port 0 picks a free port)")
	f.StringVar(&cfg.Advertise, "advertise", "", "address clients reach this node's client API at, if not --listen's; published to the cluster so that clients find every member and the leader")
	f.StringVar(&cfg.NodeID, "node-id", cfg.NodeID, "this node's id")
	f.StringVar(&logFormat, "log-format", "text", "log format on stderr: text or json")
	f.StringVar(&logLevel, "log-level", "info", "least level logged: debug, info, warn or error (debug also shows raft's own info)")
	f.StringVar(&cfg.EtcdListen, "etcd-listen", "", "also serve etcd's v3 API on this address (docs/etcd.md; empty: off)")
	f.StringVar(&cfg.EtcdAdvertise, "etcd-advertise", "", "address etcd clients and the other members reach this node's etcd API at, if not --etcd-listen's")
	f.StringVar(&compactionMode, "auto-compaction-mode", etcdapi.CompactionPeriodic, "etcd's automatic compaction of the history of past revisions, run by the leader: periodic or revision (docs/etcd.md)")
	f.StringVar(&compactionRetention, "auto-compaction-retention", "0", "what automatic compaction keeps: with periodic a duration (1h, 30m) or a number of hours, with revision a number of revisions; 0: off (--max-kv-history-revisions and --max-kv-history-bytes bound the history anyway)")
	f.StringVar(&cfg.ZkListen, "zk-listen", "", "also serve ZooKeeper's client protocol on this address (docs/zookeeper.md; empty: off)")
	f.StringVar(&cfg.ZkSecureListen, "zk-secure-listen", "", "also serve ZooKeeper's client protocol over TLS on this address (ZooKeeper's secureClientPort), with --tls-cert and --tls-key; with --tls-client-ca, client certificates are required and identify their callers (docs/zookeeper.md; empty: off)")
	f.StringVar(&cfg.ZkAdvertise, "zk-advertise", "", "address the other members reach this node's --zk-listen at, if not --zk-listen's (followers relay over the peer port, and use it only with a leader of an older release)")
	f.DurationVar(&zkTick, "zk-tick-time", 2*time.Second, "ZooKeeper's tickTime: the session timeouts a client may negotiate are 2 to 20 ticks, unless --zk-min-session-timeout or --zk-max-session-timeout say otherwise")
	f.DurationVar(&cfg.ZkMinSessionTimeout, "zk-min-session-timeout", 0, "the shortest ZooKeeper session timeout a client may negotiate (default 2 × --zk-tick-time, at least 1s)")
	f.DurationVar(&cfg.ZkMaxSessionTimeout, "zk-max-session-timeout", 0, "the longest ZooKeeper session timeout a client may negotiate (default 20 × --zk-tick-time, at most 1h)")
	f.IntVar(&cfg.ZkMaxWatches, "zk-max-watches", zkapi.DefaultMaxWatches, "watches one ZooKeeper connection may set")
	f.Int64Var(&cfg.ZkMaxWatchBytes, "zk-max-watch-bytes", zkapi.DefaultMaxWatchBytes, "bytes the watches of all ZooKeeper connections may hold together (each its path and 128 bytes)")
	f.IntVar(&cfg.ZkMaxClientCnxns, "zk-max-client-cnxns", zkapi.DefaultMaxClientCnxns, "ZooKeeper connections one IP address may hold at once (ZooKeeper's maxClientCnxns; 0: no bound)")
	f.DurationVar(&cfg.ZkContainerCheckInterval, "zk-container-check-interval", zkapi.DefaultContainerCheckInterval, "how often the leader removes the ZooKeeper containers left without children (ZooKeeper's znode.container.checkIntervalMs); a container that never had a child stays")
	f.BoolVar(&cfg.ZkTTLNodes, "zk-ttl-nodes", false, "let ZooKeeper clients create TTL nodes (createTTL), as ZooKeeper's zookeeper.extendedTypesEnabled does; off, they are answered Unimplemented, as ZooKeeper answers them by default. Give it to every member: the leader's decides")
	f.StringVar(&cfg.HTTPListen, "http-listen", cfg.HTTPListen, "metrics, health and dashboard address (port 0 picks a free port; empty: none)")
	f.BoolVar(&cfg.Pprof, "pprof", false, "also serve Go's profiles under /debug/pprof/ on --http-listen (with --auth: to the management policy only)")
	f.BoolVar(&cfg.MetricsPublic, "metrics-public", false, "with --auth, serve /metrics to callers without a credential too (otherwise it needs cluster read)")
	f.StringSliceVar(&cfg.HTTPAllowedHosts, "http-allowed-hosts", nil, "Host names --http-listen answers besides its own address's, comma-separated (a request naming another host is refused 421)")
	f.IntVar(&cfg.MetricsQueues, "metrics-queues", cfg.MetricsQueues, "queues (the first by name) with metrics of their own; the others are summed")
	f.StringVar(&cfg.LogStore, "log-store", "", "raft log engine: bolt or wal (default: the data dir's own, wal for a new one)")
	clusterLimitFlags(f, &cfg.ClusterLimits, "when this node leads, set the cluster's limit on ")
	f.IntVar(&cfg.Limits.MaxNameBytes, "max-name-len", server.DefaultLimits().MaxNameBytes, "longest lock, semaphore, election, queue or fenced register name, bytes")
	f.IntVar(&cfg.Limits.MaxRegisterValueBytes, "max-register-value-len", server.DefaultLimits().MaxRegisterValueBytes, "largest fenced register value, bytes")
	f.IntVar(&cfg.Limits.MaxResponseBytes, "max-response-bytes", server.DefaultLimits().MaxResponseBytes, fmt.Sprintf("largest answer to one request, bytes, at most %d: a request whose answer would take more is refused with RESOURCE_EXHAUSTED (docs/limits.md)", server.MaxMessageSize))
	f.IntVar(&cfg.MaxConnections, "max-connections", daemon.DefaultMaxConnections, "connections each listener (client API, --http-listen, --etcd-listen) holds at most; at it, or at what the descriptor limit leaves, the quietest connection is closed to make room for a new one")
	f.IntVar(&cfg.LockHistory, "lock-history", 0, fmt.Sprintf("grant records kept per lock, 1..%d (cluster-wide; 0 keeps the cluster's setting, initially %d)", fsm.MaxHistoryLimit, fsm.HistoryLimit))
	f.IntVar(&cfg.RegisterOpMemory, "register-op-memory", 0, fmt.Sprintf("operation ids remembered per fenced register, 1..%d (cluster-wide; 0 keeps the cluster's setting, initially %d)", fsm.MaxOpMemory, fsm.OpMemory))
	f.DurationVar(&groupWait, "group-commit-wait", node.DefaultGroupCommitWait, fmt.Sprintf("longest a small batch of commands waits for more before it is written, 0..%s (0: never wait)", maxGroupCommitWait))
	kvFlags(f, &cfg.Limits.KV)
	addQueueServeFlags(f, &cfg.Limits)
	restoreServeFlags(f, &cfg.Limits.Restore)
	sec.flags(f)
	f.StringVar(&cfg.PeerListen, "peer-listen", "", "raft peer address (cluster mode), e.g. 127.0.0.1:7072")
	f.StringVar(&cfg.PeerAdvertise, "peer-advertise", "", "peer address other members dial, if not --peer-listen (NAT, proxies)")
	faultFlags(f, &cfg.Faults)
	f.DurationVar(&cfg.HeartbeatTimeout, "heartbeat-timeout", node.DefaultHeartbeatTimeout, "with --peer-listen: a follower that hears nothing from the leader this long (randomised up to twice that) starts an election (docs/timing.md)")
	f.DurationVar(&cfg.ElectionTimeout, "election-timeout", node.DefaultElectionTimeout, "with --peer-listen: how long a candidate waits for a majority (randomised up to twice that) before it tries again; at least --heartbeat-timeout")
	f.DurationVar(&cfg.LeaderLeaseTimeout, "leader-lease-timeout", node.DefaultLeaderLeaseTimeout, "with --peer-listen: a leader that hears from no majority this long steps down; at most --heartbeat-timeout")
	f.BoolVar(&cfg.Join, "join", false, "with a new data dir, bootstrap nothing and wait to be added to a cluster (tenure member add or member rebuild); ignored once the data dir exists")
	f.Var(peersFlag{&cfg.BootstrapPeers}, "bootstrap-peers", "initial voters as id=peer-addr,... (the same list on every initial member; ignored once the data dir exists)")
	return cmd
}

// peersFlag parses id=addr,id=addr.
type peersFlag struct{ m *map[string]string }

func (p peersFlag) String() string {
	if p.m == nil || *p.m == nil {
		return ""
	}
	var parts []string
	for id, addr := range *p.m {
		parts = append(parts, id+"="+addr)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func (p peersFlag) Set(v string) error {
	m := make(map[string]string)
	for _, part := range strings.Split(v, ",") {
		id, addr, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || id == "" || addr == "" {
			return fmt.Errorf("want id=host:port, got %q", part)
		}
		if _, dup := m[id]; dup {
			return fmt.Errorf("node id %q listed twice", id)
		}
		m[id] = addr
	}
	*p.m = m
	return nil
}

func (p peersFlag) Type() string { return "id=addr,..." }

// handOffTimeout bounds the leadership transfer of a stopping leader.
const handOffTimeout = 10 * time.Second

// handOffLeadership hands leadership to another voter if n leads, so that
// stopping it costs the cluster no election timeout: holds and sessions
// carry over to the new leader at once. A node that does not lead, or is
// the only voter, stops as it is.
func handOffLeadership(n *node.Node, logger *slog.Logger) {
	if !n.IsLeader() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), handOffTimeout)
	defer cancel()
	leader, err := n.TransferLeadership(ctx, "")
	switch {
	case errors.Is(err, fsm.ErrInvalid): // the only voter
	case err != nil:
		logger.Warn("stopping: leadership not transferred", "err", err)
	default:
		logger.Info("stopping: leadership transferred", "to", leader)
	}
}

// serveTiming checks the failure-detection flags (node.Config.Validate's
// rules, before anything is opened): flags left at their defaults leave
// the choice to the node (a standalone node elects itself sooner). In a
// cluster it logs the shortest session TTL that outlives one election, at
// warn when the clients' default TTL does not.
func serveTiming(f *pflag.FlagSet, cfg *daemon.Config, logger *slog.Logger) error {
	for _, t := range []struct {
		flag string
		d    *time.Duration
	}{{"heartbeat-timeout", &cfg.HeartbeatTimeout}, {"election-timeout", &cfg.ElectionTimeout}, {"leader-lease-timeout", &cfg.LeaderLeaseTimeout}} {
		if !f.Changed(t.flag) {
			*t.d = 0
		}
	}
	nc := node.Config{PeerAddr: cfg.PeerListen, HeartbeatTimeout: cfg.HeartbeatTimeout, ElectionTimeout: cfg.ElectionTimeout, LeaderLeaseTimeout: cfg.LeaderLeaseTimeout}
	if err := nc.Validate(); err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), "node: "))
	}
	if cfg.PeerListen == "" {
		return nil
	}
	ttl := nc.MinSurvivingTTL()
	if ttl > client.DefaultTTL {
		logger.Warn("sessions with a TTL shorter than min_surviving_ttl, the clients' default included, may be lost to their clients while a leader is elected", "min_surviving_ttl", ttl, "election_bound", nc.ElectionBound(), "default_ttl", client.DefaultTTL)
		return nil
	}
	logger.Info("sessions with a TTL shorter than min_surviving_ttl may be lost to their clients while a leader is elected", "min_surviving_ttl", ttl, "election_bound", nc.ElectionBound())
	return nil
}
