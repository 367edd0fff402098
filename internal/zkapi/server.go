// Package zkapi serves ZooKeeper's client protocol (the jute wire format
// of ZooKeeper 3.4 to 3.8) on a Tenure node, beside Tenure's own API, so
// that Curator's and Kazoo's recipes, zkCli.sh and the tools built on
// them run against Tenure unmodified (docs/zookeeper.md).
//
// # The mapping
//
// A ZooKeeper session is a Tenure session: its id is the session id (an
// int64 on the wire; Tenure's ids are revisions, far below 2^63), its
// password the session's secret (16 bytes, as ZooKeeper's), its timeout
// the session's TTL. Reconnecting to any member with id and password
// resumes it; a wrong password or a session that ended gets ZooKeeper's
// refusal (a ConnectResponse with timeout 0 and session id 0, then the
// connection is closed), which clients report as an expired session.
//
// Znodes live in the replicated state (internal/fsm/znode.go), every
// write a ZkTxn command, so a zxid is a Tenure revision: the czxid of a
// lock node is a fencing token that Tenure's fenced registers and guards
// accept, ordered with every other grant.
//
// Every member serves: reads and watches from its applied state, writes,
// pings, session creation and closing and sync on the leader. A follower
// relays those to the leader's ZooKeeper front over a connection of its
// own per client connection, as a client of the same session, over the
// peer port (upstream.go); when that connection breaks, or this node
// loses its leader, the client's connection is closed and the client,
// seeing ConnectionLoss, reconnects with its session.
//
// Clients connect in plaintext (--zk-listen) or over TLS
// (--zk-secure-listen, ZooKeeper's secureClientPort); a verified client
// certificate is the connection's x509 id and, as on Tenure's API, its
// caller for Tenure's ACLs.
//
// Requests of a connection are served one at a time, in order; a watch
// event is queued before the answer of any read that sees its change
// (watch.go).
package zkapi

import (
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/server"
)

// Defaults of Config, as ZooKeeper's with its default tickTime of 2 s.
const (
	DefaultMinSessionTimeout = 4 * time.Second
	DefaultMaxSessionTimeout = 40 * time.Second
	// DefaultMaxWatches bounds the watches of one connection.
	DefaultMaxWatches = 100_000
	// DefaultMaxClientCnxns bounds the connections from one IP address:
	// ZooKeeper's maxClientCnxns.
	DefaultMaxClientCnxns = 60
	// DefaultMaxWatchBytes bounds what the watches of all connections
	// hold together (each its path and 128 bytes).
	DefaultMaxWatchBytes = 256 << 20
	// DefaultContainerCheckInterval is how often the leader removes the
	// emptied containers: ZooKeeper's znode.container.checkIntervalMs.
	DefaultContainerCheckInterval = time.Minute
	// ContainerMaxPerMinute bounds the containers removed per minute:
	// ZooKeeper's znode.container.maxPerMinute.
	ContainerMaxPerMinute = 10_000
	// MaxPacket is the largest request packet read: ZooKeeper's default
	// jute.maxbuffer (1 MiB - 1), which ZooKeeper checks on the packet's
	// length. A longer one closes the connection, as ZooKeeper closes
	// it; the session stays.
	MaxPacket = fsm.MaxZnodeData
	// maxRelayPacket is the largest answer read from the leader: a
	// znode's largest data with its stat and headers (ZooKeeper's
	// clients allow 1 KiB above jute.maxbuffer).
	maxRelayPacket = fsm.MaxZnodeData + 1024
	// maxQueued bounds the bytes queued to one connection; a client
	// that reads slower is disconnected.
	maxQueued = 64 << 20
)

// Config configures the ZooKeeper front.
type Config struct {
	// Advertise is the address (host:port) the other members reach this
	// node's plaintext ZooKeeper listener at; the leader publishes it, and
	// a follower relays to it when the leader does not take relay
	// connections over the peer port (an older release). "": none.
	Advertise string
	// MinSessionTimeout and MaxSessionTimeout bound a negotiated session
	// timeout (ZooKeeper's minSessionTimeout and maxSessionTimeout);
	// zero: the defaults.
	MinSessionTimeout, MaxSessionTimeout time.Duration
	// MaxWatches bounds the watches of one connection; zero: the default.
	MaxWatches int
	// MaxWatchBytes bounds the watches of all connections together,
	// each counted as its path and 128 bytes; zero: the default.
	MaxWatchBytes int64
	// MaxClientCnxns bounds the connections from one IP address
	// (ZooKeeper's maxClientCnxns): past it a new connection is closed
	// at once, as ZooKeeper closes it. Zero: the default; negative: no
	// bound (ZooKeeper's 0).
	MaxClientCnxns int
	// ContainerCheckInterval is how often the leader removes the
	// containers that have no children and had one once, and the TTL
	// nodes that have no children and were not changed for their TTL
	// (ZooKeeper's container manager); zero:
	// DefaultContainerCheckInterval.
	ContainerCheckInterval time.Duration
	// TTLNodes lets clients create TTL nodes (createTTL, create modes 5
	// and 6), as ZooKeeper's zookeeper.extendedTypesEnabled does; off,
	// they are answered Unimplemented, as ZooKeeper answers them by
	// default. The leader's flag decides (followers relay writes to it);
	// TTL nodes that exist are removed when they expire either way.
	TTLNodes bool
	// Logger receives the front's log; nil: the server's.
	Logger *slog.Logger
}

// Server is the ZooKeeper front of one node. It is safe for concurrent
// use.
type Server struct {
	srv   *server.Server
	front server.Front
	cfg   Config
	log   *slog.Logger
	w     *watches
	// relayLis takes the relay connections followers open over the peer
	// port (nil standalone), from New on: they wait for Serve.
	relayLis net.Listener

	// mu guards conns, perIP, created, createdPerIP, members, sessions
	// and closed.
	mu    sync.Mutex
	conns map[*conn]struct{}
	perIP map[string]int // connections from each IP address
	// created: the live sessions created through this node, with the IP
	// address of the client that created each (maxSessionsPerIP).
	created      map[uint64]string
	createdPerIP map[string]int
	// members: the other members' IP addresses, exempt from the
	// per-address bounds (a follower relays all its clients'
	// connections).
	members  map[string]bool
	sessions map[uint64]map[*conn]struct{}
	closed   bool
	wg       sync.WaitGroup

	// queued counts the bytes queued to every connection (conn.queue).
	queued atomic.Int64

	// relayMu guards relayRefused: the leaders that refused a relay
	// connection over the peer port, and until when they are reached at
	// their published address instead (upstream.go).
	relayMu      sync.Mutex
	relayRefused map[string]time.Time
}

// New returns the ZooKeeper front of srv. It serves once Serve is called;
// from New on, the relay connections followers open to this node over
// the peer port are taken, and wait for Serve.
func New(srv *server.Server, cfg Config) (*Server, error) {
	if cfg.MinSessionTimeout == 0 {
		cfg.MinSessionTimeout = DefaultMinSessionTimeout
	}
	if cfg.MaxSessionTimeout == 0 {
		cfg.MaxSessionTimeout = DefaultMaxSessionTimeout
	}
	if cfg.MaxWatches == 0 {
		cfg.MaxWatches = DefaultMaxWatches
	}
	if cfg.MaxWatchBytes == 0 {
		cfg.MaxWatchBytes = DefaultMaxWatchBytes
	}
	if cfg.MaxClientCnxns == 0 {
		cfg.MaxClientCnxns = DefaultMaxClientCnxns
	}
	if cfg.ContainerCheckInterval == 0 {
		cfg.ContainerCheckInterval = DefaultContainerCheckInterval
	}
	if cfg.ContainerCheckInterval < 0 {
		return nil, fmt.Errorf("zookeeper container check interval %v: it must be positive", cfg.ContainerCheckInterval)
	}
	minMs, maxMs := cfg.MinSessionTimeout.Milliseconds(), cfg.MaxSessionTimeout.Milliseconds()
	if minMs < fsm.MinSessionTTLMs || maxMs > fsm.MaxSessionTTLMs || minMs > maxMs {
		return nil, fmt.Errorf("zookeeper session timeouts %v..%v: the minimum must be at least 1s, the maximum at most 1h and not below the minimum", cfg.MinSessionTimeout, cfg.MaxSessionTimeout)
	}
	front := srv.Front()
	z := &Server{srv: srv, front: front, cfg: cfg, log: cmpLogger(cfg.Logger, front.Logger()), w: newWatches(cfg.MaxWatchBytes),
		conns: map[*conn]struct{}{}, perIP: map[string]int{}, created: map[uint64]string{}, createdPerIP: map[string]int{},
		sessions: map[uint64]map[*conn]struct{}{}, relayRefused: map[string]time.Time{}}
	z.w.ended = z.sessionEnded
	z.relayLis = front.ZkRelayListener()
	front.OnZnodeEvents(z.w.event)
	var rev uint64
	front.Read(func(st *fsm.State) { rev = st.Revision() })
	z.w.mu.Lock()
	z.w.fed = max(z.w.fed, rev)
	z.w.mu.Unlock()
	return z, nil
}

func cmpLogger(a, b *slog.Logger) *slog.Logger {
	if a != nil {
		return a
	}
	return b
}

// Serve accepts ZooKeeper clients on lis (plaintext) and secure (a TLS
// listener, tls.NewListener), either of which may be nil, and the
// connections followers relay to this node over the peer port, until
// ctx ends or a listener fails; it publishes this node's plaintext
// address while it leads.
func (z *Server) Serve(ctx context.Context, lis, secure net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	z.wg.Add(3)
	go func() {
		defer z.wg.Done()
		z.publish(ctx)
	}()
	go func() {
		defer z.wg.Done()
		z.refreshMembers(ctx)
	}()
	go func() {
		defer z.wg.Done()
		z.removeContainers(ctx)
	}()
	type door struct {
		lis   net.Listener
		relay bool
	}
	var doors []door
	for _, l := range []net.Listener{lis, secure} {
		if l != nil {
			doors = append(doors, door{lis: l})
		}
	}
	if z.relayLis != nil {
		doors = append(doors, door{lis: z.relayLis, relay: true})
	}
	errc := make(chan error, len(doors))
	for _, d := range doors {
		go func() { errc <- z.accept(ctx, d.lis, d.relay) }()
	}
	var err error
	for range doors {
		e := <-errc
		if err == nil && e != nil {
			err = e
		}
		cancel() // one door failed or ctx ended: all close
	}
	return err
}

// accept serves lis's connections until it is closed or ctx ends; relay:
// they are followers' relays, each starting with a preamble that names
// its client (upstream.go).
func (z *Server) accept(ctx context.Context, lis net.Listener, relay bool) error {
	stop := context.AfterFunc(ctx, func() { lis.Close() })
	defer func() {
		stop()
		lis.Close()
	}()
	for {
		nc, err := lis.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		c := newConn(z, nc)
		c.relayed = relay
		// A relay over the peer port comes from a member that proved
		// itself; one by a member's published address from its host.
		c.member = relay || z.isMember(c.ip)
		z.mu.Lock()
		if z.closed {
			z.mu.Unlock()
			nc.Close()
			return nil
		}
		if !c.member {
			if n := z.perIP[c.ip]; z.cfg.MaxClientCnxns > 0 && n >= z.cfg.MaxClientCnxns {
				z.mu.Unlock()
				// Counted before the client sees its connection closed.
				z.srv.Answered("zk.connect", status.Errorf(codes.ResourceExhausted, "too many connections from %s - max is %d (--zk-max-client-cnxns)", c.ip, n), true, 0)
				nc.Close()
				continue
			}
			z.perIP[c.ip]++
			c.countedIP = c.ip
		}
		z.conns[c] = struct{}{}
		z.wg.Add(1)
		z.mu.Unlock()
		go func() {
			defer z.wg.Done()
			var err error
			if relay {
				err = c.readPreamble()
			} else {
				err = c.tlsHandshake(ctx)
			}
			if err != nil {
				z.log.Debug("zookeeper connection refused", "remote", c.remote, "relay", relay, "err", err)
				c.close()
				z.detach(c)
				return
			}
			c.serve(ctx)
		}()
	}
}

// Stats is what a node's ZooKeeper front holds, for its metrics.
type Stats struct {
	// Connections: client connections served (a follower counts those it
	// relays to the leader too); Relayed: connections followers relay to
	// this node over the peer port (their clients, counted on the
	// follower as well).
	Connections, Relayed int
	// Watches: watches registered (one-shot and persistent), WatchBytes
	// what they count against --zk-max-watch-bytes.
	Watches    int
	WatchBytes int64
	// QueuedBytes: answers and events waiting to be written to their
	// clients, all connections together.
	QueuedBytes int64
}

// Stats reads the front's sizes; it takes the front's locks briefly.
func (z *Server) Stats() Stats {
	var st Stats
	z.mu.Lock()
	for c := range z.conns {
		if c.relayed {
			st.Relayed++
		} else {
			st.Connections++
		}
	}
	z.mu.Unlock()
	z.w.mu.Lock()
	st.Watches, st.WatchBytes = z.w.count, z.w.bytes
	z.w.mu.Unlock()
	st.QueuedBytes = z.queued.Load()
	return st
}

// Close closes every connection and waits for their goroutines. It is
// idempotent.
func (z *Server) Close() {
	z.mu.Lock()
	z.closed = true
	conns := make([]*conn, 0, len(z.conns))
	for c := range z.conns {
		conns = append(conns, c)
	}
	z.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
	z.front.OnZnodeEvents(nil)
	z.wg.Wait()
}

func (z *Server) attach(c *conn) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.sessions[c.session] == nil {
		z.sessions[c.session] = map[*conn]struct{}{}
	}
	z.sessions[c.session][c] = struct{}{}
}

func (z *Server) detach(c *conn) {
	z.mu.Lock()
	defer z.mu.Unlock()
	delete(z.conns, c)
	if ip := c.countedIP; ip != "" {
		c.countedIP = ""
		if z.perIP[ip]--; z.perIP[ip] <= 0 {
			delete(z.perIP, ip)
		}
	}
	if set := z.sessions[c.session]; set != nil {
		delete(set, c)
		if len(set) == 0 {
			delete(z.sessions, c.session)
		}
	}
}

// evictSlowest closes the connection with the most bytes queued, the
// slowest reader, once the connections together pass maxQueuedTotal.
// Lock order: mu, then a connection's out.mu.
func (z *Server) evictSlowest() {
	z.mu.Lock()
	var slowest *conn
	most := 0
	for c := range z.conns {
		if n := c.queuedBytes(); n > most {
			slowest, most = c, n
		}
	}
	z.mu.Unlock()
	if slowest != nil && z.queued.Load() > maxQueuedTotal {
		z.log.Info("zookeeper connection closed: the slowest reader while the connections' queues pass their bound", "remote", slowest.remote, "session", slowest.session, "queued", most)
		slowest.close()
	}
}

// membersEvery is how often the members' addresses are read again.
const membersEvery = 5 * time.Second

// isMember reports whether ip is another member's (the host of its peer
// address, resolved): a follower relaying its clients' connections,
// exempt from the per-address bounds.
func (z *Server) isMember(ip string) bool {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.members[ip]
}

// refreshMembers reads the other members' addresses every membersEvery
// until ctx ends (name lookups stay off the accept loop), and prunes the
// sessions created here (pruneCreated).
func (z *Server) refreshMembers(ctx context.Context) {
	t := time.NewTicker(membersEvery)
	defer t.Stop()
	for {
		if ms, err := z.front.Members(); err == nil {
			set := map[string]bool{}
			for _, m := range ms {
				host, _, err := net.SplitHostPort(m.PeerAddr)
				if err != nil || m.ID == z.front.NodeID() {
					continue
				}
				set[host] = true
				if net.ParseIP(host) == nil {
					lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
					addrs, _ := net.DefaultResolver.LookupIPAddr(lctx, host)
					cancel()
					for _, a := range addrs {
						set[a.IP.String()] = true
					}
				}
			}
			z.mu.Lock()
			z.members = set
			z.mu.Unlock()
		}
		z.pruneCreated()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pruneCreated forgets the sessions created here that the state no
// longer has, whose end this node did not see as an event (it installed
// a snapshot meanwhile). A follower may forget one the leader created
// that it has not applied yet: the bound errs on the loose side.
func (z *Server) pruneCreated() {
	z.mu.Lock()
	ids := make([]uint64, 0, len(z.created))
	for id := range z.created {
		ids = append(ids, id)
	}
	z.mu.Unlock()
	var gone []uint64
	z.front.Read(func(st *fsm.State) {
		for _, id := range ids {
			if _, ok := st.Session(id); !ok {
				gone = append(gone, id)
			}
		}
	})
	z.mu.Lock()
	defer z.mu.Unlock()
	for _, id := range gone {
		if ip, ok := z.created[id]; ok {
			delete(z.created, id)
			if z.createdPerIP[ip]--; z.createdPerIP[ip] <= 0 {
				delete(z.createdPerIP, ip)
			}
		}
	}
}

// maxSessionsPerIP bounds the live sessions created through this node by
// the clients of one IP address: a session outlives its connection by
// its timeout, so the connections' bound alone leaves a client free to
// fill the cluster's --max-sessions by connecting again and again.
func (z *Server) maxSessionsPerIP() int {
	if z.cfg.MaxClientCnxns <= 0 {
		return 0
	}
	return sessionsPerCnxn * z.cfg.MaxClientCnxns
}

// sessionsPerCnxn: the live sessions an address may have created, per
// connection it may hold (room for clients restarted before their old
// sessions expired).
const sessionsPerCnxn = 10

// admitSession reports whether c's client may create a session.
func (z *Server) admitSession(c *conn) bool {
	limit := z.maxSessionsPerIP()
	if limit == 0 || c.member {
		return true
	}
	z.mu.Lock()
	n := z.createdPerIP[c.ip]
	z.mu.Unlock()
	if n < limit {
		return true
	}
	z.srv.Answered("zk.connect", status.Errorf(codes.ResourceExhausted, "too many sessions from %s - max is %d (10 × --zk-max-client-cnxns)", c.ip, limit), true, 0)
	return false
}

// sessionCreated records a session created by c's client.
func (z *Server) sessionCreated(c *conn) {
	if c.member {
		return
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	if _, ok := z.created[c.session]; !ok {
		z.created[c.session] = c.ip
		z.createdPerIP[c.ip]++
	}
}

// sessionEnded closes the connections of a session that ended: the
// client, reconnecting, learns that it expired. It runs on the apply
// path and does not block.
func (z *Server) sessionEnded(id uint64) {
	z.mu.Lock()
	if ip, ok := z.created[id]; ok {
		delete(z.created, id)
		if z.createdPerIP[ip]--; z.createdPerIP[ip] <= 0 {
			delete(z.createdPerIP, ip)
		}
	}
	var conns []*conn
	for c := range z.sessions[id] {
		conns = append(conns, c)
	}
	z.mu.Unlock()
	for _, c := range conns {
		if !c.ending.Load() {
			c.close()
		}
	}
}

// publishInterval is how often the leader checks that the state has its
// ZooKeeper address.
const publishInterval = time.Second

// publish commits this node's ZooKeeper address while it leads (a
// follower needs the leader's only).
func (z *Server) publish(ctx context.Context) {
	if z.cfg.Advertise == "" {
		return
	}
	t := time.NewTicker(publishInterval)
	defer t.Stop()
	for {
		if z.front.CaughtUpLeader() {
			var have string
			var cv uint32
			id := z.front.NodeID()
			z.front.Read(func(st *fsm.State) { have, cv = st.ZkAddr(id), st.ClusterVersion() })
			if have != z.cfg.Advertise && cv >= 3 {
				pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := z.front.Propose(pctx, server.ZkSetAddr{SetEtcdURL: &fsmpb.SetEtcdURL{Member: id, Url: z.cfg.Advertise}})
				cancel()
				if err != nil && ctx.Err() == nil {
					z.log.Debug("publishing the ZooKeeper address", "err", err)
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// removeContainers is ZooKeeper's container manager: while this node
// leads, every ContainerCheckInterval it proposes the removal of each
// container that has no children and had one once, one command each
// (ZkDelete.container), then of each TTL node that has no children and
// whose mtime is more than its TTL before now (ZkDelete.ttl), at most
// ContainerMaxPerMinute a minute together. A container that got a child
// since it was read is left by the state machine (NotEmpty), as
// ZooKeeper's deleteContainer leaves it; a TTL node that was set or got a
// child since it was read, or has not expired at the command's time, is
// left too (the command carries what the check read and this node's
// clock); so is everything when leadership moves (the new leader checks
// on its own interval).
func (z *Server) removeContainers(ctx context.Context) {
	every := z.cfg.ContainerCheckInterval
	perRound := max(1, min(ContainerMaxPerMinute, int(int64(ContainerMaxPerMinute)*int64(every)/int64(time.Minute))))
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !z.front.CaughtUpLeader() {
			continue
		}
		var txns []*fsmpb.ZkTxn
		now := time.Now().UnixMilli()
		z.front.Read(func(st *fsm.State) {
			if st.ClusterVersion() < 3 {
				return
			}
			for _, p := range st.ZnodeContainerCandidates(perRound) {
				txns = append(txns, &fsmpb.ZkTxn{Ops: []*fsmpb.ZkOp{{Op: &fsmpb.ZkOp_Delete{
					Delete: &fsmpb.ZkDelete{Path: p, Version: -1, Container: true}}}}})
			}
			for _, c := range st.ZnodeTTLCandidates(now, perRound-len(txns)) {
				txns = append(txns, &fsmpb.ZkTxn{TimeMs: now, Ops: []*fsmpb.ZkOp{{Op: &fsmpb.ZkOp_Delete{
					Delete: &fsmpb.ZkDelete{Path: c.Path, Version: -1, Ttl: true, SeenMzxid: c.Mzxid, SeenCversion: c.Cversion}}}}})
			}
		})
		for _, txn := range txns {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			res, err := z.front.Propose(pctx, txn)
			cancel()
			if res.Err != nil {
				z.log.Debug("container or TTL node left", "path", txn.GetOps()[0].GetDelete().GetPath(), "err", res.Err)
				continue
			}
			if err != nil {
				if ctx.Err() == nil {
					z.log.Debug("removing emptied containers and expired TTL nodes", "err", err)
				}
				break
			}
		}
	}
}

// leaderAddr is the leader's ZooKeeper address, "" when unknown.
func (z *Server) leaderAddr() string {
	leader := z.front.Leader()
	if leader == "" {
		return ""
	}
	var addr string
	z.front.Read(func(st *fsm.State) { addr = st.ZkAddr(leader) })
	return addr
}

// negotiate clamps a requested session timeout as ZooKeeper does.
func (z *Server) negotiate(ms int32) int64 {
	v := int64(ms)
	return min(max(v, z.cfg.MinSessionTimeout.Milliseconds()), z.cfg.MaxSessionTimeout.Milliseconds())
}

// newSecret draws a session password.
func newSecret() []byte {
	b := make([]byte, fsm.SecretBytes)
	_, _ = rand.Read(b)
	return b
}

// digestID is ZooKeeper's digest id of "user:password":
// user:base64(sha1(user:password)).
func digestID(userPassword string) string {
	user := userPassword
	for i := 0; i < len(userPassword); i++ {
		if userPassword[i] == ':' {
			user = userPassword[:i]
			break
		}
	}
	h := sha1.Sum([]byte(userPassword))
	return user + ":" + base64.StdEncoding.EncodeToString(h[:])
}
