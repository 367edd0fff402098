package pgguard

import (
	"errors"
	"fmt"
	"time"

	"github.com/tenure-io/tenure/client"
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
