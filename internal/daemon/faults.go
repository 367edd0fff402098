//go:build !tenurefault

package daemon

import "net"

// clientFaults is empty in the product: the client API's listener has no
// switch. The fault-injection suite builds with the tenurefault tag,
// which replaces this file with faults_on.go.
type clientFaults struct{}

func newClientFaults(lis net.Listener) (net.Listener, clientFaults) { return lis, clientFaults{} }
