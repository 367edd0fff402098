package node

import (
	"context"
	"errors"
	"net"
)

// Relaying ZooKeeper's protocol over the peer port
//
// A follower's ZooKeeper front relays what needs the leader (session
// creation, writes, pings, sync, close) to the leader's ZooKeeper front
// (internal/zkapi). It reaches it over the peer listener, as a follower
// forwards Tenure's API (forward.go): a connection whose first byte is
// zkRelayProto runs the same handshake, proving the dialer holds the
// cluster's signing keys, under peer TLS when it is on, and then carries
// ZooKeeper's protocol to the listener ZkRelayListener returns. So the
// relay works when the leader's ZooKeeper listener is TLS only,
// firewalled or on loopback, and is encrypted under peer TLS.
//
// A release that does not know zkRelayProto closes the connection
// without a nonce (raft does not know the byte), and so does a node whose
// ZooKeeper front is off: DialZkRelay then fails with ErrDoorUnsupported,
// and the front falls back to the leader's published ZooKeeper address.

// zkRelayProto is the first byte of a ZooKeeper relay connection: never a
// raft RPC type, nor forwardProto, identityHello or versionProbe.
const zkRelayProto byte = 'Z'

// MaxZkRelayConns bounds the ZooKeeper relay connections a node holds open
// at once (a follower opens one per ZooKeeper client connection it
// serves); another is closed as it is accepted, and the follower's
// client reconnects elsewhere.
const MaxZkRelayConns = 10_000

// zkRelayQueue bounds the relay connections waiting to be accepted: the
// clients of every follower reconnect at once when the leader changes.
const zkRelayQueue = 256

// ErrDoorUnsupported: the member dialled closed a forwarded-API or
// ZooKeeper relay connection before answering its handshake: a release
// without that kind of connection, or (for the relay) a member whose
// ZooKeeper front is off.
var ErrDoorUnsupported = errors.New("node: the peer does not take this kind of connection")

// ZkRelayListener returns the listener of the ZooKeeper relay connections
// that reach this node on its peer port, for this node's ZooKeeper front,
// which serves each as a client connection; nil for a standalone node.
// Until it is first called, such connections are closed unanswered (the
// front is off). The listener is closed when the node closes; the
// connections it handed out are their server's to close.
func (n *Node) ZkRelayListener() net.Listener {
	if n.zkRelay == nil {
		return nil
	}
	n.zkRelay.served.Store(true)
	return n.zkRelay
}

// DialZkRelay opens a ZooKeeper relay connection to member id over its peer
// listener (with peer TLS when it is on), proving this node a member of
// the cluster as DialForward does; the connection then carries
// ZooKeeper's protocol. It fails with ErrStandalone on a standalone node,
// ErrForwardRefused when the member refused the proof,
// ErrDoorUnsupported when it does not take relay connections, and
// otherwise when id is not a member or cannot be reached within ctx.
func (n *Node) DialZkRelay(ctx context.Context, id string) (net.Conn, error) {
	return n.dialDoor(ctx, id, zkRelayProto)
}
