// Package pgtest gives the guard's tests a real PostgreSQL server: the
// shared one named by TENURE_PG_DSN (each test in its own schema), or a
// private instance a test starts, stops and restarts itself.
//
// The shared server is never mocked and never optional: when it cannot be
// reached the test fails and says how to start one.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// DSNEnv names the environment variable that points the tests at a
// PostgreSQL server.
const DSNEnv = "TENURE_PG_DSN"

// DefaultDSN is used when DSNEnv is unset: the server .ci/run starts
// (loopback, trust authentication).
const DefaultDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// StartHint tells a developer how to get a server for the tests.
const StartHint = "Start one with .ci/run's PostgreSQL setup (`bash .ci/run` installs PostgreSQL if needed and " +
	"starts it on 127.0.0.1:5432 with trust authentication for loopback), or set " + DSNEnv +
	" to a reachable server, e.g. " + DefaultDSN

// connectTimeout bounds reaching the server.
const connectTimeout = 10 * time.Second

// DSN returns TENURE_PG_DSN, or DefaultDSN when it is unset.
func DSN() string {
	if d := strings.TrimSpace(os.Getenv(DSNEnv)); d != "" {
		return d
	}
	return DefaultDSN
}

// Redact hides the password of a URL-style DSN for messages.
func Redact(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil || u.User == nil {
		return dsn
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

// Connect opens a connection with cfg, closed when the test ends. It fails
// the test, with StartHint, when the server cannot be reached. With -short
// it skips the test: the quick gate runs without PostgreSQL.
func Connect(t testing.TB, cfg *pgx.ConnConfig) *pgx.Conn {
	t.Helper()
	SkipShort(t)
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("PostgreSQL is unreachable at %s: %v\n%s", Redact(cfg.ConnString()), err, StartHint)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
		defer cancel()
		conn.Close(ctx)
	})
	return conn
}

// SkipShort skips t under -short (`go test -short ./...`, the quick gate,
// runs without PostgreSQL). Connect, Schema and StartPrivate call it; a
// test that does slow work before those calls it first.
func SkipShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs PostgreSQL; skipped with -short")
	}
}

// ParseConfig parses dsn, failing the test on a malformed one.
func ParseConfig(t testing.TB, dsn string) *pgx.ConnConfig {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("%s=%q is not a valid PostgreSQL connection string: %v", DSNEnv, Redact(dsn), err)
	}
	return cfg
}

var nonIdent = regexp.MustCompile(`[^a-z0-9_]+`)

// Schema creates a fresh schema on the shared server (DSN) and returns a
// config whose connections use it as search_path, so the test's tables
// cannot meet another test's. The schema is dropped when the test ends.
func Schema(t testing.TB) *pgx.ConnConfig {
	t.Helper()
	SkipShort(t)
	base := ParseConfig(t, DSN())
	admin := Connect(t, base)
	name := UniqueName(t)
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("create schema %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
		defer cancel()
		if _, err := admin.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
	})
	cfg := base.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["search_path"] = name
	return cfg
}

// SchemaDSN is Schema for code that takes a connection string (programs
// started by a test): the shared server's DSN with search_path set to a
// fresh schema, dropped when the test ends.
func SchemaDSN(t testing.TB) string {
	t.Helper()
	name := Schema(t).RuntimeParams["search_path"]
	base := DSN()
	if u, err := url.Parse(base); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set("search_path", name)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return strings.TrimSpace(base) + " search_path=" + name // keyword/value form
}

// UniqueName returns an SQL identifier derived from the test's name plus
// random bytes: unique across parallel and repeated runs.
func UniqueName(t testing.TB) string {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	n := nonIdent.ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(n) > 40 {
		n = n[:40]
	}
	return "t_" + n + "_" + hex.EncodeToString(b)
}

// Pool is a fixed set of connections that hands one out per transaction:
// enough of a pool to share one guard between goroutines in tests. It
// satisfies pgguard.DB and is safe for concurrent use.
type Pool struct {
	cfg   *pgx.ConnConfig
	conns chan *pgx.Conn
}

// NewPool opens n connections with cfg, closed when the test ends.
func NewPool(t testing.TB, cfg *pgx.ConnConfig, n int) *Pool {
	t.Helper()
	p := &Pool{cfg: cfg, conns: make(chan *pgx.Conn, n)}
	for i := 0; i < n; i++ {
		p.conns <- Connect(t, cfg)
	}
	return p
}

// BeginTx waits for a free connection (or ctx) and starts a transaction on
// it; the connection returns to the pool when the transaction ends.
func (p *Pool) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	var c *pgx.Conn
	select {
	case c = <-p.conns:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if c.IsClosed() {
		// A broken connection is replaced (it is closed by the test's
		// cleanup either way).
		nc, err := pgx.ConnectConfig(ctx, p.cfg)
		if err != nil {
			p.conns <- c
			return nil, err
		}
		c = nc
	}
	tx, err := c.BeginTx(ctx, opts)
	if err != nil {
		p.conns <- c
		return nil, err
	}
	return &pooledTx{Tx: tx, release: func() { p.conns <- c }}, nil
}

type pooledTx struct {
	pgx.Tx
	once    sync.Once
	release func()
}

func (t *pooledTx) Commit(ctx context.Context) error {
	err := t.Tx.Commit(ctx)
	t.once.Do(t.release)
	return err
}

func (t *pooledTx) Rollback(ctx context.Context) error {
	// A failed rollback closes the connection; BeginTx replaces it.
	err := t.Tx.Rollback(ctx)
	t.once.Do(t.release)
	return err
}

// Exec runs sql on a free connection outside any transaction, failing the
// test on error.
func (p *Pool) Exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	c := <-p.conns
	defer func() { p.conns <- c }()
	if _, err := c.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}
