package pgguard

import (
	"errors"
	"fmt"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/fenceproof"
)

// Sentinel errors. Match them with errors.Is.
var (
	// ErrStale is returned by Guard.Do when the fence row of the key has
	// already accepted a larger token: a newer owner exists. The transaction
	// was rolled back and the work was not run. Stop the work. The error
	// also matches client.ErrStale; errors.As with *StaleError gives the
	// accepted token.
	ErrStale = fmt.Errorf("pgguard: %w", client.ErrStale)
	// ErrDuplicate is returned by Guard.Do when the operation id was already
	// applied for the key (by an earlier call that committed). Nothing was
	// done by this call and the work was not run. A caller retrying after
	// ErrUnknownOutcome treats it as success. errors.As with
	// *DuplicateError says under which token the operation was applied.
	ErrDuplicate = errors.New("pgguard: operation already applied")
	// ErrUnknownOutcome is returned by Guard.Do when COMMIT was sent but its
	// answer was lost (for example the connection broke): the transaction
	// may or may not have committed. Retry with the same operation id to
	// find out. It also matches client.ErrUnknownOutcome.
	ErrUnknownOutcome = fmt.Errorf("pgguard: %w", client.ErrUnknownOutcome)
	// ErrForged is returned by Guard.Do, with a verifier, when the fence's
	// proof does not verify for its token and lock: the token was never
	// granted for that lock. Nothing was sent to the database. It also
	// matches fenceproof.ErrForged; errors.As with *ForgedError says why.
	ErrForged = fmt.Errorf("pgguard: %w", fenceproof.ErrForged)
	// ErrInvalid is returned when a Fence or an option is malformed; the
	// message says why. Nothing was sent to the database. It also matches
	// client.ErrInvalid.
	ErrInvalid = fmt.Errorf("pgguard: %w", client.ErrInvalid)
)

// StaleError is the error Guard.Do returns for a stale token. It matches
// ErrStale and client.ErrStale.
type StaleError struct {
	// Key is the fenced resource.
	Key string
	// Token is the token the caller presented.
	Token uint64
	// Accepted is the larger token the fence row holds.
	Accepted uint64
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("pgguard: stale fence token %d for %q: token %d was already accepted", e.Token, e.Key, e.Accepted)
}

// Unwrap returns ErrStale.
func (e *StaleError) Unwrap() error { return ErrStale }

// DuplicateError is the error Guard.Do returns for an operation id that was
// already applied. It matches ErrDuplicate.
type DuplicateError struct {
	// Key is the fenced resource.
	Key string
	// OperationID is the repeated operation id.
	OperationID string
	// Token is the token the operation was applied under.
	Token uint64
	// AppliedAt is the start time of the transaction that applied it
	// (database clock).
	AppliedAt time.Time
}

func (e *DuplicateError) Error() string {
	return fmt.Sprintf("pgguard: operation %q on %q was already applied under token %d at %s",
		e.OperationID, e.Key, e.Token, e.AppliedAt.UTC().Format(time.RFC3339Nano))
}

// Unwrap returns ErrDuplicate.
func (e *DuplicateError) Unwrap() error { return ErrDuplicate }

// ForgedError is the error Guard.Do returns for a fence proof that does
// not verify. It matches ErrForged and fenceproof.ErrForged, never
// ErrStale: a forged token is not a late owner's.
type ForgedError struct {
	// Key is the fenced resource, Lock the lock the proof was checked for.
	Key, Lock string
	// Token is the token the caller presented.
	Token uint64
	// Reason is the verifier's error.
	Reason error
}

func (e *ForgedError) Error() string {
	return fmt.Sprintf("pgguard: forged fence token %d for %q (lock %q): %v", e.Token, e.Key, e.Lock, e.Reason)
}

// Unwrap returns ErrForged.
func (e *ForgedError) Unwrap() error { return ErrForged }
