package pgguard_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/guard/pgguard"
	"github.com/tenure-io/tenure/internal/pgtest"
)

// testTimeout bounds every database call a test makes.
const testTimeout = 30 * time.Second

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// setup gives a test its own schema on the shared server, with the guard's
// tables and the test's domain tables, a pool of n connections and a
// guard over it.
func setup(t *testing.T, n int) (*pgtest.Pool, *pgguard.Guard) {
	t.Helper()
	cfg := pgtest.Schema(t)
	pool := pgtest.NewPool(t, cfg, n)
	g := newGuard(t, pool)
	createDomain(t, pool)
	return pool, g
}

func newGuard(t *testing.T, db pgguard.DB) *pgguard.Guard {
	t.Helper()
	if err := pgguard.Migrate(testCtx(t), db); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	g, err := pgguard.New(db)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return g
}

// execer is what the domain helpers need: a *pgx.Conn or a *pgtest.Pool.
type execer interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// domainDDL: a register the guarded work overwrites (balances) and a log
// of every effect (effects), in commit order per key (id is taken while the
// fence row is locked).
const domainDDL = `
CREATE TABLE IF NOT EXISTS balances (
    account text PRIMARY KEY,
    value   text NOT NULL,
    token   bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS effects (
    id     bigserial PRIMARY KEY,
    key    text NOT NULL,
    op     text NOT NULL,
    token  bigint NOT NULL,
    value  text NOT NULL,
    worker int NOT NULL DEFAULT 0
);`

func createDomain(t *testing.T, db execer) {
	t.Helper()
	inTx(t, db, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, domainDDL)
		return err
	})
}

// inTx runs fn in a transaction outside any guard.
func inTx(t *testing.T, db execer, fn func(ctx context.Context, tx pgx.Tx) error) {
	t.Helper()
	ctx := testCtx(t)
	if err := pgx.BeginTxFunc(ctx, db, pgx.TxOptions{}, func(tx pgx.Tx) error { return fn(ctx, tx) }); err != nil {
		t.Fatal(err)
	}
}

// queryInt runs a one-value query.
func queryInt(t *testing.T, db execer, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	inTx(t, db, func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, sql, args...).Scan(&n)
	})
	return n
}

// setBalance is the guarded work of most tests: overwrite the account's
// value and log the effect. ran reports whether the work was run at all.
func setBalance(ctx context.Context, g *pgguard.Guard, key string, token uint64, op, value string) (ran bool, err error) {
	err = g.Do(ctx, pgguard.Fence{Key: key, Token: token, OperationID: op}, func(ctx context.Context, tx pgx.Tx) error {
		ran = true
		if _, err := tx.Exec(ctx, `INSERT INTO balances (account, value, token) VALUES ($1, $2, $3)
ON CONFLICT (account) DO UPDATE SET value = EXCLUDED.value, token = EXCLUDED.token`, key, value, int64(token)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (key, op, token, value) VALUES ($1, $2, $3, $4)`, key, op, int64(token), value)
		return err
	})
	return ran, err
}

func balance(t *testing.T, db execer, key string) (value string, token int64) {
	t.Helper()
	inTx(t, db, func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT value, token FROM balances WHERE account = $1`, key).Scan(&value, &token)
	})
	return value, token
}

func wantStale(t *testing.T, err error, token, accepted uint64) {
	t.Helper()
	if !errors.Is(err, pgguard.ErrStale) || !errors.Is(err, client.ErrStale) {
		t.Fatalf("err = %v, want one matching pgguard.ErrStale and client.ErrStale", err)
	}
	var se *pgguard.StaleError
	if !errors.As(err, &se) {
		t.Fatalf("err = %T %v, want a *pgguard.StaleError", err, err)
	}
	if se.Token != token || se.Accepted != accepted {
		t.Fatalf("StaleError{Token: %d, Accepted: %d}, want {%d, %d}", se.Token, se.Accepted, token, accepted)
	}
}

func wantDuplicate(t *testing.T, err error, appliedUnder uint64) {
	t.Helper()
	var de *pgguard.DuplicateError
	if !errors.Is(err, pgguard.ErrDuplicate) || !errors.As(err, &de) {
		t.Fatalf("err = %v, want a *pgguard.DuplicateError matching pgguard.ErrDuplicate", err)
	}
	if de.Token != appliedUnder {
		t.Fatalf("DuplicateError.Token = %d, want %d", de.Token, appliedUnder)
	}
}
