package node

import (
	"context"

	"github.com/hashicorp/raft"
)

// OpenRunning is openRunning for the external tests of this package.
var OpenRunning = openRunning

// Beat sends member id at addr the heartbeat the leader's peer watch
// sends, for the external tests of this package.
func (n *Node) Beat(ctx context.Context, id, addr string) error {
	_, _, err := n.beat(ctx, id, addr, 0, 0, true)
	return err
}

// VerifyLeaderRead is LinearizableRead's way before read rounds, for the
// benchmark that compares them: the commit index, raft's VerifyLeader
// (through the leader loop), then the wait until it is applied.
func (n *Node) VerifyLeaderRead(ctx context.Context) error {
	commit := n.raft.CommitIndex()
	if err := mapReadErr(n.await(ctx, func() raft.Future { return n.raft.VerifyLeader() })); err != nil {
		return err
	}
	return n.waitApplied(ctx, commit)
}

// FollowersWait is followersWait, for the external tests of this package.
func (n *Node) FollowersWait() bool { return n.followersWait() }
