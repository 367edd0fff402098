package server

// The peer-port door of the ZooKeeper front (internal/zkapi): a follower
// relays what needs the leader over it (node's zkrelay.go), and the
// leader's front serves what comes in by it as client connections.

import (
	"context"
	"crypto/x509"
	"net"

	"github.com/tenure-io/tenure/internal/node"
)

// ErrDoorUnsupported: the member dialled does not take ZooKeeper relay
// connections (a release without them, or its ZooKeeper front is off).
var ErrDoorUnsupported = node.ErrDoorUnsupported

// ZkRelayListener returns the listener of the ZooKeeper relay connections
// other members open to this node over its peer port, each proved to come
// from a member of this cluster; nil for a standalone node. Until it is
// first called, this node refuses such connections as a release without
// them does.
func (f Front) ZkRelayListener() net.Listener {
	if l := f.s.node.ZkRelayListener(); l != nil {
		return l
	}
	return nil
}

// DialZkRelay opens a ZooKeeper relay connection to member id over the
// peer port (with peer TLS when it is on), this node proved a member of
// the cluster. It fails with ErrDoorUnsupported when id does not take
// one, and otherwise as node.Node.DialZkRelay does.
func (f Front) DialZkRelay(ctx context.Context, id string) (net.Conn, error) {
	return f.s.node.DialZkRelay(ctx, id)
}

// CertNamesOf are the names a verified client certificate identifies its
// caller by (common name first, then its subject alternative names), as
// on Tenure's API: ResolveCaller takes them.
func CertNamesOf(cert *x509.Certificate) []string { return certNames(cert) }
