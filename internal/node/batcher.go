package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/store"
)

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
	p     *pending // f's wait
	batch []*proposal
	data  []byte
}

// Propose commits cmd and returns the state machine's result. A state
// machine refusal comes back as the result's Err (also returned as error).
// If ctx ends after the command was handed to raft, the outcome is unknown
// (ErrUnknownOutcome).
//
// A command the cluster version does not allow yet is refused at once
// with fsm.ErrVersion (fsm.CheckVersion), unwritten.
func (n *Node) Propose(ctx context.Context, cmd *fsmpb.Command) (fsm.Result, error) {
	if err := fsm.CheckVersion(cmd, n.fsm.ClusterVersion()); err != nil {
		return fsm.Result{Err: err}, err
	}
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
	if err := fsm.CheckVersion(cmd, n.fsm.ClusterVersion()); err != nil {
		then(fsm.Result{Err: err}, err)
		return
	}
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
		// The entry's format version: the cluster version's (fsm/version.go).
		data, err := fsm.EncodeEntryVersion(cmd, fsm.EntryVersionFor(cmd, n.fsm.ClusterVersion()), size+16*len(batch)+16)
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
		var f raft.ApplyFuture
		w := n.start(func() raft.Future { f = n.raft.Apply(data, n.cfg.ApplyTimeout); return f })
		if w == nil { // Close has begun: the entry was not handed to raft
			n.fsm.Unhint(data)
			for _, p := range batch {
				p.answer(proposeResult{err: ErrClosed})
			}
			<-n.slots
			return
		}
		n.applying <- inflight{f: f, p: w, batch: batch, data: data}
	}
}

// answerer hands each committed batch's results to its proposers, in order.
func (n *Node) answerer() {
	defer n.wg.Done()
	for in := range n.applying {
		err := in.p.wait(context.Background()) // ends at Close too
		// In case the entry never reached the state machine:
		n.fsm.Unhint(in.data)
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
		if err == nil && slices.ContainsFunc(in.batch, func(p *proposal) bool { return p.cmd.GetZkTxn() != nil }) {
			n.nudgeFollowers(in.f.Index())
		}
	}
}

// nudgeFollowers makes the followers learn soon that the entry at index,
// just committed, is: raft tells a follower that an entry is committed only
// with its next append to it, and when no entry follows, that append
// comes on raft's commit timeout (50 to 100 ms). The ZooKeeper front's
// members serve what their clients wait for from their own applied
// state: a follower answers a write it relayed once it applied it
// (read-your-writes), and delivers the watch events of a write when it
// applies it. So after an entry with a znode write (ZkTxn) that is the
// last of the log, the leader appends a barrier (an entry the state
// machine never sees) whose append carries the commit. A barrier is never
// nudged for, an entry with another after it needs no nudge, and other
// writes none either: their followers wait for nothing (and the
// barrier's append, in the way of the next write, cost the leader's
// contended native locks a third of their hand-offs). Nor is a write
// nudged for while no follower serves a ZooKeeper client: a follower's
// ZooKeeper clients are relayed to the leader, each over a connection of
// its own (zkrelay.go), so a leader that holds none has no follower
// waiting (a follower that reaches an older leader at its published
// address instead is not nudged: that leader would not nudge either).
// An idle cluster costs nothing, a lone znode write one more small
// append.
func (n *Node) nudgeFollowers(index uint64) {
	if !n.followersWait() || n.raft.LastIndex() != index {
		return
	}
	if len(n.raft.GetConfiguration().Configuration().Servers) < 2 {
		return
	}
	// The barrier's own outcome matters to nobody: a leader that lost its
	// leadership meanwhile has nothing to tell.
	_ = n.start(func() raft.Future { return n.raft.Barrier(n.cfg.ApplyTimeout) })
}

// followersWait reports whether a follower serves a ZooKeeper client
// through this node: whether it holds a ZooKeeper relay connection.
func (n *Node) followersWait() bool {
	return n.zkRelay != nil && n.zkRelay.held() > 0
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
		if leader := n.Leader(); leader != "" && leader != n.cfg.NodeID {
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
