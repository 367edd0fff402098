// Package node wires the state machine to hashicorp/raft: it opens the
// durable stores, bootstraps a single voter when the data directory is new,
// proposes commands, serves linearizable reads, and hands leadership changes
// to the lessor, which owns time.
//
// The data path is: RPC → Propose (raft.Apply, fsynced and committed) →
// fsm.Apply on every replica → the result returns to the proposer and the
// events go to the lessor and to the waiting clients.
//
// The package is split by concern: config.go (Config, its defaults and
// Validate), open.go (Open and Close: the data directory, raft and the
// node's goroutines), node.go (the Node, leadership changes in Run,
// status), batcher.go (proposals and group commit), futures.go (the one
// way to wait for raft), read.go (linearizable reads), lease.go (the
// leader lease that confirms keepalives), restore.go (saving and
// restoring snapshots), leadership.go (the one leadership value every
// predicate is derived from), membership.go, record.go (the applied record),
// integrity.go (checks of the data directory), security.go (signing
// keys), observe.go (measurements and health), peertls.go.
package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/lessor"
	"github.com/tenure-io/tenure/internal/store"
	"github.com/tenure-io/tenure/internal/version"
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
	// ident is the data directory's owner (identity.go); identityFailed
	// reports, once, why this node must stop serving it (refusedPeer).
	ident          *identity
	identityFailed chan error
	// joinedWithState: started with Config.Join on a directory that had
	// state (see refusedPeer).
	joinedWithState bool
	// refusedMu guards refusedLogged.
	refusedMu     sync.Mutex
	refusedLogged time.Time
	leadCh        chan bool
	ready         chan struct{}
	// peerStream dials other members' peer listeners, without the
	// identity hello (nil standalone); raiseNow asks raiseClusterVersion
	// to try at once (upgrade.go).
	peerStream raft.StreamLayer
	raiseNow   chan struct{}
	versions   versionCache // what members last reported (upgrade.go)
	// fwd takes the forwarded-API connections of the peer listener (nil
	// standalone; forward.go).
	fwd *forwardListener
	// zkRelay takes the ZooKeeper relay connections of the peer listener
	// (nil standalone; zkrelay.go).
	zkRelay *forwardListener

	proposals chan *proposal
	slots     chan struct{}
	applying  chan inflight
	quit      chan struct{}
	wg        sync.WaitGroup
	futures   futureSet      // raft futures waited for (futures.go)
	probes    sync.WaitGroup // RPCs to peers in flight (membership.go)

	// lead is the one leadership value (leadership.go).
	lead leadership
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

	// lease runs the rounds that confirm leadership for keepalives (see
	// KeepAlive).
	lease leaderLease

	// reads runs the rounds that confirm leadership for linearizable
	// reads (readindex.go).
	reads readRounds

	// peers is the leader's view of the other members' health (peers.go).
	peers peerWatch

	// lastBatch is the size of the last batch answered (see lingerProbe).
	lastBatch atomic.Int64

	// hooksMu guards onDemote and onPromote.
	hooksMu   sync.Mutex
	onDemote  []func()
	onPromote []func(context.Context)
	onRaise   []func(context.Context)

	// workMu orders startWork against Close: once Close has begun, no
	// goroutine of the node starts.
	workMu      sync.Mutex
	workStarted bool
	closed      bool

	readyOnce sync.Once
	closeOnce sync.Once
	closeErr  error
}

// Run starts the node's work (the first call: proposals are committed and
// answered from then on, until Close), then follows leadership changes
// and runs the lessor until ctx ends. It returns early, with an error saying what to do, if this node becomes
// leader and finds its state below the revision it recorded (see
// record.go), or if the state machine meets a log entry or snapshot that
// fails its checksum or does not decode (integrity.go): it must not serve
// then.
func (n *Node) Run(ctx context.Context) error {
	n.startWork()
	var wg sync.WaitGroup
	lctx, cancel := context.WithCancel(ctx)
	defer func() { cancel(); wg.Wait() }()
	wg.Add(1)
	go func() { defer wg.Done(); _ = n.lessor.Run(lctx) }()
	wg.Add(1)
	go func() { defer wg.Done(); n.retireKeys(lctx) }() // security.go
	wg.Add(1)
	go func() { defer wg.Done(); n.raiseClusterVersion(lctx) }() // upgrade.go
	if n.fsm.Err() != nil {
		return n.stopped()
	}
	if n.Leadership().Leading {
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
		case err := <-n.identityFailed:
			return err
		case isLeader := <-n.leadCh:
			if d := n.cfg.Faults.leaderChangeDelay(); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
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
	var fe *fsm.FormatError
	if errors.As(err, &fe) { // newer than this build: its data are intact
		return fmt.Errorf("node: %s stopped: %v", n.cfg.NodeID, fe)
	}
	return fmt.Errorf("node: the state machine of %s stopped: %v; %s", n.cfg.DataDir, err, store.Remedy)
}

// promote waits until every committed entry is applied, then hands the
// sessions to the lessor with fresh TTLs plus promoteAllowance, and
// publishes that the node serves in its term (Leadership.BarrierApplied):
// the lessor acts from then on. It fails if the state is then below the
// recorded revision.
func (n *Node) promote(ctx context.Context) error {
	term, began := n.Leadership().Term, n.cfg.Clock.Now()
	if err := n.await(ctx, func() raft.Future { return n.raft.Barrier(n.cfg.ApplyTimeout) }); err != nil {
		return nil // leadership lost again (or the node stops); a new notification follows
	}
	if err := n.checkRevisionCoversRecord(); err != nil {
		return err
	}
	n.lessor.Promote(term, promoteAllowance)
	n.promoted(term, began) // the barrier confirms leadership too
	n.lessor.Wake()
	n.applySettings(ctx)
	n.EnsureSigningKey(ctx) // security.go
	if n.fsm.ClusterVersion() < version.Protocol && n.soleVoterLeader() {
		_ = n.tryRaise(ctx) // the only voter: nothing to ask (upgrade.go)
	}
	select {
	case n.raiseNow <- struct{}{}: // ask the voters at once (upgrade.go)
	default:
	}
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
		n.cfg.Logger.Info("ready", "ms_since_open", time.Since(n.opened).Milliseconds(), "log_entries_applied", applied-min(applied, n.openedIndex), "leader", n.Leadership().Leading)
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
	// Limits of a newer format than the cluster version wait for it to be
	// raised (raiseClusterVersion applies the settings again then).
	allowed := fsm.LimitsAllowed(n.cfg.Limits, n.fsm.ClusterVersion())
	if merged := limits.Merge(allowed); merged != limits {
		if _, err := n.SetLimits(ctx, allowed); err != nil {
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

// OnClusterVersionRaised registers fn to run each time this node, as
// leader, has raised the cluster version (upgrade.go): a proposal the
// older version refused may be made then. It runs on the goroutine that
// raised it: fn may propose, and should return soon.
func (n *Node) OnClusterVersionRaised(fn func(ctx context.Context)) {
	n.hooksMu.Lock()
	defer n.hooksMu.Unlock()
	n.onRaise = append(n.onRaise, fn)
}

// Ready is closed the first time Health reports the node ready: it knows a
// leader, its state holds everything it knows is committed (its snapshot
// and the log after it applied; as leader, also its term's first entry)
// and its storage accepts a write. /readyz and status report the same
// Health later on.
func (n *Node) Ready() <-chan struct{} { return n.ready }

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
	lead := n.Leadership()
	st := Status{Node: n.cfg.NodeID, Leader: lead.Leader, Term: lead.Term, AppliedIndex: n.appliedIndex()}
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
