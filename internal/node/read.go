package node

import (
	"context"
	"errors"

	"github.com/hashicorp/raft"

	"github.com/tenure-io/tenure/internal/fsm"
)

// LinearizableRead returns once this node has confirmed it is still the
// leader and has applied everything committed before the call: a read of
// the state after it sees every write that completed before it began. A
// context that has already ended is refused with its error.
//
// A sole voter answers from its own state (soleVoterLeader); a leader with
// peers confirms its leadership with a read round of its own (readRounds,
// below) rather than through raft's leader loop, which is busy with the
// leader's own log append and fsync under load. Only where no round can
// run (this node is not a voter of its latest configuration) does it ask
// raft's leader loop (VerifyLeader).
func (n *Node) LinearizableRead(ctx context.Context) (err error) {
	defer func() { err = n.mapReadStorageErr(err) }()
	if err := ctx.Err(); err != nil {
		return err
	}
	timeout := n.timeout(ctx)
	if timeout <= 0 {
		return context.DeadlineExceeded // 0 would mean no timeout to raft
	}
	if !n.Serving() {
		// A new leader knows what earlier leaders committed only once an
		// entry of its own term is committed; until then its commit index
		// may miss writes that were already acknowledged. Commit one (its
		// promotion, which publishes that it serves, usually has).
		if err := mapReadErr(n.await(ctx, func() raft.Future { return n.raft.Barrier(timeout) })); err != nil {
			return err
		}
	}
	if n.soleVoterLeader() {
		return nil
	}
	commit, err := n.reads.confirm(ctx, n)
	if errors.Is(err, errNoReadRound) {
		commit = n.raft.CommitIndex()
		// Not bounded by ctx: raft answers every verify future when it
		// steps down, and the node's Close ends the rest.
		err = mapReadErr(n.await(context.Background(), func() raft.Future { return n.raft.VerifyLeader() }))
	}
	if err != nil {
		return err
	}
	return n.waitApplied(ctx, commit)
}

// soleVoterLeader reports whether this node serves as leader
// (Leadership.Serving: it has applied every entry of earlier terms) of a
// cluster whose latest configuration has this node as its only voter. A
// read of the state is then linearizable without a round of raft's leader
// loop, which is busy with the leader's own log append (fsync) under load:
//
//   - every write acknowledged in this term was acknowledged by this
//     node, the term's only leader, after its state machine applied it
//     (raft answers an Apply future once the state machine has applied
//     the entry), and every write of an earlier term was applied before
//     the node served in this term (the term's barrier);
//   - no other node can lead a later term while this node's latest
//     configuration has it as its only voter: raft changes membership one
//     server at a time and counts a configuration from when the leader
//     appends it, so any configuration another node may be elected under
//     needs this node's vote, which it gives only after it has left the
//     leader state (which raft's goroutine publishes as it leaves it,
//     before it votes) and moved to the later term. raft's VerifyLeader
//     answers at once on the same grounds (a quorum of one), but only
//     when its leader loop gets to it.
//
// The checks run in this order so that they hold together at the moment
// of the last leadership read: the configuration is read after the first
// (once a voter is added, the leader's latest configuration has two and
// the read takes the quorum path), then the leadership again (a term that
// moved on, or a step-down, means the read takes the quorum path, which
// refuses it).
func (n *Node) soleVoterLeader() bool {
	first := n.Leadership()
	if !first.Serving() {
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
	now := n.Leadership()
	return now.Serving() && now.Term == first.Term
}

// mapReadStorageErr is ErrStorageFull for a read refused as "not the
// leader" while the disk is full and no other node leads.
func (n *Node) mapReadStorageErr(err error) error {
	if !errors.Is(err, ErrNotLeader) {
		return err
	}
	if full := n.storageFull(); full != nil {
		if leader := n.Leader(); leader == "" || leader == n.cfg.NodeID {
			return full
		}
	}
	return err
}

// Read runs fn on the local state (see LinearizableRead).
func (n *Node) Read(fn func(*fsm.State)) { n.fsm.Read(fn) }

// KVView returns a copy-on-write view of the local key-value store and
// its history window, taken in O(1) (fsm.FSM.KVView): a long walk of it
// does not hold the state lock that Apply needs.
func (n *Node) KVView() *fsm.KVView { return n.fsm.KVView() }
