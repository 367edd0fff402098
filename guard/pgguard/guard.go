package pgguard

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tenure-io/tenure/fenceproof"
)

// Limits on a Fence's fields, in bytes. They keep the primary-key index
// entries of tenure_fence_ops well below PostgreSQL's B-tree limit.
const (
	MaxKeyLen         = 1024
	MaxOperationIDLen = 1024
)

// rollbackTimeout bounds the rollback that follows a failed or cancelled
// transaction.
const rollbackTimeout = 5 * time.Second

// DB is what the guard needs from a PostgreSQL handle: a way to start a
// transaction. *pgx.Conn and *pgxpool.Pool satisfy it. Whether the Guard is
// safe for concurrent use depends on it: a *pgxpool.Pool is, a single
// *pgx.Conn is not.
type DB interface {
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
}

// Fence names the guarded resource and the caller's authority over it.
type Fence struct {
	// Key identifies the fenced resource: every writer of the same data
	// must use the same key (the Tenure lock name is a good choice). 1 to
	// MaxKeyLen bytes of UTF-8 without NUL.
	Key string
	// Token is the fencing token of the caller's current hold
	// (client.Hold.Token, or TENURE_FENCE_TOKEN under `tenure lock`). It
	// must be positive and at most math.MaxInt64 (PostgreSQL's bigint).
	Token uint64
	// OperationID makes the call idempotent: the first call that commits
	// with a given (Key, OperationID) applies the work; any later call with
	// the same pair returns ErrDuplicate without running it. Empty means
	// no retry detection: every call that is not stale applies the work.
	// At most MaxOperationIDLen bytes of UTF-8 without NUL.
	OperationID string
	// Proof is the grant's fence proof (client.Hold.Proof, or
	// TENURE_FENCE_PROOF under `tenure lock`). A Guard made WithVerifier
	// requires one that verifies for Token and Lock; without a verifier
	// it is not looked at.
	Proof string
	// Lock is the Tenure lock whose grant carried Token, for the proof
	// check; empty means a lock named like Key.
	Lock string
}

func (f Fence) validate() error {
	if err := validText("fence key", f.Key, MaxKeyLen); err != nil {
		return err
	}
	if f.Key == "" {
		return fmt.Errorf("%w: fence key must not be empty", ErrInvalid)
	}
	if f.Token == 0 {
		return fmt.Errorf("%w: fence token must be positive", ErrInvalid)
	}
	if f.Token > math.MaxInt64 {
		return fmt.Errorf("%w: fence token %d does not fit PostgreSQL's bigint", ErrInvalid, f.Token)
	}
	return validText("operation id", f.OperationID, MaxOperationIDLen)
}

func validText(what, s string, limit int) error {
	switch {
	case len(s) > limit:
		return fmt.Errorf("%w: %s is %d bytes, the limit is %d", ErrInvalid, what, len(s), limit)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, what)
	case strings.IndexByte(s, 0) >= 0:
		return fmt.Errorf("%w: %s contains a NUL byte", ErrInvalid, what)
	}
	return nil
}

// defaultTxOptions: READ COMMITTED is all the fence needs (see the package
// documentation).
var defaultTxOptions = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}

// Option configures New. An option returns an error on bad input.
type Option func(*Guard) error

// WithTxOptions sets the options of the transactions Do starts (default:
// READ COMMITTED, read-write). A stronger isolation level is safe too, but
// contention then fails with serialization errors (SQLSTATE 40001) instead
// of ErrStale. An empty IsoLevel means the server's
// default_transaction_isolation. A read-only access mode is rejected.
func WithTxOptions(o pgx.TxOptions) Option {
	return func(g *Guard) error {
		if o.AccessMode == pgx.ReadOnly {
			return fmt.Errorf("%w: a guarded transaction must be read-write", ErrInvalid)
		}
		g.txOptions = o
		return nil
	}
}

// WithVerifier makes Do accept a token only with a fence proof that v
// verifies for the fence's lock (Fence.Proof, Fence.Lock): anything else
// is ErrForged before the database is touched, with no round trip to
// Tenure. Build v from the cluster's public keys (fenceproof.ParseKeyset
// of `tenure cluster keys -o json`), and keep it fresh (Verifier.Refresh)
// so that keys the cluster retires stop verifying here. A nil v is an
// error.
func WithVerifier(v *fenceproof.Verifier) Option {
	return func(g *Guard) error {
		if v == nil {
			return fmt.Errorf("%w: nil verifier", ErrInvalid)
		}
		g.verifier = v
		return nil
	}
}

// Guard runs work in fenced, idempotent transactions. Its methods are safe
// for concurrent use when its DB is (a *pgxpool.Pool is). It holds no
// resources of its own: there is nothing to close.
type Guard struct {
	db        DB
	txOptions pgx.TxOptions
	verifier  *fenceproof.Verifier // nil: proofs are not checked

	applied   atomic.Uint64
	stale     atomic.Uint64
	duplicate atomic.Uint64
	unknown   atomic.Uint64
	forged    atomic.Uint64
}

// New returns a Guard over db. It does not touch the database; create the
// tables with Migrate (or Schema) first.
func New(db DB, opts ...Option) (*Guard, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil DB", ErrInvalid)
	}
	g := &Guard{db: db, txOptions: defaultTxOptions}
	for _, o := range opts {
		if err := o(g); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// Work is the caller's part of a guarded transaction. It must make every
// write it wants fenced through tx, must not commit or roll tx back, and
// must return the first error it meets (any error rolls everything back).
// It runs at most once per Do call, after the fence check has passed.
type Work func(ctx context.Context, tx pgx.Tx) error

// Do runs work in one transaction fenced by f: the work runs, and its
// writes commit, only if f.Token is at least the largest token accepted for
// f.Key and f.OperationID (if any) was never applied for f.Key. See the
// package documentation for the statements and the safety contract.
//
// Do returns nil when the transaction committed. Otherwise nothing it
// started is left behind, and the error matches:
//
//   - ErrStale (and client.ErrStale): a larger token was accepted for the
//     key; the work did not run. Stop: a newer owner exists.
//   - ErrDuplicate: the operation id was applied before; the work did not
//     run.
//   - ErrUnknownOutcome: COMMIT was sent but its answer was lost; retry with
//     the same operation id.
//   - ErrForged: the Guard has a verifier (WithVerifier) and f.Proof does
//     not verify for f.Token and f.Lock; nothing was sent and the work did
//     not run. The token was never granted for this lock: a bug or an
//     attacker, not a late owner.
//   - ErrInvalid: f is malformed; nothing was sent.
//   - whatever work returned, unchanged (the transaction was rolled back).
//   - a database or context error, wrapped.
//
// Pass the hold's Context (client.Hold.Context) as ctx to stop as soon as
// ownership is in doubt; the fence check is what keeps a late transaction
// harmless either way.
func (g *Guard) Do(ctx context.Context, f Fence, work Work) error {
	if err := f.validate(); err != nil {
		return err
	}
	if work == nil {
		return fmt.Errorf("%w: nil work function", ErrInvalid)
	}
	if g.verifier != nil {
		lock := f.Lock
		if lock == "" {
			lock = f.Key
		}
		if err := g.verifier.Verify(lock, f.Token, f.Proof); err != nil {
			g.forged.Add(1)
			return &ForgedError{Key: f.Key, Lock: lock, Token: f.Token, Reason: err}
		}
	}
	tx, err := g.db.BeginTx(ctx, g.txOptions)
	if err != nil {
		return fmt.Errorf("pgguard: begin: %w", err)
	}
	done := false
	defer func() {
		if !done {
			rollback(ctx, tx)
		}
	}()
	token := int64(f.Token)

	// 1. The operation id first: a retry of an applied operation is told
	// so (ErrDuplicate) even when its token has been overtaken since. A
	// concurrent transaction inserting the same id makes this statement
	// wait for its outcome.
	if f.OperationID != "" {
		tag, err := tx.Exec(ctx, `INSERT INTO tenure_fence_ops (resource_key, operation_id, token, applied_at)
VALUES ($1, $2, $3, now())
ON CONFLICT (resource_key, operation_id) DO NOTHING`, f.Key, f.OperationID, token)
		if err != nil {
			return fmt.Errorf("pgguard: record operation: %w", err)
		}
		if tag.RowsAffected() == 0 {
			dup := &DuplicateError{Key: f.Key, OperationID: f.OperationID}
			var prev int64
			err := tx.QueryRow(ctx, `SELECT token, applied_at FROM tenure_fence_ops
WHERE resource_key = $1 AND operation_id = $2`, f.Key, f.OperationID).Scan(&prev, &dup.AppliedAt)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) { // ErrNoRows: forgotten meanwhile
				return fmt.Errorf("pgguard: read applied operation: %w", err)
			}
			dup.Token = uint64(prev)
			g.duplicate.Add(1)
			return dup
		}
	}

	// 2. The fence: one statement that checks and advances, holding the
	// row lock until commit.
	tag, err := tx.Exec(ctx, `INSERT INTO tenure_fence AS f (resource_key, fence_token, updated_at)
VALUES ($1, $2, now())
ON CONFLICT (resource_key) DO UPDATE
SET fence_token = EXCLUDED.fence_token, updated_at = now()
WHERE f.fence_token <= EXCLUDED.fence_token`, f.Key, token)
	if err != nil {
		return fmt.Errorf("pgguard: advance fence: %w", err)
	}
	if tag.RowsAffected() == 0 {
		g.stale.Add(1)
		var accepted int64
		if err := tx.QueryRow(ctx, `SELECT fence_token FROM tenure_fence WHERE resource_key = $1`, f.Key).Scan(&accepted); err != nil {
			return fmt.Errorf("%w (reading the accepted token failed: %v)", ErrStale, err)
		}
		return &StaleError{Key: f.Key, Token: f.Token, Accepted: uint64(accepted)}
	}

	// 3. The caller's work, then commit.
	if err := work(ctx, tx); err != nil {
		return err
	}
	done = true
	if err := tx.Commit(ctx); err != nil {
		return g.commitFailed(err)
	}
	g.applied.Add(1)
	return nil
}

// commitFailed classifies a failed COMMIT: definitely rolled back, or
// unknown. pgx has closed the transaction (and, if the connection was left
// inside it, the connection) by then.
func (g *Guard) commitFailed(err error) error {
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrTxCommitRollback):
		// The server answered ROLLBACK: an earlier statement had failed.
		return fmt.Errorf("pgguard: transaction rolled back at commit (did the work ignore an error?): %w", err)
	case errors.Is(err, pgx.ErrTxClosed):
		return fmt.Errorf("pgguard: the work function ended the transaction itself: %w", err)
	case errors.As(err, &pgErr):
		// The server answered COMMIT with an error (a deferred constraint,
		// a serialization failure): the transaction was rolled back.
		return fmt.Errorf("pgguard: commit: %w", err)
	case pgconn.SafeToRetry(err):
		// COMMIT never left this process; the server rolls the
		// transaction back when its connection closes.
		return fmt.Errorf("pgguard: commit not sent: %w", err)
	}
	g.unknown.Add(1)
	return fmt.Errorf("%w: commit: %w", ErrUnknownOutcome, err)
}

// Current returns the largest token accepted for key, and whether the key
// has a fence row at all. It is a plain read: by the time it returns a
// larger token may have been accepted.
func (g *Guard) Current(ctx context.Context, key string) (token uint64, found bool, err error) {
	tx, err := g.db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted, AccessMode: pgx.ReadOnly})
	if err != nil {
		return 0, false, fmt.Errorf("pgguard: begin: %w", err)
	}
	defer rollback(ctx, tx)
	var t int64
	err = tx.QueryRow(ctx, `SELECT fence_token FROM tenure_fence WHERE resource_key = $1`, key).Scan(&t)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("pgguard: read fence: %w", err)
	}
	return uint64(t), true, nil
}

// Stats counts the outcomes of Do since the Guard was created.
type Stats struct {
	// Applied: transactions that committed.
	Applied uint64
	// Stale: calls rejected because a larger token had been accepted. A
	// non-zero value means some owner acted after losing its lock: the
	// fence stopped it, but look at `tenure lock history` for why it was
	// late (GC pauses, a TTL shorter than the work's stalls).
	Stale uint64
	// Duplicate: calls whose operation id had already been applied.
	Duplicate uint64
	// UnknownOutcome: calls whose COMMIT answer was lost.
	UnknownOutcome uint64
	// Forged: calls refused because their fence proof did not verify
	// (WithVerifier). Any is a bug or an attack: a token nobody was
	// granted for the lock.
	Forged uint64
}

// Stats returns the Guard's counters. Each counter is read atomically; the
// set is not a snapshot of one instant. Safe for concurrent use.
func (g *Guard) Stats() Stats {
	return Stats{
		Applied:        g.applied.Load(),
		Stale:          g.stale.Load(),
		Duplicate:      g.duplicate.Load(),
		UnknownOutcome: g.unknown.Load(),
		Forged:         g.forged.Load(),
	}
}

// rollback ends tx, with a fresh bounded context when ctx is already done
// (a rollback must still reach the server). Errors are ignored: a failed
// rollback leaves nothing committed, and pgx closes a broken connection.
func rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_ = tx.Rollback(rctx)
}
