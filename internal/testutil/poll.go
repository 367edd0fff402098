package testutil

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// PollInterval is how often WaitFor and PollUntil check their condition.
const PollInterval = 5 * time.Millisecond

// ErrPollTimeout is returned by PollUntil when its deadline passes.
var ErrPollTimeout = errors.New("testutil: timed out")

// PollUntil calls cond every PollInterval until it reports true (nil),
// returns an error (that error), or d passes (an error wrapping
// ErrPollTimeout). It may be called from any goroutine.
func PollUntil(d time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(d)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w after %v", ErrPollTimeout, d)
		}
		time.Sleep(PollInterval)
	}
}

// WaitFor calls cond every PollInterval until it holds, and fails the test
// (from the test's goroutine only) if d passes first; what names the
// condition in the failure.
func WaitFor(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	if err := PollUntil(d, func() (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}
