package node

import "context"

// OpenRunning is openRunning for the external tests of this package.
var OpenRunning = openRunning

// Beat sends member id at addr the heartbeat the leader's peer watch
// sends, for the external tests of this package.
func (n *Node) Beat(ctx context.Context, id, addr string) error {
	_, _, err := n.beat(ctx, id, addr, 0, 0, true)
	return err
}
