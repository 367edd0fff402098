package fsm

import "fmt"

// Restores and the fence floor
//
// A restore replaces the state with an older or foreign one whose grants
// and registers carry tokens from before it, while clients may still hold
// tokens the replaced state issued. The node therefore restores the state
// at a revision no lower than the one the cluster had reached (so every
// new token is larger than every token issued before) and sets the fence
// floor to that revision: a fenced write whose token is at or below the
// floor is stale, whichever register it names, so no token issued before
// the restore becomes valid again.

// FenceFloor is the token at or below which every fenced write is stale
// (0: none). It is set by a restore and only grows.
func (s *State) FenceFloor() uint64 { return s.fenceFloor }

// checkFenceFloor validates a snapshot's fence floor against its revision.
func checkFenceFloor(floor, revision uint64) error {
	if floor > revision {
		return fmt.Errorf("%w: snapshot: fence floor %d is above the revision %d", ErrInvalid, floor, revision)
	}
	return nil
}
