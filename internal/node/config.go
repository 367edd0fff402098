package node

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/tenure-io/tenure/internal/clock"
	"github.com/tenure-io/tenure/internal/fsm"
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
	// HeartbeatTimeout, ElectionTimeout and LeaderLeaseTimeout are raft's
	// failure detection (serve --heartbeat-timeout, --election-timeout,
	// --leader-lease-timeout). A follower that hears nothing from the
	// leader for HeartbeatTimeout (randomised up to twice that) starts an
	// election; a candidate that wins no majority within ElectionTimeout
	// (randomised likewise) tries again; a leader that hears from no
	// majority for LeaderLeaseTimeout steps down. Zero: DefaultHeartbeatTimeout,
	// DefaultElectionTimeout and DefaultLeaderLeaseTimeout for a node with
	// peers, a fifth of a second (and half that for the lease) for a
	// standalone one, which elects itself after one heartbeat timeout.
	// Validate checks them against each other; MinSurvivingTTL is the
	// shortest session TTL that outlives one election with them.
	HeartbeatTimeout, ElectionTimeout, LeaderLeaseTimeout time.Duration
}

// The default failure detection of a node with peers: 500 ms keeps a
// fail-over near one second on loopback while tolerating the scheduling
// stalls of a busy 2-core machine; raft's own defaults (1 s) fail over in
// about two seconds. docs/timing.md gives the measurements under load.
const (
	DefaultHeartbeatTimeout   = 500 * time.Millisecond
	DefaultElectionTimeout    = 500 * time.Millisecond
	DefaultLeaderLeaseTimeout = 250 * time.Millisecond
)

// Bounds of the timing settings: below minTiming raft's own timers and a
// busy scheduler are of the same order; above maxTiming a lost leader
// goes unnoticed for minutes, and one election could outlast the longest
// session TTL.
const (
	minTiming = 10 * time.Millisecond
	maxTiming = time.Minute
)

// ElectionBound is the longest one election may take with these timings,
// from the leader's last heartbeat to a new leader, one split vote
// included: a follower notices the silence within twice the heartbeat
// timeout, and a candidate that wins no majority waits up to twice the
// election timeout before it tries again.
func (c Config) ElectionBound() time.Duration {
	c.fill()
	return 2*c.HeartbeatTimeout + 2*c.ElectionTimeout
}

// MinSurvivingTTL is the shortest session TTL that outlives one election
// (ElectionBound) in the worst case: a client renews every third of its
// TTL and stops trusting its hold a drift margin (up to another third)
// before the TTL runs out, so the election must fit in the third left.
// A session with a shorter TTL is valid, but may be lost to its client
// while a new leader is elected.
func (c Config) MinSurvivingTTL() time.Duration { return 3 * c.ElectionBound() }

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
	hb, el, lease := DefaultHeartbeatTimeout, DefaultElectionTimeout, DefaultLeaderLeaseTimeout
	if c.PeerAddr == "" {
		hb, el, lease = 200*time.Millisecond, 200*time.Millisecond, 100*time.Millisecond
	}
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = hb
	}
	if c.ElectionTimeout == 0 {
		c.ElectionTimeout = max(el, c.HeartbeatTimeout)
	}
	if c.LeaderLeaseTimeout == 0 {
		c.LeaderLeaseTimeout = min(lease, c.HeartbeatTimeout)
	}
}

// Validate reports the first setting that cannot work, whatever the data
// directory holds; zero values stand for their defaults. Open calls it and
// opens nothing when it fails.
func (c Config) Validate() error {
	c.fill()
	if err := fsm.ValidateRetention(c.LockHistory, c.RegisterOpMemory); err != nil {
		return err
	}
	if c.Join && (c.PeerAddr == "" || len(c.BootstrapPeers) > 0) {
		return errors.New("node: joining a cluster needs a peer address and no bootstrap peers")
	}
	if err := c.validateTiming(); err != nil {
		return err
	}
	if len(c.BootstrapPeers) > 0 {
		if c.PeerAddr == "" {
			return errors.New("node: bootstrap peers need a peer address")
		}
		if _, self := c.BootstrapPeers[c.NodeID]; !self {
			return fmt.Errorf("node: --bootstrap-peers does not name this node (%s)", c.NodeID)
		}
	}
	return nil
}

// validateTiming checks the filled timing settings: each within bounds,
// the lease within the heartbeat timeout and the election timeout no
// shorter than it (raft's own rules). Within the bounds one election
// (ElectionBound) takes at most 4 minutes, which the longest session TTL
// (1 h) outlives; which shorter TTLs do not is the operator's to know
// (MinSurvivingTTL: serve logs it, at warn when the clients' default TTL
// is among them).
func (c Config) validateTiming() error {
	for _, t := range []struct {
		flag string
		d    time.Duration
	}{{"--heartbeat-timeout", c.HeartbeatTimeout}, {"--election-timeout", c.ElectionTimeout}, {"--leader-lease-timeout", c.LeaderLeaseTimeout}} {
		if t.d < minTiming || t.d > maxTiming {
			return fmt.Errorf("node: %s %s is outside %s..%s", t.flag, t.d, minTiming, maxTiming)
		}
	}
	if c.LeaderLeaseTimeout > c.HeartbeatTimeout {
		return fmt.Errorf("node: --leader-lease-timeout %s must not exceed --heartbeat-timeout %s: a leader would keep leading after its followers started to elect another", c.LeaderLeaseTimeout, c.HeartbeatTimeout)
	}
	if c.ElectionTimeout < c.HeartbeatTimeout {
		return fmt.Errorf("node: --election-timeout %s must not be shorter than --heartbeat-timeout %s", c.ElectionTimeout, c.HeartbeatTimeout)
	}
	return nil
}
