// Package pgstore is an httpguard.Store that keeps each resource key's
// fencing high-water mark in a PostgreSQL table, using jackc/pgx v5.
//
// The table (see CreateTable) has one row per resource key:
//
//	CREATE TABLE IF NOT EXISTS tenure_http_fence (
//	    resource_key text        PRIMARY KEY,
//	    fence_token  bigint      NOT NULL CHECK (fence_token > 0),
//	    accepted_at  timestamptz NOT NULL DEFAULT now()
//	);
//
// Advance is one statement, so the comparison and the update cannot be
// separated by a pause:
//
//	INSERT INTO tenure_http_fence AS f (resource_key, fence_token) VALUES ($1, $2)
//	ON CONFLICT (resource_key) DO UPDATE
//	    SET fence_token = EXCLUDED.fence_token, accepted_at = now()
//	    WHERE f.fence_token <= EXCLUDED.fence_token
//	RETURNING f.fence_token;
//
// A returned row means accepted. No row means the stored token is higher:
// the request is stale (a second statement then reads the stored token for
// the answer). The first write for a new key is the INSERT; two concurrent
// first writes cannot both insert, the loser takes the ON CONFLICT path.
// ON CONFLICT DO UPDATE always locks and examines the latest committed row
// version, so this is race-free under READ COMMITTED, PostgreSQL's default
// and the level this package is written for. Under REPEATABLE READ or
// SERIALIZABLE a concurrent advance of the same key makes the statement
// fail with a serialization error (SQLSTATE 40001): retry the transaction.
//
// # Joining the handler's transaction
//
// AdvanceTx runs the same statement inside a transaction the caller
// controls, typically the one the HTTP handler makes its effect in. The
// key's row stays locked until that transaction ends, so every other
// advance of the same key waits for it, and a newer token that committed
// first makes an older token's AdvanceTx report stale. Roll the
// transaction back on stale: the effect and the mark then move together or
// not at all. This is the strongest form of the check and the only one that
// stays atomic when the service runs as several replicas.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what the store needs from PostgreSQL. *pgxpool.Pool, *pgx.Conn and
// pgx.Tx all satisfy it. The store is safe for concurrent use iff its DB is
// (a pool is; a single *pgx.Conn is not).
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// DefaultTable is the table used when none is configured.
const DefaultTable = "tenure_http_fence"

var identRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// Store keeps high-water marks in one table. It is safe for concurrent use
// when its DB is.
type Store struct {
	db      DB
	table   string // quoted, possibly schema-qualified
	advance string
	current string
}

// New returns a store on db using table ("" means DefaultTable; "schema.table"
// is allowed; each part must be a plain identifier). It does not touch the
// database; call CreateTable once (or ship its DDL as a migration).
func New(db DB, table string) (*Store, error) {
	if db == nil {
		return nil, errors.New("pgstore: nil DB")
	}
	if table == "" {
		table = DefaultTable
	}
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("pgstore: table %q: want name or schema.name", table)
	}
	for _, p := range parts {
		if !identRe.MatchString(p) {
			return nil, fmt.Errorf("pgstore: table %q: %q is not a plain identifier", table, p)
		}
	}
	q := pgx.Identifier(parts).Sanitize()
	return &Store{
		db:    db,
		table: q,
		advance: `INSERT INTO ` + q + ` AS f (resource_key, fence_token) VALUES ($1, $2)
ON CONFLICT (resource_key) DO UPDATE SET fence_token = EXCLUDED.fence_token, accepted_at = now()
WHERE f.fence_token <= EXCLUDED.fence_token
RETURNING f.fence_token`,
		current: `SELECT fence_token FROM ` + q + ` WHERE resource_key = $1`,
	}, nil
}

// Table is the quoted table name.
func (s *Store) Table() string { return s.table }

// DDL is the statement CreateTable runs.
func (s *Store) DDL() string {
	return `CREATE TABLE IF NOT EXISTS ` + s.table + ` (
    resource_key text        PRIMARY KEY,
    fence_token  bigint      NOT NULL CHECK (fence_token > 0),
    accepted_at  timestamptz NOT NULL DEFAULT now()
)`
}

// CreateTable creates the table if it does not exist. Run it once at
// deployment; concurrent first runs may race inside PostgreSQL's catalog.
func (s *Store) CreateTable(ctx context.Context) error {
	if _, err := s.db.Exec(ctx, s.DDL()); err != nil {
		return fmt.Errorf("pgstore: creating %s: %w", s.table, err)
	}
	return nil
}

// Advance implements httpguard.Store in its own implicit transaction.
func (s *Store) Advance(ctx context.Context, key string, token uint64) (bool, uint64, error) {
	return s.AdvanceTx(ctx, s.db, key, token)
}

// AdvanceTx is Advance run through q, usually the caller's pgx.Tx so that
// the mark moves atomically with the caller's effect. On a stale answer
// the transaction is still usable; roll it back so the effect does not
// happen. The mark's row stays locked until the transaction ends.
func (s *Store) AdvanceTx(ctx context.Context, q DB, key string, token uint64) (accepted bool, current uint64, err error) {
	if token == 0 || token > math.MaxInt64 {
		return false, 0, fmt.Errorf("pgstore: token %d outside 1..%d", token, int64(math.MaxInt64))
	}
	if key == "" {
		return false, 0, errors.New("pgstore: empty resource key")
	}
	var got int64
	err = q.QueryRow(ctx, s.advance, key, int64(token)).Scan(&got)
	if err == nil {
		return true, uint64(got), nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return false, 0, fmt.Errorf("pgstore: advancing %q: %w", key, err)
	}
	// Stale. The row exists (rows are never deleted); read the token that
	// beat us for the answer. It may have grown further meanwhile.
	if err := q.QueryRow(ctx, s.current, key).Scan(&got); err != nil {
		return false, 0, fmt.Errorf("pgstore: reading %q after a stale advance: %w", key, err)
	}
	return false, uint64(got), nil
}

// Current reads key's mark (0 if the key was never advanced).
func (s *Store) Current(ctx context.Context, key string) (uint64, error) {
	var got int64
	err := s.db.QueryRow(ctx, s.current, key).Scan(&got)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("pgstore: reading %q: %w", key, err)
	}
	return uint64(got), nil
}
