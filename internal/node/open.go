package node

import (
	"context"
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
	// One way back: whatever fails below, what was opened is closed here,
	// the peer listener before the stores (as Close does).
	defer func() {
		if err == nil {
			return
		}
		if c, ok := n.trans.(io.Closer); ok {
			c.Close()
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
	if err := n.rec.startRecord(stores.Stable); err != nil {
		return nil, err
	}
	addr, err := n.openTransport(logger)
	if err != nil {
		return nil, err
	}
	rc := n.raftConfig(logger)
	if err := n.bootstrap(rc, snaps, addr); err != nil {
		return nil, err
	}
	// Raft restores the newest snapshot (checked above) before it starts.
	n.fsmApplied.Store(snapIndex)
	raftStart := time.Now()
	ss := &startSnapshots{FileSnapshotStore: snaps, dir: snapshotsDir(cfg.DataDir), newest: newest}
	r, err := raft.NewRaft(rc, recordingFSM{n.fsm, n.rec, &n.fsmApplied, cfg.Logger, &n.logBytes}, checkedAppends{stores.Log, n.logStored}, stores.Stable, ss, n.trans)
	if err != nil {
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
	n.wg.Add(5)
	go n.batcher()
	go n.answerer()
	go func() { defer n.wg.Done(); n.rec.run(n.quit) }()
	go n.snapshotter()
	go n.watchPeers()
}

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
	var tcp *raft.NetworkTransport
	if cfg.PeerTLS != nil {
		tcp, err = newTLSTransport(cfg.PeerAddr, adv, cfg.PeerTLS, nc)
	} else {
		tcp, err = raft.NewTCPTransportWithConfig(cfg.PeerAddr, adv, nc)
	}
	if err != nil {
		return "", fmt.Errorf("node: peer listener on %s: %w", cfg.PeerAddr, err)
	}
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
// when the directory has state already.
func (n *Node) bootstrap(rc *raft.Config, snaps raft.SnapshotStore, addr raft.ServerAddress) error {
	cfg := n.cfg
	existing, err := raft.HasExistingState(n.stores.Log, n.stores.Stable, snaps)
	if err != nil {
		return fmt.Errorf("node: reading state: %w", err)
	}
	switch {
	case existing:
		return nil
	case cfg.Join:
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
	if err := raft.BootstrapCluster(rc, n.stores.Log, n.stores.Stable, snaps, n.trans, boot); err != nil {
		return fmt.Errorf("node: bootstrap: %w", err)
	}
	return nil
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
		n.probes.Wait()
		if err := n.stores.Close(); err != nil && n.closeErr == nil {
			n.closeErr = err
		}
	})
	return n.closeErr
}
