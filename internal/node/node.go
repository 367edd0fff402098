// Package node wires the state machine to hashicorp/raft: it opens the
// durable stores, bootstraps a single voter when the data directory is new,
// proposes commands, serves linearizable reads, and hands leadership changes
// to the lessor, which owns time.
//
// The data path is: RPC → Propose (raft.Apply, fsynced and committed) →
// fsm.Apply on every replica → the result returns to the proposer and the
// events go to the lessor and to the waiting clients.
package node

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/clock"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/lessor"
	"github.com/tenure-io/tenure/internal/logging"
	"github.com/tenure-io/tenure/internal/store"
)

var (
	// ErrNotLeader: this node is not the leader, so it cannot commit or
	// serve a linearizable read.
	ErrNotLeader = errors.New("tenure: this node is not the leader")
	// ErrUnknownOutcome: the command may or may not have been committed
	// (leadership was lost or the wait timed out after it was sent).
	ErrUnknownOutcome = errors.New("tenure: outcome unknown")
	// ErrClosed: the node is shutting down.
	ErrClosed = errors.New("tenure: node is shutting down")
	// ErrStorageFull: this node could not write to its disk for want of
	// space, and no other node leads. The command was not committed (raft
	// stores an entry on the leader before it sends it anywhere); it may
	// be retried once there is room. The node takes writes again by itself
	// once a write succeeds.
	ErrStorageFull = errors.New("tenure: storage full")
)

// Config configures a node. Zero values mean the defaults.
type Config struct {
	// NodeID names this node in the raft configuration. Default "n1".
	NodeID string
	// DataDir holds the raft log, stable store and snapshots.
	DataDir string
	// ApplyTimeout bounds how long a proposal may wait to be committed when
	// the caller's context has no deadline. Default 10s.
	ApplyTimeout time.Duration
	// Clock drives session deadlines. Default clock.Real.
	Clock clock.Clock
	// Logger receives the node's log, raft's included. Default: text at
	// info on LogOutput.
	Logger *slog.Logger
	// LogOutput is where the default Logger writes. Default stderr.
	LogOutput io.Writer
	// SnapshotThreshold is how many log entries trigger a snapshot.
	// Default 16384.
	SnapshotThreshold uint64
	// SnapshotBytes: a snapshot is also taken once this many bytes of log
	// entries were stored since the last one, so that the log a restart
	// replays stays bounded when entries are large (batches of queue
	// items). Default DefaultSnapshotBytes; negative: entries only.
	SnapshotBytes int64
	// LogStore names the storage engine: "bolt" or "wal"; "" is the data
	// directory's own, or store.DefaultEngine (wal) for a new one.
	LogStore string
	// PeerAddr is the raft peer address (TCP) this node binds and, unless
	// PeerAdvertise is set, advertises. Empty: a standalone node.
	PeerAddr string
	// PeerAdvertise is the peer address other members dial, when it differs
	// from PeerAddr (NAT, or a proxy in front of the node).
	PeerAdvertise string
	// PeerTLS, if set, puts raft's peer traffic over mutual TLS: it is
	// called for every peer connection, in both directions, and returns
	// the configuration to use (certificates, the peers' CA as RootCAs
	// and ClientCAs, client certificates required); see peertls.go.
	PeerTLS func() *tls.Config
	// Faults are the fault-injection switches; the type is empty unless
	// built with the tenurefault tag (see faults.go).
	Faults Faults
	// BootstrapPeers maps node id → peer address for every initial voter.
	// Used only when the data directory is new; later starts ignore it.
	// Empty with a PeerAddr (and no Join): the node bootstraps itself as
	// a single voter that others may join.
	BootstrapPeers map[string]string
	// Join: a new data directory is not bootstrapped at all; the node waits,
	// with an empty log, until a cluster's leader adds it (tenure member
	// add, or member rebuild for a member whose data was lost). Needs a
	// PeerAddr and no BootstrapPeers; later starts ignore it. A node that
	// bootstrapped itself instead would have a log of its own, which
	// joining a cluster could not reconcile with the cluster's.
	Join bool
	// LockHistory and RegisterOpMemory, when positive, are the grant
	// records kept per lock and the operation ids remembered per fenced
	// register. They are cluster-wide, replicated settings: a node that
	// becomes leader with a value that differs from the state's proposes
	// it. Zero keeps the cluster's current setting (initially fsm's
	// HistoryLimit and OpMemory).
	LockHistory, RegisterOpMemory int
	// Limits, where non-zero, are the replicated admission limits this
	// node proposes when it becomes leader and the state's differ (like
	// LockHistory). Zero fields keep the cluster's current values; a
	// running cluster's limits are changed with SetLimits.
	Limits fsm.Limits
	// GroupCommitWait is the longest a batch smaller than the previous
	// one waits for more proposals before it is written (see lingerProbe).
	// Zero means DefaultGroupCommitWait; negative disables the wait.
	GroupCommitWait time.Duration
	// Observer, if set, receives the node's measurements (observe.go).
	Observer Observer
}

// DefaultSnapshotBytes is the default Config.SnapshotBytes: about a
// second of replay on the reference machine.
const DefaultSnapshotBytes = 256 << 20

// DefaultGroupCommitWait is the default Config.GroupCommitWait: about one
// round trip of a client on the same host under load, and less than half a
// commit on a local SSD.
const DefaultGroupCommitWait = 300 * time.Microsecond

// DefaultConfig returns the defaults for a single durable node.
func DefaultConfig() Config {
	return Config{NodeID: "n1", DataDir: "tenure-data", ApplyTimeout: 10 * time.Second, Clock: clock.Real, LogOutput: os.Stderr, SnapshotThreshold: 16384}
}

func (c *Config) fill() {
	d := DefaultConfig()
	if c.NodeID == "" {
		c.NodeID = d.NodeID
	}
	if c.DataDir == "" {
		c.DataDir = d.DataDir
	}
	if c.ApplyTimeout == 0 {
		c.ApplyTimeout = d.ApplyTimeout
	}
	if c.Clock == nil {
		c.Clock = d.Clock
	}
	if c.LogOutput == nil {
		c.LogOutput = d.LogOutput
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(c.LogOutput, nil))
	}
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = d.SnapshotThreshold
	}
	if c.SnapshotBytes == 0 {
		c.SnapshotBytes = DefaultSnapshotBytes
	}
	if c.GroupCommitWait == 0 {
		c.GroupCommitWait = DefaultGroupCommitWait
	}
}

// Node is one replica of the lock authority.
type Node struct {
	cfg    Config
	raft   *raft.Raft
	fsm    *fsm.FSM
	lessor *lessor.Lessor
	stores *store.Stores
	snaps  raft.SnapshotStore
	trans  raft.Transport
	rec    *recorder
	leadCh chan bool
	ready  chan struct{}

	proposals chan *proposal
	slots     chan struct{}
	applying  chan inflight
	quit      chan struct{}
	wg        sync.WaitGroup
	probes    sync.WaitGroup // RPCs to peers in flight (membership.go)

	// readTerm is the term in which this node, as leader, has committed
	// and applied an entry of its own (see LinearizableRead).
	readTerm atomic.Uint64
	// logBytes counts the bytes of log entries stored since the last
	// snapshot; snapKick asks for one (see logStored).
	logBytes atomic.Int64
	snapKick chan struct{}
	// fsmApplied is the index of the last entry the state machine has
	// applied, or of the snapshot it started from (see caughtUp).
	fsmApplied atomic.Uint64
	// opened is when Open returned, with raft's applied index then: the
	// start of the log's replay (see markReady).
	opened      time.Time
	openedIndex uint64
	// startIndex is the highest index this node had applied before it
	// started (its applied record): its state is not loaded below it.
	startIndex uint64

	// lease is until when this node may confirm keepalives (see KeepAlive).
	lease leaderLease

	// lastBatch is the size of the last batch answered (see lingerProbe).
	lastBatch atomic.Int64

	// hooksMu guards onDemote and onPromote.
	hooksMu   sync.Mutex
	onDemote  []func()
	onPromote []func(context.Context)

	readyOnce sync.Once
	closeOnce sync.Once
	closeErr  error
}

// Open opens the data directory and starts raft. sink receives every
// state-machine event (after the lessor has seen it); it must not block.
func Open(cfg Config, sink fsm.EventSink) (*Node, error) {
	start := time.Now()
	cfg.fill()
	if err := fsm.ValidateRetention(cfg.LockHistory, cfg.RegisterOpMemory); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return nil, fmt.Errorf("node: creating data dir: %w", err)
	}
	n := &Node{
		cfg: cfg, leadCh: make(chan bool, 16), ready: make(chan struct{}),
		proposals: make(chan *proposal, maxBatch), slots: make(chan struct{}, maxInflight),
		applying: make(chan inflight, maxInflight), quit: make(chan struct{}), snapKick: make(chan struct{}, 1),
	}
	n.fsm = fsm.New(func(e fsm.Event) {
		n.lessor.Observe(e)
		if sink != nil {
			sink(e)
		}
	})
	cfg.Faults.applyTo(n.fsm)
	n.lessor = lessor.New(cfg.Clock, n.proposeForLessor, n.fsm.Read)

	stores, err := store.Open(filepath.Join(cfg.DataDir, "raft"), cfg.LogStore, cfg.LogOutput)
	if err != nil {
		return nil, err
	}
	if cfg.Observer != nil {
		stores.Log = store.TimeAppends(stores.Log, cfg.Observer.LogAppend)
	}
	n.stores = stores
	var routine []string
	if cfg.PeerAddr == "" {
		// A single voter elects itself after one heartbeat timeout: expected.
		routine = append(routine, "heartbeat timeout reached, starting election")
	}
	logger := logging.Raft(cfg.Logger, routine...)
	snaps, err := raft.NewFileSnapshotStoreWithLogger(filepath.Join(cfg.DataDir, "snapshots"), 2, logger)
	if err != nil {
		stores.Close()
		return nil, fmt.Errorf("node: snapshot store: %w", err)
	}
	n.snaps = snaps
	// The data directory's integrity (integrity.go), before raft reads it.
	checkStart := time.Now()
	newest, err := checkSnapshots(cfg.DataDir, snaps)
	if err != nil {
		stores.Close()
		return nil, err
	}
	snapChecked := time.Now()
	if n.rec, err = openRecord(filepath.Join(cfg.DataDir, "raft", recordFile), stores.Log, stores.Stable, snaps, logging.Writer(cfg.Logger, slog.LevelError)); err != nil {
		stores.Close()
		return nil, err
	}
	n.startIndex = n.rec.record().Index
	var snapIndex uint64
	if newest != nil {
		snapIndex = newest.Index
	}
	if err := checkLog(stores, snapIndex); err != nil {
		stores.Close()
		return nil, err
	}
	logChecked := time.Now()
	if err := n.rec.startRecord(stores.Stable); err != nil {
		stores.Close()
		return nil, err
	}
	var addr raft.ServerAddress
	var trans raft.Transport
	if cfg.PeerAddr == "" {
		addr, trans = raft.NewInmemTransport(raft.ServerAddress(cfg.NodeID))
	} else {
		advertise := cfg.PeerAddr
		if cfg.PeerAdvertise != "" {
			advertise = cfg.PeerAdvertise
		}
		adv, err := net.ResolveTCPAddr("tcp", advertise)
		if err != nil {
			stores.Close()
			return nil, fmt.Errorf("node: peer address %q: %w", advertise, err)
		}
		nc := &raft.NetworkTransportConfig{
			ServerAddressProvider: cfg.Faults.addressProvider(), Logger: logger, MaxPool: 3, Timeout: 10 * time.Second,
		}
		var tcp *raft.NetworkTransport
		if cfg.PeerTLS != nil {
			tcp, err = newTLSTransport(cfg.PeerAddr, adv, cfg.PeerTLS, nc)
		} else {
			tcp, err = raft.NewTCPTransportWithConfig(cfg.PeerAddr, adv, nc)
		}
		if err != nil {
			stores.Close()
			return nil, fmt.Errorf("node: peer listener on %s: %w", cfg.PeerAddr, err)
		}
		addr, trans = tcp.LocalAddr(), tcp
	}
	n.trans = trans

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.Logger = logger
	rc.NotifyCh = n.leadCh
	rc.BatchApplyCh = true
	rc.MaxAppendEntries = 256
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.TrailingLogs = 10240
	// A member removed from the configuration stays up as a follower that
	// answers "not the leader" (and can be added again); raft's default
	// shuts raft down under the running node, whose proposals then hang.
	rc.ShutdownOnRemove = false
	// Failure detection: a follower that hears nothing from the leader for
	// HeartbeatTimeout (randomised up to twice that) starts an election.
	// 500 ms keeps fail-over near one second on loopback while tolerating
	// scheduling stalls of a busy 2-core machine; raft's defaults (1 s) fail
	// over in about two seconds.
	rc.HeartbeatTimeout = 500 * time.Millisecond
	rc.ElectionTimeout = 500 * time.Millisecond
	rc.LeaderLeaseTimeout = 250 * time.Millisecond
	if cfg.PeerAddr == "" {
		// A standalone voter elects itself after one heartbeat timeout.
		rc.HeartbeatTimeout = 200 * time.Millisecond
		rc.ElectionTimeout = 200 * time.Millisecond
		rc.LeaderLeaseTimeout = 100 * time.Millisecond
	}

	existing, err := raft.HasExistingState(stores.Log, stores.Stable, snaps)
	if err != nil {
		stores.Close()
		return nil, fmt.Errorf("node: reading state: %w", err)
	}
	switch {
	case existing:
	case cfg.Join:
		if cfg.PeerAddr == "" || len(cfg.BootstrapPeers) > 0 {
			stores.Close()
			return nil, errors.New("node: joining a cluster needs a peer address and no bootstrap peers")
		}
		fmt.Fprintf(cfg.LogOutput, "tenure: node %s has no state and waits to be added to a cluster: run tenure member add %s %s against it (member rebuild for a member that lost its data)\n", cfg.NodeID, cfg.NodeID, addr)
	default:
		boot := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: rc.LocalID, Address: addr}}}
		if len(cfg.BootstrapPeers) > 0 {
			if _, self := cfg.BootstrapPeers[cfg.NodeID]; !self {
				stores.Close()
				return nil, fmt.Errorf("node: --bootstrap-peers does not name this node (%s)", cfg.NodeID)
			}
			boot.Servers = nil
			for _, id := range slices.Sorted(maps.Keys(cfg.BootstrapPeers)) {
				boot.Servers = append(boot.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(id), Address: raft.ServerAddress(cfg.BootstrapPeers[id])})
			}
		}
		if err := raft.BootstrapCluster(rc, stores.Log, stores.Stable, snaps, trans, boot); err != nil {
			stores.Close()
			return nil, fmt.Errorf("node: bootstrap: %w", err)
		}
	}
	// Raft restores the newest snapshot (checked above) before it starts.
	n.fsmApplied.Store(snapIndex)
	raftStart := time.Now()
	ss := &startSnapshots{FileSnapshotStore: snaps, dir: snapshotsDir(cfg.DataDir), newest: newest}
	r, err := raft.NewRaft(rc, recordingFSM{n.fsm, n.rec, &n.fsmApplied, cfg.Logger, &n.logBytes}, checkedAppends{stores.Log, n.logStored}, stores.Stable, ss, trans)
	if err != nil {
		stores.Close()
		if ferr := n.fsm.Err(); ferr != nil && newest != nil { // the newest snapshot did not decode, or failed its checksum
			if ss.crcMismatch() {
				ferr = errSnapshotCRC
			}
			return nil, fmt.Errorf("node: snapshot %s (index %d) is damaged: %v; %s", filepath.Join(snapshotsDir(cfg.DataDir), newest.ID), newest.Index, ferr, store.Remedy)
		}
		return nil, fmt.Errorf("node: starting raft: %w", err)
	}
	n.raft = r
	n.opened, n.openedIndex = time.Now(), r.AppliedIndex()
	lastIndex, _ := stores.Log.LastIndex()
	cfg.Logger.Info("data directory opened", "ms", n.opened.Sub(start).Milliseconds(),
		"snapshot_check_ms", snapChecked.Sub(checkStart).Milliseconds(), "log_check_ms", logChecked.Sub(snapChecked).Milliseconds(),
		"snapshot_restore_ms", n.opened.Sub(raftStart).Milliseconds(), "snapshot_index", snapIndex, "last_log_index", lastIndex)
	n.observeLeaders()
	n.wg.Add(4)
	go n.batcher()
	go n.answerer()
	go func() { defer n.wg.Done(); n.rec.run(n.quit) }()
	go n.snapshotter()
	return n, nil
}

// logStored counts bytes of log entries stored (checkedAppends) and asks
// for a snapshot once Config.SnapshotBytes of them came since the last.
func (n *Node) logStored(bytes int) {
	if n.cfg.SnapshotBytes > 0 && n.logBytes.Add(int64(bytes)) >= n.cfg.SnapshotBytes {
		select {
		case n.snapKick <- struct{}{}:
		default:
		}
	}
}

// snapshotter takes the snapshots logStored asks for, until the node
// closes. raft's own (by entries) go on as before; either resets the count.
func (n *Node) snapshotter() {
	defer n.wg.Done()
	for {
		select {
		case <-n.quit:
			return
		case <-n.snapKick:
		}
		if n.logBytes.Load() < n.cfg.SnapshotBytes {
			continue // one was taken meanwhile
		}
		start := time.Now()
		if err := n.settle(n.raft.Snapshot()); err != nil { // ends at Close too
			n.cfg.Logger.Debug("snapshot by log size", "err", err)
			continue
		}
		n.cfg.Logger.Info("snapshot taken", "reason", "log size", "ms", time.Since(start).Milliseconds())
	}
}

// Run follows leadership changes and runs the lessor until ctx ends. It
// returns early, with an error saying what to do, if this node becomes
// leader and finds its state below the revision it recorded (see
// record.go), or if the state machine meets a log entry or snapshot that
// fails its checksum or does not decode (integrity.go): it must not serve
// then.
func (n *Node) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	lctx, cancel := context.WithCancel(ctx)
	defer func() { cancel(); wg.Wait() }()
	wg.Add(1)
	go func() { defer wg.Done(); _ = n.lessor.Run(lctx) }()
	wg.Add(1)
	go func() { defer wg.Done(); n.retireKeys(lctx) }() // security.go
	if n.fsm.Err() != nil {
		return n.stopped()
	}
	if n.raft.State() == raft.Leader {
		if err := n.promote(ctx); err != nil {
			return err
		}
	}
	// Ready once Health says so (see Ready); polled until then.
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case <-poll.C:
			if n.markReady() {
				poll.Stop()
			}
		case <-ctx.Done():
			return ctx.Err()
		case <-n.fsm.Failed():
			return n.stopped()
		case isLeader := <-n.leadCh:
			if isLeader {
				if err := n.promote(ctx); err != nil {
					return err
				}
				n.markReady()
			} else {
				n.lessor.Demote()
				n.hooksMu.Lock()
				hooks := n.onDemote
				n.hooksMu.Unlock()
				for _, fn := range hooks {
					fn()
				}
			}
		}
	}
}

// stopped is the error for a state machine that met a corrupt entry or
// snapshot while serving: one line naming the file and what to do.
func (n *Node) stopped() error {
	err := n.fsm.Err()
	var ce *fsm.CorruptEntryError
	if errors.As(err, &ce) {
		return entryError(n.stores, ce.Index, ce.Reason)
	}
	return fmt.Errorf("node: the state machine of %s stopped: %v; %s", n.cfg.DataDir, err, store.Remedy)
}

// promote waits until every committed entry is applied, then hands the
// sessions to the lessor with fresh TTLs plus promoteAllowance. It fails if
// the state is then below the recorded revision.
func (n *Node) promote(ctx context.Context) error {
	term, began := n.raft.CurrentTerm(), n.cfg.Clock.Now()
	if err := n.wait(ctx, n.raft.Barrier(n.cfg.ApplyTimeout)); err != nil {
		return nil // leadership lost again (or the node stops); a new notification follows
	}
	if err := n.checkRevisionCoversRecord(); err != nil {
		return err
	}
	n.readTerm.Store(term)
	n.lease.confirmed(n, term, began) // the barrier is a confirmation too
	n.lessor.Promote(promoteAllowance)
	n.applySettings(ctx)
	n.EnsureSigningKey(ctx) // security.go
	n.hooksMu.Lock()
	hooks := n.onPromote
	n.hooksMu.Unlock()
	for _, fn := range hooks {
		fn(ctx)
	}
	return nil
}

// markReady closes Ready, and logs how long the start took, the first
// time Health says the node is ready; it reports whether Ready is closed.
func (n *Node) markReady() bool {
	select {
	case <-n.ready:
		return true
	default:
	}
	if !n.Health().Ready() {
		return false
	}
	n.readyOnce.Do(func() {
		applied := n.raft.AppliedIndex()
		n.cfg.Logger.Info("ready", "ms_since_open", time.Since(n.opened).Milliseconds(), "log_entries_applied", applied-min(applied, n.openedIndex), "leader", n.raft.State() == raft.Leader)
		close(n.ready)
	})
	return true
}

// applySettings proposes this node's configured retention and limits
// where they differ from the replicated ones.
func (n *Node) applySettings(ctx context.Context) {
	var h, m int
	var limits fsm.Limits
	n.fsm.Read(func(s *fsm.State) {
		h, m = s.Retention()
		limits = s.Limits()
	})
	want := &fsmpb.SetRetention{}
	if n.cfg.LockHistory > 0 && n.cfg.LockHistory != h {
		want.LockHistory = uint32(n.cfg.LockHistory)
	}
	if n.cfg.RegisterOpMemory > 0 && n.cfg.RegisterOpMemory != m {
		want.RegisterOpMemory = uint32(n.cfg.RegisterOpMemory)
	}
	if want.LockHistory != 0 || want.RegisterOpMemory != 0 {
		if _, err := n.Propose(ctx, &fsmpb.Command{Op: &fsmpb.Command_SetRetention{SetRetention: want}}); err != nil {
			n.cfg.Logger.Error("setting retention", "lock_history", n.cfg.LockHistory, "register_op_memory", n.cfg.RegisterOpMemory, "err", err)
		}
	}
	if merged := limits.Merge(n.cfg.Limits); merged != limits {
		if _, err := n.SetLimits(ctx, n.cfg.Limits); err != nil {
			n.cfg.Logger.Error("setting limits", "err", err)
		}
	}
}

// SetLimits commits a change of the replicated admission limits (zero
// fields keep their value) and returns the limits in force after it.
func (n *Node) SetLimits(ctx context.Context, change fsm.Limits) (fsm.Limits, error) {
	cmd := &fsmpb.Command{Op: &fsmpb.Command_SetLimits{SetLimits: &fsmpb.SetLimits{Limits: fsm.LimitsToProto(change)}}}
	if _, err := n.Propose(ctx, cmd); err != nil {
		return fsm.Limits{}, err
	}
	var out fsm.Limits
	n.fsm.Read(func(s *fsm.State) { out = s.Limits() })
	return out, nil
}

// OnDemote registers fn to run each time this node stops being the leader
// (after the lessor has stopped timing sessions). fn must not block.
func (n *Node) OnDemote(fn func()) {
	n.hooksMu.Lock()
	defer n.hooksMu.Unlock()
	n.onDemote = append(n.onDemote, fn)
}

// OnPromote registers fn to run each time this node becomes a leader that
// serves (its state caught up, its settings and signing key proposed), on
// the goroutine that follows leadership: fn may propose, and should
// return soon (ctx ends when the node stops).
func (n *Node) OnPromote(fn func(ctx context.Context)) {
	n.hooksMu.Lock()
	defer n.hooksMu.Unlock()
	n.onPromote = append(n.onPromote, fn)
}

// Ready is closed the first time Health reports the node ready: it knows a
// leader, its state holds everything it knows is committed (its snapshot
// and the log after it applied; as leader, also its term's first entry)
// and its storage accepts a write. /readyz and status report the same
// Health later on.
func (n *Node) Ready() <-chan struct{} { return n.ready }

// Batching: concurrent proposals are committed together as one log entry
// (an fsmpb.Batch), with at most maxInflight entries in raft at once. While
// those are being stored, new proposals accumulate into the next batch, so
// the log pays one entry (and the disk one write) per batch, not per
// command. Order within a batch is arrival order. One entry in flight gave
// the lowest latency here: a proposal waits for at most the entry being
// written, then its own write (with two, it could wait for two).
//
// Group commit: when an entry is answered, its proposers typically come
// back with their next command within one round trip to their clients, and
// so do the clients it woke (a lock hand-off wakes the next holder, who
// releases, while the old holder queues again). If the batcher cut the
// next entry at once it would hold only the few proposals that happened to
// be waiting, and the returning crowd would wait for that entry's whole
// write before getting its own: two writes per round instead of one. So a
// batch smaller than the previous one waits up to Config.GroupCommitWait
// for more proposals, until it is as large as the previous batch. The wait
// adapts: one that ends without gaining a single proposal costs score, and
// with no score left the batcher waits only once every lingerProbe
// batches, so a client that works alone loses at most one wait per
// lingerProbe commits.
const (
	maxBatch    = 1024
	maxInflight = 1
	// Group commit score: +1 per wait that gained company, up to
	// lingerScoreMax; -lingerMissCost per wait that gained nothing.
	lingerProbe    = 64
	lingerScoreMax = 16
	lingerMissCost = 4
	// maxBatchBytes stops a batch from growing past a few large commands
	// (queue payloads may be MiBs): one log entry stays bounded.
	maxBatchBytes = 8 << 20
)

type proposal struct {
	cmd  *fsmpb.Command
	done chan proposeResult
	then func(fsm.Result, error) // instead of done: see ProposeAsync
}

// answer hands the outcome to the proposer.
func (p *proposal) answer(r proposeResult) {
	if p.then != nil {
		p.then(r.res, r.err)
		return
	}
	p.done <- r
}

type proposeResult struct {
	res fsm.Result
	err error
}

type inflight struct {
	f     raft.ApplyFuture
	batch []*proposal
	data  []byte
}

// Propose commits cmd and returns the state machine's result. A state
// machine refusal comes back as the result's Err (also returned as error).
// If ctx ends after the command was handed to raft, the outcome is unknown
// (ErrUnknownOutcome).
func (n *Node) Propose(ctx context.Context, cmd *fsmpb.Command) (fsm.Result, error) {
	p := &proposal{cmd: cmd, done: make(chan proposeResult, 1)}
	select {
	case n.proposals <- p:
	case <-ctx.Done():
		return fsm.Result{}, ctx.Err()
	case <-n.quit:
		return fsm.Result{}, ErrClosed
	}
	select {
	case r := <-p.done:
		return r.res, r.err
	case <-ctx.Done():
		return fsm.Result{}, fmt.Errorf("%w: %v", ErrUnknownOutcome, ctx.Err())
	case <-n.quit:
		return fsm.Result{}, fmt.Errorf("%w: %v", ErrUnknownOutcome, ErrClosed)
	}
}

// ProposeAsync is Propose without waiting: then is called exactly once
// with what Propose would have returned, on the goroutine that answers
// every proposal, so it must be quick and must not block (hand anything
// slow to another goroutine). Commands proposed one after another are
// committed in that order.
func (n *Node) ProposeAsync(cmd *fsmpb.Command, then func(fsm.Result, error)) {
	p := &proposal{cmd: cmd, then: then}
	select {
	case <-n.quit:
		then(fsm.Result{}, ErrClosed)
		return
	default:
	}
	select {
	case n.proposals <- p:
	case <-n.quit:
		then(fsm.Result{}, ErrClosed)
	}
}

// batcher turns queued proposals into log entries.
func (n *Node) batcher() {
	defer n.wg.Done()
	defer close(n.applying)
	defer func() { // the node is closing: nothing queued will be written
		for {
			select {
			case p := <-n.proposals:
				p.answer(proposeResult{err: ErrClosed})
			default:
				return
			}
		}
	}()
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	lingers, lingerScore := 0, lingerMissCost // see lingerProbe
	for {
		var first *proposal
		select {
		case first = <-n.proposals:
		case <-n.quit:
			return
		}
		select {
		case n.slots <- struct{}{}: // wait for room; proposals pile up meanwhile
		case <-n.quit:
			first.answer(proposeResult{err: ErrClosed})
			return
		}
		var batch []*proposal
		size := 0
		add := func(p *proposal) {
			batch = append(batch, p)
			size += proto.Size(p.cmd)
		}
		add(first)
	drain:
		for len(batch) < maxBatch && size < maxBatchBytes {
			select {
			case p := <-n.proposals:
				add(p)
			default:
				break drain
			}
		}
		if want := min(int(n.lastBatch.Load()), maxBatch); n.cfg.GroupCommitWait > 0 && len(batch) < want && size < maxBatchBytes {
			lingers++
			if lingerScore > 0 || lingers%lingerProbe == 0 {
				before := len(batch)
				linger.Reset(n.cfg.GroupCommitWait)
			wait:
				for len(batch) < want && size < maxBatchBytes {
					select {
					case p := <-n.proposals:
						add(p)
					case <-linger.C:
						break wait
					case <-n.quit:
						break wait
					}
				}
				linger.Stop()
				gained := len(batch) > before
				if gained {
					lingerScore = min(lingerScore+1, lingerScoreMax)
				} else {
					lingerScore = max(lingerScore-lingerMissCost, 0)
				}
				if n.cfg.Observer != nil {
					n.cfg.Observer.GroupCommitWait(gained)
				}
			}
		}
		cmd := first.cmd
		if len(batch) > 1 {
			b := &fsmpb.Batch{Commands: make([]*fsmpb.Command, len(batch))}
			for i, p := range batch {
				b.Commands[i] = p.cmd
			}
			cmd = &fsmpb.Command{Op: &fsmpb.Command_Batch{Batch: b}}
		}
		// Each command's tag and length (and the batch's) come on top.
		data, err := fsm.EncodeEntry(cmd, size+16*len(batch)+16)
		if err != nil {
			for _, p := range batch {
				p.answer(proposeResult{err: fmt.Errorf("node: encoding command: %w", err)})
			}
			<-n.slots
			continue
		}
		if n.cfg.Observer != nil {
			n.cfg.Observer.Batch(len(batch))
		}
		n.fsm.Hint(data, cmd) // this node's apply need not decode what it just encoded
		n.applying <- inflight{f: n.raft.Apply(data, n.cfg.ApplyTimeout), batch: batch, data: data}
	}
}

// answerer hands each committed batch's results to its proposers, in order.
func (n *Node) answerer() {
	defer n.wg.Done()
	for in := range n.applying {
		err := n.settle(in.f)
		n.fsm.Unhint(in.data) // if the entry never reached the state machine
		var res fsm.Result
		if err == nil {
			res = fsm.TakeResult(in.f.Response())
		}
		n.lastBatch.Store(int64(len(in.batch)))
		<-n.slots
		if err != nil {
			err = n.mapApplyErr(err)
		}
		for i, p := range in.batch {
			switch {
			case err != nil:
				p.answer(proposeResult{err: err})
			case errors.Is(res.Err, fsm.ErrCorrupt):
				// Committed, but this node's state machine stopped before
				// it (see Run): other replicas apply it.
				p.answer(proposeResult{err: fmt.Errorf("%w: %v", ErrUnknownOutcome, res.Err)})
			case len(in.batch) == 1:
				p.answer(proposeResult{res: res, err: res.Err})
			default:
				r := res.Batch[i]
				p.answer(proposeResult{res: r, err: r.Err})
			}
		}
	}
}

// settle waits for a raft future's answer. Raft does not answer every
// future when it shuts down (those still queued for its leader loop or its
// state machine: hashicorp/raft#498), so the wait also ends when the node
// closes; the entry may or may not have been committed then, and the
// answer says exactly that. No goroutine is left waiting after Close.
func (n *Node) settle(f raft.Future) error {
	if !endOnClose(f, n.quit) {
		return n.settleSlow(f)
	}
	err := f.Error()
	if errors.Is(err, raft.ErrRaftShutdown) && n.closing() {
		return fmt.Errorf("%w: node shut down before the outcome was known", ErrUnknownOutcome)
	}
	return err
}

// settleSlow is settle for a future endOnClose cannot reach: its waiter
// goroutine ends when raft answers, which it may never do after Close.
// Raft's own futures never take this path (TestCloseLeavesNoWaitingGoroutine).
func (n *Node) settleSlow(f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-n.quit:
		select {
		case err := <-done:
			return err
		default:
			return fmt.Errorf("%w: node shut down before the outcome was known", ErrUnknownOutcome)
		}
	}
}

// mapApplyErr is mapRaftErr for a command's future, which fails with an
// error that is none of raft's own only when the leader could not store
// the entry (and then sent it nowhere): with the disk full, that is
// ErrStorageFull, and so is "not the leader" while the disk is full and no
// other node leads (raft steps down after a failed append; the client has
// nowhere better to go).
func (n *Node) mapApplyErr(err error) error {
	full := n.storageFull()
	if full == nil {
		return mapRaftErr(err)
	}
	switch {
	case errors.Is(err, ErrUnknownOutcome), errors.Is(err, raft.ErrLeadershipLost), errors.Is(err, raft.ErrRaftShutdown),
		errors.Is(err, raft.ErrEnqueueTimeout), errors.Is(err, raft.ErrAbortedByRestore):
		return mapRaftErr(err)
	case errors.Is(err, raft.ErrNotLeader):
		if _, leader := n.raft.LeaderWithID(); leader != "" && string(leader) != n.cfg.NodeID {
			return ErrNotLeader
		}
	}
	return full
}

// storageFull returns ErrStorageFull, saying why, while this node's last
// write failed for want of space; nil otherwise.
func (n *Node) storageFull() error {
	if f := n.stores.Failure(); errors.Is(f, store.ErrFull) {
		return fmt.Errorf("%w on node %s: %v", ErrStorageFull, n.cfg.NodeID, f)
	}
	return nil
}

// mapReadStorageErr is ErrStorageFull for a read refused as "not the
// leader" while the disk is full and no other node leads.
func (n *Node) mapReadStorageErr(err error) error {
	if !errors.Is(err, ErrNotLeader) {
		return err
	}
	if full := n.storageFull(); full != nil {
		if _, leader := n.raft.LeaderWithID(); leader == "" || string(leader) == n.cfg.NodeID {
			return full
		}
	}
	return err
}

// wait is settle that also ends, with ctx's error, when ctx does.
func (n *Node) wait(ctx context.Context, f raft.Future) error {
	if ctx.Done() == nil {
		return n.settle(f)
	}
	done := make(chan error, 1)
	go func() { done <- n.settle(f) }() // ends with the answer, or at Close
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (n *Node) closing() bool {
	select {
	case <-n.quit:
		return true
	default:
		return false
	}
}

// shutdownField caches, per future type, where its ShutdownCh is.
var shutdownField sync.Map // reflect.Type → []int (nil: none)

// endOnClose makes raft future f's Error return by the time quit is
// closed, and reports whether it could. Raft's futures embed a deferError
// whose Error waits on an exported ShutdownCh as well as on the answer;
// raft sets it only on the futures of its own snapshots, and leaves it nil
// (never ready) on those of Apply, Barrier and VerifyLeader: endOnClose
// sets it to quit (raft itself never reads it, so this races with
// nothing), and Error then returns ErrRaftShutdown once quit is closed.
// raft's errorFuture, a value, is answered already.
func endOnClose(f raft.Future, quit chan struct{}) bool {
	v := reflect.ValueOf(f)
	if v.Kind() != reflect.Pointer {
		return true // errorFuture
	}
	if v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return false
	}
	t := v.Type()
	idx, ok := shutdownField.Load(t)
	if !ok {
		var path []int
		if sf, found := t.Elem().FieldByName("ShutdownCh"); found && sf.Type == reflect.TypeOf(quit) {
			path = sf.Index
		}
		idx, _ = shutdownField.LoadOrStore(t, path)
	}
	path := idx.([]int)
	if path == nil {
		return false
	}
	field := v.Elem().FieldByIndex(path)
	if !field.CanSet() {
		return false
	}
	field.Set(reflect.ValueOf(quit))
	return true
}

func mapRaftErr(err error) error {
	switch {
	case errors.Is(err, ErrUnknownOutcome):
		return err
	case errors.Is(err, raft.ErrNotLeader):
		return ErrNotLeader
	case errors.Is(err, raft.ErrRaftShutdown):
		return ErrClosed
	case errors.Is(err, raft.ErrEnqueueTimeout):
		return fmt.Errorf("%w: %v", ErrUnknownOutcome, err)
	case errors.Is(err, raft.ErrLeadershipLost):
		return fmt.Errorf("%w: %v", ErrUnknownOutcome, err)
	}
	return fmt.Errorf("%w: %v", ErrUnknownOutcome, err)
}

// LinearizableRead returns once this node has confirmed it is still the
// leader and has applied everything committed before the call: a read of
// the state after it sees every write that completed before it began. A
// context that has already ended is refused with its error.
func (n *Node) LinearizableRead(ctx context.Context) (err error) {
	defer func() { err = n.mapReadStorageErr(err) }()
	if err := ctx.Err(); err != nil {
		return err
	}
	timeout := n.timeout(ctx)
	if timeout <= 0 {
		return context.DeadlineExceeded // 0 would mean no timeout to raft
	}
	if term := n.raft.CurrentTerm(); n.readTerm.Load() != term {
		// A new leader knows what earlier leaders committed only once an
		// entry of its own term is committed; until then its commit index
		// may miss writes that were already acknowledged. Commit one.
		if err := mapReadErr(n.wait(ctx, n.raft.Barrier(timeout))); err != nil {
			return err
		}
		if n.raft.CurrentTerm() == term {
			n.readTerm.Store(term) // usually promote has done it already
		}
	}
	if n.soleVoterLeader() {
		return nil
	}
	commit := n.raft.CommitIndex()
	// Not bounded by ctx: raft answers every verify future when it steps
	// down, the node's Close ends the rest, and this is on every read's
	// path (no goroutine).
	if err := mapReadErr(n.settle(n.raft.VerifyLeader())); err != nil {
		return err
	}
	if n.appliedIndex() >= commit {
		return nil
	}
	// Rare: wait for the apply loop to catch up with a barrier.
	return mapReadErr(n.wait(ctx, n.raft.Barrier(timeout)))
}

// soleVoterLeader reports whether this node leads, in the term whose
// entries it has applied since before the call (readTerm), a cluster whose
// latest configuration has this node as its only voter. A read of the
// state is then linearizable without a round of raft's leader loop, which
// is busy with the leader's own log append (fsync) under load:
//
//   - every write acknowledged in this term was acknowledged by this
//     node, the term's only leader, after its state machine applied it
//     (raft answers an Apply future once the state machine has applied
//     the entry), and every write of an earlier term was applied before
//     readTerm was set (the term's barrier);
//   - no other node can lead a later term while this node's latest
//     configuration has it as its only voter: raft changes membership one
//     server at a time and counts a configuration from when the leader
//     appends it, so any configuration another node may be elected under
//     needs this node's vote, which it gives only after it has left the
//     leader state and moved to the later term. raft's VerifyLeader
//     answers at once on the same grounds (a quorum of one), but only
//     when its leader loop gets to it.
//
// The checks run in this order so that they hold together at the moment
// of the leader check: the configuration is read first (once a voter is
// added, the leader's latest configuration has two and the read takes the
// quorum path), then the state, then the term again (the state and term
// are raft's atomics; a term that moved on means a step-down may have
// been missed, and the read takes the quorum path, which refuses it).
func (n *Node) soleVoterLeader() bool {
	term := n.raft.CurrentTerm()
	if n.readTerm.Load() != term {
		return false
	}
	cf := n.raft.GetConfiguration()
	if cf.Error() != nil {
		return false
	}
	voters := 0
	self := false
	for _, s := range cf.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			voters++
			self = self || s.ID == raft.ServerID(n.cfg.NodeID)
		}
	}
	if voters != 1 || !self {
		return false
	}
	return n.raft.State() == raft.Leader && n.raft.CurrentTerm() == term
}

// mapReadErr is mapRaftErr for a read's leadership check: a read changes
// nothing, so losing leadership meanwhile leaves no outcome unknown; the
// reader should just ask the leader.
func mapReadErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost):
		return ErrNotLeader
	}
	return mapRaftErr(err)
}

// Read runs fn on the local state (see LinearizableRead).
func (n *Node) Read(fn func(*fsm.State)) { n.fsm.Read(fn) }

// Confirming keepalives. A keepalive confirmed by a node that is no longer
// the only leader would let its client count on a deadline the new leader
// does not keep (docs/architecture.md, safety argument 2). So a leader
// confirms keepalives only within keepAliveLease of the start of a round
// that committed an entry of its current term (a raft barrier, created
// after the round began). Every voter of the majority that stored it had
// not voted in a later term when it did (it would have refused the entry),
// and any later leader is elected by a majority that includes one of
// them: so it is elected, and promotes its sessions, after the round
// began. Its promotion gives every session TTL + promoteAllowance, more
// than keepAliveLease, so every keepalive this node confirms, sent before
// it confirmed it, falls within the new leader's deadline. This holds
// whatever raft's timeouts, and however long this node was paused.
//
// raft's VerifyLeader would not do: the replies that confirm it may answer
// heartbeats or appends sent before it was called (replication.go
// notifyAll), which on a node resuming from a pause can be replies from
// before the pause, waiting in its sockets.
const (
	// keepAliveLease is how long one confirmation of leadership lets the
	// leader confirm keepalives. A round costs one small log entry, so a
	// leader that confirms keepalives all the time adds two a second.
	keepAliveLease = 500 * time.Millisecond
	// promoteAllowance is added to every session's TTL when a node becomes
	// leader: at least keepAliveLease, twice that for clock-rate drift.
	promoteAllowance = 2 * keepAliveLease
	// leaseRounds bounds the rounds one keepalive waits for (each round
	// that ended too late to be of use starts another).
	leaseRounds = 3
)

// leaderLease records when leadership was last confirmed.
type leaderLease struct {
	// mu guards the fields below.
	mu    sync.Mutex
	term  uint64
	until time.Time   // keepalives may be confirmed before it, in term
	round *leaseRound // the confirmation under way, or nil
}

type leaseRound struct {
	done chan struct{}
	err  error // set before done is closed
}

// held reports whether leadership is confirmed now, in the current term.
func (l *leaderLease) held(n *Node) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.heldLocked(n)
}

func (l *leaderLease) heldLocked(n *Node) bool {
	return l.term == n.raft.CurrentTerm() && n.cfg.Clock.Now().Before(l.until)
}

// confirmed records that an entry of term, created after began, was
// committed.
func (l *leaderLease) confirmed(n *Node, term uint64, began time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n.raft.CurrentTerm() != term {
		return
	}
	if until := began.Add(keepAliveLease); l.term != term || until.After(l.until) {
		l.term, l.until = term, until
	}
}

// confirm returns nil once leadership is confirmed now (see KeepAlive). A
// caller that finds no round under way runs one itself; the others wait
// for it.
func (l *leaderLease) confirm(ctx context.Context, n *Node) error {
	for range leaseRounds {
		l.mu.Lock()
		if l.heldLocked(n) {
			l.mu.Unlock()
			return nil
		}
		r := l.round
		if r == nil {
			r = &leaseRound{done: make(chan struct{})}
			l.round = r
			l.mu.Unlock()
			term, began := n.raft.CurrentTerm(), n.cfg.Clock.Now()
			r.err = mapReadErr(n.settle(n.raft.Barrier(n.cfg.ApplyTimeout)))
			if r.err == nil {
				l.confirmed(n, term, began)
			}
			l.mu.Lock()
			l.round = nil
			l.mu.Unlock()
			close(r.done)
		} else {
			l.mu.Unlock()
			select {
			case <-r.done:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if r.err != nil {
			return r.err
		}
	}
	return fmt.Errorf("%w: leadership could not be confirmed in time", ErrNotLeader)
}

// KeepAlive extends a session on the leader and returns its TTL;
// keepalives never enter the log. It confirms a keepalive only while this
// node's leadership is confirmed (see keepAliveLease): when its last
// confirmation is older, it first commits a barrier, which ctx may cut
// short. It fails with ErrNotLeader on a node that is not the leader, or
// no longer is, and fsm.ErrSessionNotFound for a session that is unknown
// or being expired.
func (n *Node) KeepAlive(ctx context.Context, id uint64) (time.Duration, error) {
	if !n.lessor.IsLeader() {
		return 0, ErrNotLeader
	}
	if err := n.lease.confirm(ctx, n); err != nil {
		return 0, err
	}
	ttl, err := n.lessor.KeepAlive(id)
	if errors.Is(err, lessor.ErrNotLeader) {
		return 0, ErrNotLeader
	}
	return ttl, err
}

// Serving reports whether this node serves as leader: it leads, and its
// state holds everything committed before its term (its barrier was
// applied). Only then is its state authoritative about which sessions
// exist.
func (n *Node) Serving() bool { return n.lessor.IsLeader() }

// LeadershipConfirmed reports whether KeepAlive would answer now without
// committing a barrier first.
func (n *Node) LeadershipConfirmed() bool { return n.lease.held(n) }

// Status describes this node.
type Status struct {
	Node, Leader string
	Term         uint64
	Revision     uint64
	AppliedIndex uint64
	Voters       []string
	// StorageError is why this node's last write to its disk failed
	// (ErrStorageFull's message when the disk is full); "" when it
	// succeeded.
	StorageError string
}

// Status reports raft's view and the state's revision.
func (n *Node) Status() Status {
	st := Status{Node: n.cfg.NodeID, AppliedIndex: n.appliedIndex()}
	_, leader := n.raft.LeaderWithID()
	st.Leader = string(leader)
	st.Term = n.raft.CurrentTerm()
	if f := n.raft.GetConfiguration(); f.Error() == nil {
		for _, s := range f.Configuration().Servers {
			if s.Suffrage == raft.Voter {
				st.Voters = append(st.Voters, string(s.ID))
			}
		}
	}
	n.fsm.Read(func(s *fsm.State) { st.Revision = s.Revision() })
	if full := n.storageFull(); full != nil {
		st.StorageError = full.Error()
	} else if f := n.stores.Failure(); f != nil {
		st.StorageError = fmt.Sprintf("tenure: storage failing on node %s: %v", n.cfg.NodeID, f)
	}
	return st
}

func (n *Node) timeout(ctx context.Context) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return time.Until(dl)
	}
	return n.cfg.ApplyTimeout
}

// ErrSnapshotBehind: a restore without force of a snapshot older than the
// cluster's state.
var ErrSnapshotBehind = errors.New("tenure: snapshot is older than this cluster's state")

// ErrForeignSnapshot: a restore of a snapshot that another cluster saved,
// without RestoreOptions.FromCluster naming it. It is also fsm.ErrInvalid.
var ErrForeignSnapshot = fmt.Errorf("%w: the snapshot is of another cluster", fsm.ErrInvalid)

// SaveSnapshot returns a consistent copy of the whole state, read on the
// leader after a linearizable read barrier, sealed (fsm.SealSnapshot) with
// the cluster's id. It holds the private signing keys.
func (n *Node) SaveSnapshot(ctx context.Context) ([]byte, error) {
	if err := n.LinearizableRead(ctx); err != nil {
		return nil, err
	}
	snap := n.fsm.ConsistentExport()
	state, err := proto.MarshalOptions{Deterministic: true}.Marshal(snap)
	if err != nil {
		return nil, fmt.Errorf("node: encoding the snapshot: %w", err)
	}
	return fsm.SealSnapshot(snap.GetSecurity().GetClusterId(), state)
}

// RestoreOptions say how RestoreSnapshot may replace the state.
type RestoreOptions struct {
	// Force restores a snapshot older than the cluster's state (the
	// revision still never goes back).
	Force bool
	// FromCluster names, as fsm.ClusterIDString writes it, the cluster
	// that saved a snapshot of another cluster; without it such a
	// snapshot is refused (ErrForeignSnapshot).
	FromCluster string
	// ReplaceKeys takes the snapshot's ACLs, signing keys and cluster id;
	// without it the running cluster's are kept, whichever cluster saved
	// the snapshot.
	ReplaceKeys bool
	// AboveRevision: the restored state continues above it, and tokens up
	// to it stay stale (the revision a lost data directory had reached).
	AboveRevision uint64
}

// RestoreSnapshot replaces the replicated state with a saved one, through
// raft (the leader installs it and followers receive it as a raft
// snapshot), and returns the state as restored. Sessions in the snapshot
// start a fresh TTL.
//
// data must be a sealed snapshot file (fsm.OpenSnapshot): an empty, cut,
// changed or unsealed file is refused, force or not, and so is a state
// that fails validation (fsm.ValidateSnapshot: every token, grant and id
// at or below its revision; then fsm.Import). A snapshot of another cluster is refused unless
// opt.FromCluster names it. The running cluster's ACLs, signing keys and
// cluster id are kept unless opt.ReplaceKeys. Nothing changes when it is
// refused.
//
// A restore never lowers the revision, so tokens never go backwards: the
// restored state continues above the highest of the snapshot's revision,
// the cluster's (read on the leader after a barrier, with no command
// admitted until the restore is done), this node's applied record and
// opt.AboveRevision. Its fence floor is set to that revision, so every
// token issued until then is stale at every fenced register. A snapshot
// older than the cluster's state is refused (ErrSnapshotBehind) unless
// opt.Force. A cluster that enforces its ACLs still does after the
// restore, whatever the snapshot says (--replace-keys included).
func (n *Node) RestoreSnapshot(ctx context.Context, data []byte, opt RestoreOptions) (*fsmpb.Snapshot, error) {
	fileID, state, err := fsm.OpenSnapshot(data)
	if err != nil {
		return nil, err
	}
	snap := &fsmpb.Snapshot{}
	if err := proto.Unmarshal(state, snap); err != nil {
		return nil, fmt.Errorf("%w: the snapshot's state does not decode: %v", fsm.ErrInvalid, err)
	}
	if !bytes.Equal(fileID, snap.GetSecurity().GetClusterId()) {
		return nil, fmt.Errorf("%w: the file's header names cluster %s, its state cluster %s", fsm.ErrSnapshotDamaged, fsm.ClusterIDString(fileID), fsm.ClusterIDString(snap.GetSecurity().GetClusterId()))
	}
	if err := fsm.ValidateSnapshot(snap); err != nil {
		return nil, err
	}
	if _, err := fsm.Import(snap); err != nil {
		if errors.Is(err, fsm.ErrInvalid) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", fsm.ErrInvalid, err)
	}
	// Take every batcher slot: no command enters raft from here until the
	// restore is installed, so the revision read below is the last one
	// before the restore.
	held := 0
	defer func() {
		for ; held > 0; held-- {
			<-n.slots
		}
	}()
	for ; held < maxInflight; held++ {
		select {
		case n.slots <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-n.quit:
			return nil, ErrClosed
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err // a timeout of 0 would mean none to raft
	}
	if err := mapReadErr(n.wait(ctx, n.raft.Barrier(n.timeout(ctx)))); err != nil {
		return nil, err
	}
	var cur uint64
	var running *fsm.Security
	n.fsm.Read(func(s *fsm.State) { cur, running = s.Revision(), s.Security() })
	if len(running.ClusterID) > 0 && !bytes.Equal(fileID, running.ClusterID) && opt.FromCluster != fsm.ClusterIDString(fileID) {
		return nil, fmt.Errorf("%w: it was saved by cluster %s and this is cluster %s; to restore it here give --from-cluster %s (this cluster's ACLs and signing keys are kept unless --replace-keys)", ErrForeignSnapshot, fsm.ClusterIDString(fileID), fsm.ClusterIDString(running.ClusterID), fsm.ClusterIDString(fileID))
	}
	floor := max(cur, n.rec.record().Revision)
	if snap.GetRevision() < floor && !opt.Force {
		return nil, fmt.Errorf("%w: the cluster is at revision %d, the snapshot at %d; with --force the restored state continues above revision %d and every token issued so far stays stale", ErrSnapshotBehind, floor, snap.GetRevision(), floor)
	}
	floor = max(floor, opt.AboveRevision)
	snap.Revision = max(snap.GetRevision(), floor)
	snap.FenceFloor = max(snap.GetFenceFloor(), floor)
	if !opt.ReplaceKeys {
		snap.Security = fsm.ExportSecurity(running)
	}
	if running.Enforced {
		// Nothing turns the enforcement of the ACLs off, a restore of a
		// snapshot from before it included.
		if snap.Security == nil {
			snap.Security = &fsmpb.Security{}
		}
		snap.Security.AclEnforced = true
	}
	data, err = proto.MarshalOptions{Deterministic: true}.Marshal(snap)
	if err != nil {
		return nil, fmt.Errorf("node: encoding the snapshot: %w", err)
	}
	meta := &raft.SnapshotMeta{Version: raft.SnapshotVersionMax, Size: int64(len(data))}
	if err := n.raft.Restore(meta, bytes.NewReader(data), n.timeout(ctx)); err != nil {
		return nil, mapRaftErr(err)
	}
	for ; held > 0; held-- {
		<-n.slots
	}
	n.lessor.Promote(0)
	return snap, nil
}

// Snapshot asks raft to take a snapshot now (used by tests and operators).
func (n *Node) Snapshot() error { return n.raft.Snapshot().Error() }

// Close shuts raft down and closes the stores. It is idempotent.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		n.closeErr = n.raft.Shutdown().Error() // pending futures fail now
		close(n.quit)
		n.wg.Wait()
		if err := n.rec.flushClean(n.stores.Log, n.snaps); err != nil && n.closeErr == nil {
			n.closeErr = err
		}
		if c, ok := n.trans.(io.Closer); ok {
			c.Close()
		}
		n.probes.Wait()
		if err := n.stores.Close(); err != nil && n.closeErr == nil {
			n.closeErr = err
		}
	})
	return n.closeErr
}
