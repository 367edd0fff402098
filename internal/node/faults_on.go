//go:build tenurefault

package node

import (
	"fmt"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tenure-io/tenure/internal/fsm"
)

// Faults are the fault-injection switches of a tenurefault build (tests
// only; a normal build has none, see faults.go).
type Faults struct {
	// PeerRoutes overrides, for this node only, the address it dials to
	// reach a peer (id → address). The fault-injection suite uses it to
	// put a proxy on every directed link between two nodes.
	PeerRoutes map[string]string
	// SkipFenceCheck disables the fenced registers' token check: for
	// proving that the fault-injection checker catches stale writes only.
	SkipFenceCheck bool
	// LeaderChangeDelay holds up the node's handling of each leadership
	// notification (promotion, demotion) by this long, as a promotion
	// busy proposing its settings holds up the demotion that follows: no
	// consumer of the node's leadership may lag behind it meanwhile.
	LeaderChangeDelay time.Duration
	// BeforeReadRound, if set, is called by a leader's read round after
	// it recorded its term and commit index and before it asks its peers
	// (readindex.go), with the node's id: a test holds it to put a read in the state of a
	// leader paused there.
	BeforeReadRound func(node string)
	// BeforeAppend, if set, is called before each append to this node's
	// log store (in raft's leader loop on a leader), with the node's id: a test holds it to
	// stall the leader's appends.
	BeforeAppend func(node string)
	// RefuseZkRelay makes the node treat a ZooKeeper relay connection as
	// a release without it does: raft closes it unanswered (zkrelay.go).
	RefuseZkRelay bool
}

func (f Faults) refuseZkRelay() bool { return f.RefuseZkRelay }

func (f Faults) beforeReadRound(node string) {
	if f.BeforeReadRound != nil {
		f.BeforeReadRound(node)
	}
}

func (f Faults) appendHook(node string) func() {
	if f.BeforeAppend == nil {
		return nil
	}
	return func() { f.BeforeAppend(node) }
}

func (f Faults) leaderChangeDelay() time.Duration { return f.LeaderChangeDelay }

func (f Faults) applyTo(m *fsm.FSM) {
	if f.SkipFenceCheck {
		m.SetUnsafeSkipFenceCheck()
	}
}

// addressProvider is nil (peers dialled at their configured addresses)
// without PeerRoutes.
func (f Faults) addressProvider() raft.ServerAddressProvider {
	if len(f.PeerRoutes) == 0 {
		return nil
	}
	return routes(f.PeerRoutes)
}

func (f Faults) route(id string) (string, bool) {
	r, ok := f.PeerRoutes[id]
	return r, ok
}

// routes is a raft.ServerAddressProvider over PeerRoutes.
type routes map[string]string

func (r routes) ServerAddr(id raft.ServerID) (raft.ServerAddress, error) {
	if addr, ok := r[string(id)]; ok {
		return raft.ServerAddress(addr), nil
	}
	return "", fmt.Errorf("no route override for %s", id)
}
