package pgguard

import (
	"context"
	_ "embed"
	"fmt"
	"time"
)

// Schema is the DDL of the guard's tables (schema.sql): tenure_fence, one
// row per fenced resource, and tenure_fence_ops, one row per applied
// operation id. Every statement is idempotent (IF NOT EXISTS). Run it with
// your migration tool, or call Migrate.
//
//go:embed schema.sql
var Schema string

// migrateLockID is the advisory lock that serialises concurrent Migrate
// calls (CREATE TABLE IF NOT EXISTS is not safe against a concurrent
// creator of the same table).
const migrateLockID int64 = 0x74656e7572650001 // "tenure" + 1

// Migrate creates the guard's tables in the first schema of the
// connection's search_path if they do not exist yet. It is idempotent and
// safe to call concurrently from many processes (the calls are serialised
// by a transaction-scoped advisory lock); it runs in one transaction, so it
// creates everything or nothing.
func Migrate(ctx context.Context, db DB) error {
	tx, err := db.BeginTx(ctx, defaultTxOptions)
	if err != nil {
		return fmt.Errorf("pgguard: migrate: begin: %w", err)
	}
	defer rollback(ctx, tx)
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrateLockID); err != nil {
		return fmt.Errorf("pgguard: migrate: lock: %w", err)
	}
	// No arguments: pgx sends the whole script with the simple protocol.
	if _, err := tx.Exec(ctx, Schema); err != nil {
		return fmt.Errorf("pgguard: migrate: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgguard: migrate: commit: %w", err)
	}
	return nil
}

// ForgetOperations deletes the operation ids applied before the given time
// (database clock) and returns how many it deleted. After that, a retry of
// a forgotten operation id is applied again (if its token is still
// current), so keep ids for longer than any retry can arrive. It is safe for
// concurrent use with Do.
func (g *Guard) ForgetOperations(ctx context.Context, before time.Time) (int64, error) {
	tx, err := g.db.BeginTx(ctx, defaultTxOptions)
	if err != nil {
		return 0, fmt.Errorf("pgguard: forget operations: begin: %w", err)
	}
	defer rollback(ctx, tx)
	tag, err := tx.Exec(ctx, "DELETE FROM tenure_fence_ops WHERE applied_at < $1", before)
	if err != nil {
		return 0, fmt.Errorf("pgguard: forget operations: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("pgguard: forget operations: commit: %w", err)
	}
	return tag.RowsAffected(), nil
}
