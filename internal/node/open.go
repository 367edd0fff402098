package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/lessor"
	"github.com/tenure-io/tenure/internal/logging"
	"github.com/tenure-io/tenure/internal/store"
)

// Open validates cfg (Config.Validate), opens the data directory, checks
// its integrity and starts raft; the node's own work starts in Run. sink receives every state-machine event
// (after the lessor has seen it); it must not block. On error everything
// it opened is closed again.
func Open(cfg Config, sink fsm.EventSink) (_ *Node, err error) {
	start := time.Now()
	cfg.fill()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// A directory of another node is refused before anything in it is
	// opened or written (identity.go).
	ident, identified, err := openIdentity(cfg.DataDir, cfg.NodeID)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return nil, fmt.Errorf("node: creating data dir: %w", err)
	}
	n := &Node{
		ident: ident, identityFailed: make(chan error, 1),
		cfg: cfg, leadCh: make(chan bool, 16), ready: make(chan struct{}),
		proposals: make(chan *proposal, maxBatch), slots: make(chan struct{}, maxInflight),
		applying: make(chan inflight, maxInflight), quit: make(chan struct{}), snapKick: make(chan struct{}, 1),
		raiseNow: make(chan struct{}, 1),
	}
	n.lead.cur.Store(&Leadership{})
	n.fsm = fsm.New(func(e fsm.Event) {
		n.lessor.Observe(e)
		if sink != nil {
			sink(e)
		}
	})
	cfg.Faults.applyTo(n.fsm)
	n.lessor = lessor.New(cfg.Clock, n.proposeForLessor, n.fsm.Read, n.servingTerm)

	stores, err := store.Open(filepath.Join(cfg.DataDir, "raft"), cfg.LogStore, cfg.LogOutput)
	if err != nil {
		return nil, err
	}
	// One way back: whatever fails below, what was opened is closed here,
	// the peer listener before the stores (as Close does).
	defer func() {
		if err == nil {
			return
		}
		if c, ok := n.trans.(io.Closer); ok {
			c.Close()
		}
		if n.fwd != nil {
			n.fwd.Close()
			n.zkRelay.Close()
		}
		stores.Close()
	}()
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
		return nil, fmt.Errorf("node: snapshot store: %w", err)
	}
	n.snaps = snaps
	// The data directory's integrity (integrity.go), before raft reads it.
	checkStart := time.Now()
	newest, err := checkSnapshots(cfg.DataDir, snaps)
	if err != nil {
		return nil, err
	}
	snapChecked := time.Now()
	if n.rec, err = openRecord(filepath.Join(cfg.DataDir, "raft", recordFile), stores.Log, stores.Stable, snaps, logging.Writer(cfg.Logger, slog.LevelError)); err != nil {
		return nil, err
	}
	n.startIndex = n.rec.record().Index
	var snapIndex uint64
	if newest != nil {
		snapIndex = newest.Index
	}
	if err := checkLog(stores, snapIndex); err != nil {
		return nil, err
	}
	logChecked := time.Now()
	existing, err := raft.HasExistingState(stores.Log, stores.Stable, snaps)
	if err != nil {
		return nil, fmt.Errorf("node: reading state: %w", err)
	}
	if !identified && existing {
		// A directory of a release without the file: this node's from now
		// on, if its configuration says so. (A new directory is recorded
		// once bootstrapped or joining: see bootstrap.)
		if err := adopt(cfg.DataDir, cfg.NodeID, stores.Log, snaps); err != nil {
			return nil, err
		}
		if err := ident.record(); err != nil {
			return nil, err
		}
	}
	n.joinedWithState = cfg.Join && existing
	if err := n.rec.startRecord(stores.Stable); err != nil {
		return nil, err
	}
	addr, err := n.openTransport(logger)
	if err != nil {
		return nil, err
	}
	rc := n.raftConfig(logger)
	if err := n.bootstrap(rc, snaps, addr, existing); err != nil {
		return nil, err
	}
	// Raft restores the newest snapshot (checked above) before it starts.
	n.fsmApplied.Store(snapIndex)
	raftStart := time.Now()
	ss := &startSnapshots{FileSnapshotStore: snaps, dir: snapshotsDir(cfg.DataDir), newest: newest}
	r, err := raft.NewRaft(rc, recordingFSM{n.fsm, n.rec, n.ident, &n.fsmApplied, cfg.Logger, &n.logBytes}, checkedAppends{stores.Log, n.logStored, cfg.Faults.appendHook(cfg.NodeID)}, stores.Stable, ss, n.trans)
	if err != nil {
		var fe *fsm.FormatError
		if ferr := n.fsm.Err(); errors.As(ferr, &fe) && newest != nil { // a newer release's snapshot: a downgrade
			return nil, fmt.Errorf("node: %v (%s)", fe, filepath.Join(snapshotsDir(cfg.DataDir), newest.ID))
		}
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
	n.publish(nil) // what raft did before the observer was registered
	return n, nil
}

// startWork starts, once, the node's own goroutines: the batcher and the
// answerer (proposals), the applied record's writer, the snapshotter and
// the leader's watch of its peers (peers.go). Run calls it; Close waits
// for them. Proposals made before are queued.
func (n *Node) startWork() {
	n.workMu.Lock()
	defer n.workMu.Unlock()
	if n.workStarted || n.closed {
		return
	}
	n.workStarted = true
	n.wg.Add(6)
	go n.batcher()
	go n.answerer()
	go func() { defer n.wg.Done(); n.rec.run(n.quit) }()
	go n.snapshotter()
	go n.watchPeers()
	go func() {
		defer n.wg.Done()
		n.ident.run(n.quit, n.fsm.Security, func(err error) { n.cfg.Logger.Error("recording the cluster id", "err", err) })
	}()
}

// refusedPeer is told about every raft connection refused because the
// peer is of another cluster (peerid.go). A node started with --join on a
// directory that had state stops if the refused node is the first to
// connect to it, before any of its own cluster: that directory is not the
// one it was meant to join with. Otherwise it logs it (at most every
// refusedLogEvery) and goes on serving its own cluster: a misconfigured
// cluster cannot stop a member by dialing it.
func (n *Node) refusedPeer(err error, first bool) {
	if first && n.joinedWithState && errors.Is(err, ErrOtherCluster) {
		select {
		case n.identityFailed <- err:
		default:
		}
	}
	n.refusedMu.Lock()
	now := time.Now()
	log := now.Sub(n.refusedLogged) >= refusedLogEvery
	if log {
		n.refusedLogged = now
	}
	n.refusedMu.Unlock()
	if log {
		n.cfg.Logger.Error("raft connection refused", "err", err)
	}
}

// refusedLogEvery bounds how often refusedPeer logs.
const refusedLogEvery = 10 * time.Second

// openTransport sets n.trans to raft's transport: in memory for a
// standalone node, TCP (or mutual TLS) on Config.PeerAddr otherwise. It
// returns the address this node advertises.
func (n *Node) openTransport(logger hclog.Logger) (raft.ServerAddress, error) {
	cfg := n.cfg
	if cfg.PeerAddr == "" {
		addr, trans := raft.NewInmemTransport(raft.ServerAddress(cfg.NodeID))
		n.trans = trans
		return addr, nil
	}
	advertise := cfg.PeerAddr
	if cfg.PeerAdvertise != "" {
		advertise = cfg.PeerAdvertise
	}
	adv, err := net.ResolveTCPAddr("tcp", advertise)
	if err != nil {
		return "", fmt.Errorf("node: peer address %q: %w", advertise, err)
	}
	nc := &raft.NetworkTransportConfig{
		ServerAddressProvider: cfg.Faults.addressProvider(), Logger: logger, MaxPool: peerPool, Timeout: 10 * time.Second,
	}
	var stream raft.StreamLayer
	if cfg.PeerTLS != nil {
		stream, err = newTLSStream(cfg.PeerAddr, adv, cfg.PeerTLS)
	} else {
		stream, err = newTCPStream(cfg.PeerAddr, adv)
	}
	if err != nil {
		return "", fmt.Errorf("node: peer listener on %s: %w", cfg.PeerAddr, err)
	}
	// A version probe is answered before anything else reads the
	// connection (upgrade.go); every other connection proves it is of this
	// cluster (peerid.go).
	stream = versionStream{stream}
	n.peerStream = stream
	// A forwarded-API connection is taken out of raft's way next
	// (forward.go).
	n.fwd = newForwardListener(adv, MaxForwardConns, 8)
	n.fwd.served.Store(true)
	n.zkRelay = newForwardListener(adv, MaxZkRelayConns, zkRelayQueue) // served once the ZooKeeper front asks for it (zkrelay.go)
	nc.Stream = newIdentityStream(forwardStream{StreamLayer: stream, n: n}, n.ident, n.refusedPeer)
	tcp := raft.NewNetworkTransportWithConfig(nc)
	n.trans = tcp
	return tcp.LocalAddr(), nil
}

// raftConfig is raft's configuration for this node.
func (n *Node) raftConfig(logger hclog.Logger) *raft.Config {
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(n.cfg.NodeID)
	rc.Logger = logger
	rc.NotifyCh = n.leadCh
	rc.BatchApplyCh = true
	rc.MaxAppendEntries = 256
	rc.SnapshotThreshold = n.cfg.SnapshotThreshold
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
	// The values, and their defaults, are Config's (config.go).
	rc.HeartbeatTimeout = n.cfg.HeartbeatTimeout
	rc.ElectionTimeout = n.cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = n.cfg.LeaderLeaseTimeout
	return rc
}

// bootstrap writes the initial configuration into a new data directory:
// this node alone, or Config.BootstrapPeers; nothing with Config.Join, or
// when the directory has state already. A new directory's identity is
// recorded once it is bootstrapped, or before a joining node starts: one
// whose first start failed before (a port in use, a full disk) belongs to
// no node yet.
func (n *Node) bootstrap(rc *raft.Config, snaps raft.SnapshotStore, addr raft.ServerAddress, existing bool) error {
	cfg := n.cfg
	switch {
	case existing:
		return nil
	case cfg.Join:
		if err := n.ident.record(); err != nil {
			return err
		}
		fmt.Fprintf(cfg.LogOutput, "tenure: node %s has no state and waits to be added to a cluster: run tenure member add %s %s against it (member rebuild for a member that lost its data)\n", cfg.NodeID, cfg.NodeID, addr)
		return nil
	}
	boot := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: rc.LocalID, Address: addr}}}
	if len(cfg.BootstrapPeers) > 0 { // naming this node (Config.Validate)
		boot.Servers = nil
		for _, id := range slices.Sorted(maps.Keys(cfg.BootstrapPeers)) {
			boot.Servers = append(boot.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(id), Address: raft.ServerAddress(cfg.BootstrapPeers[id])})
		}
	}
	// raft writes the term, then the first entry: on a full disk the term
	// alone would make the directory look started, and never become
	// ready. So there must be room first, and a bootstrap that fails
	// anyway takes its term back, so that the next start bootstraps again.
	if err := n.stores.Room(); err != nil {
		return fmt.Errorf("node: bootstrap of %s: %w", cfg.DataDir, err)
	}
	if err := raft.BootstrapCluster(rc, n.stores.Log, n.stores.Stable, snaps, n.trans, boot); err != nil {
		if last, lerr := n.stores.Log.LastIndex(); lerr == nil && last == 0 {
			if terr := n.stores.Stable.SetUint64(keyCurrentTerm, 0); terr != nil {
				err = fmt.Errorf("%w (and taking its term back failed: %v; delete %s before the next start)", err, terr, cfg.DataDir)
			}
		}
		if ferr := n.stores.Failure(); errors.Is(ferr, store.ErrFull) {
			return fmt.Errorf("node: bootstrap of %s: %w", cfg.DataDir, ferr)
		}
		return fmt.Errorf("node: bootstrap: %w", err)
	}
	return n.ident.record()
}

// keyCurrentTerm is where raft keeps its current term in the stable store
// (hashicorp/raft's own key, which raft.HasExistingState reads).
var keyCurrentTerm = []byte("CurrentTerm")

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
		if err := n.await(context.Background(), func() raft.Future { return n.raft.Snapshot() }); err != nil { // ends at Close too
			n.cfg.Logger.Debug("snapshot by log size", "err", err)
			continue
		}
		n.cfg.Logger.Info("snapshot taken", "reason", "log size", "ms", time.Since(start).Milliseconds())
	}
}

// Close stops the node and closes its data directory; it is idempotent.
// Every Propose, read and keepalive under way returns at once (with
// ErrClosed, or ErrUnknownOutcome for a command already handed to raft);
// raft, still running, then answers what it has in flight (see
// closeDrain) before it is shut down, and the stores are closed last. No
// goroutine of the node outlives it.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		n.workMu.Lock()
		n.closed = true // no goroutine of the node starts from here on
		n.workMu.Unlock()
		n.futures.close() // no raft call is waited for from here on
		close(n.quit)     // every waiter returns; the node's goroutines end
		n.wg.Wait()
		// The batcher's own drain, had Run never started it.
	drain:
		for {
			select {
			case p := <-n.proposals:
				p.answer(proposeResult{err: ErrClosed})
			default:
				break drain
			}
		}
		if !n.futures.drain(closeDrain) {
			n.cfg.Logger.Warn("raft left futures unanswered at close; their waiting goroutines remain", "waited", closeDrain)
		}
		n.closeErr = n.raft.Shutdown().Error()
		if err := n.rec.flushClean(n.stores.Log, n.snaps); err != nil && n.closeErr == nil {
			n.closeErr = err
		}
		if c, ok := n.trans.(io.Closer); ok {
			c.Close()
		}
		if n.fwd != nil {
			n.fwd.Close()
			n.zkRelay.Close()
		}
		n.probes.Wait()
		if err := n.stores.Close(); err != nil && n.closeErr == nil {
			n.closeErr = err
		}
	})
	return n.closeErr
}
