//go:build !tenurefault

package fsm

// faults is empty in the product: the state machine has no switch that
// weakens its checks. The fault-injection suite builds with the tenurefault
// tag, which replaces this file with faults_on.go.
type faults struct{}

// skipFenceCheck is constant false here, so the check cannot be skipped.
func (faults) skipFenceCheck() bool { return false }
