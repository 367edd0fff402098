//go:build tenurefault

package fsm

// faults holds the fault-injection switches of a tenurefault build (tests
// only; a normal build has none, see faults.go). They belong to the process,
// not to the replicated state: snapshots do not carry them.
type faults struct {
	skipFence bool
}

func (f faults) skipFenceCheck() bool { return f.skipFence }

// SetUnsafeSkipFenceCheck makes fenced registers accept every token, so that
// the fault-injection suite can prove its checker catches stale writes.
// It exists only in tenurefault builds.
func (s *State) SetUnsafeSkipFenceCheck() { s.faults.skipFence = true }

// SetUnsafeSkipFenceCheck turns off the fenced registers' token check (see
// State.SetUnsafeSkipFenceCheck). Call it before raft starts. It exists only
// in tenurefault builds.
func (f *FSM) SetUnsafeSkipFenceCheck() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state.SetUnsafeSkipFenceCheck()
}
