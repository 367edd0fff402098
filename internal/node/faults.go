//go:build !tenurefault

package node

import (
	"time"

	"github.com/hashicorp/raft"

	"github.com/tenure-io/tenure/internal/fsm"
)

// Faults is empty in the product: a node has no switch that weakens a
// check or reroutes its peers. The fault-injection suite builds with the
// tenurefault tag, which replaces this file with faults_on.go.
type Faults struct{}

func (Faults) applyTo(*fsm.FSM) {}

// addressProvider: peers are dialled at their configured addresses.
func (Faults) addressProvider() raft.ServerAddressProvider { return nil }

func (Faults) route(string) (string, bool) { return "", false }

// leaderChangeDelay: leadership notifications are handled at once.
func (Faults) leaderChangeDelay() time.Duration { return 0 }

// beforeReadRound: a read round goes on at once.
func (Faults) beforeReadRound(string) {}

// appendHook: log appends go to the store at once.
func (Faults) appendHook(string) func() { return nil }

// refuseZkRelay: ZooKeeper relay connections are taken.
func (Faults) refuseZkRelay() bool { return false }
