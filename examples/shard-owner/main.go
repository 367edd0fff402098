// Command shard-owner takes the Tenure lock of one shard and, while it
// holds it, writes the shard's state to PostgreSQL through guard/pgguard
// with its fencing token. If it is paused past its TTL (GC, SIGSTOP) and
// another owner takes the shard over, its late transaction is rejected as
// stale and the table keeps the new owner's writes.
//
//	go run ./examples/shard-owner -shard shard-7 -owner A
//
// Flags: -shard, -owner, -ttl, -interval, -writes (0: until stopped),
// -endpoint (default TENURE_ENDPOINT, else 127.0.0.1:7070). PostgreSQL comes
// from TENURE_PG_DSN (default
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable).
//
// Exit status: 0 done (or stopped by SIGINT/SIGTERM), 3 stale (a newer
// owner's token was accepted: this owner's write was rejected), 4 the lock
// was lost, 1 other errors.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/guard/pgguard"
)

// DefaultDSN is the PostgreSQL server used when TENURE_PG_DSN is unset.
const DefaultDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Exit statuses, as the tenure CLI uses them.
const (
	exitOK      = 0
	exitError   = 1
	exitStale   = 3
	exitNotHeld = 4
)

// writeTimeout bounds one guarded transaction.
const writeTimeout = 10 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := realMain(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

type config struct {
	endpoint string
	dsn      string
	shard    string
	owner    string
	ttl      time.Duration
	interval time.Duration
	writes   int
}

func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	var cfg config
	host, _ := os.Hostname()
	endpoint := getenv("TENURE_ENDPOINT")
	if endpoint == "" {
		endpoint = client.DefaultEndpoint
	}
	fs := flag.NewFlagSet("shard-owner", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.endpoint, "endpoint", endpoint, "Tenure server")
	fs.StringVar(&cfg.shard, "shard", "shard-7", "shard to own (the lock name and the fence key)")
	fs.StringVar(&cfg.owner, "owner", fmt.Sprintf("%s-%d", host, os.Getpid()), "owner name, shown in lock status and in the table")
	fs.DurationVar(&cfg.ttl, "ttl", 3*time.Second, "session TTL")
	fs.DurationVar(&cfg.interval, "interval", time.Second, "time between writes")
	fs.IntVar(&cfg.writes, "writes", 0, "stop after this many writes (0: until stopped)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if cfg.interval <= 0 || cfg.writes < 0 {
		return cfg, errors.New("-interval must be positive and -writes not negative")
	}
	cfg.dsn = getenv("TENURE_PG_DSN")
	if cfg.dsn == "" {
		cfg.dsn = DefaultDSN
	}
	return cfg, nil
}

// realMain is main without the process: arguments, environment and output
// are passed in, the exit status is returned.
func realMain(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cfg, err := parseConfig(args, getenv, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "shard-owner: %v\n", err)
		return exitError
	}
	err = own(ctx, cfg, stdout)
	code := exitCode(ctx, err)
	if code != exitOK {
		fmt.Fprintf(stderr, "shard-owner %s: %v\n", cfg.owner, err)
	}
	return code
}

// exitCode maps the outcome of own to the exit status.
func exitCode(ctx context.Context, err error) int {
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, pgguard.ErrStale):
		return exitStale
	case errors.Is(err, errLost):
		return exitNotHeld
	case ctx.Err() != nil:
		return exitOK // stopped by a signal
	}
	return exitError
}

// own connects to Tenure and PostgreSQL, waits for the shard's lock and
// runs an Owner with the hold until it is done, stale or lost.
func own(ctx context.Context, cfg config, out io.Writer) error {
	conn, err := pgx.Connect(ctx, cfg.dsn)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL (TENURE_PG_DSN): %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := setup(ctx, conn); err != nil {
		return err
	}
	g, err := pgguard.New(conn)
	if err != nil {
		return err
	}

	c, err := client.Dial(ctx, cfg.endpoint)
	if err != nil {
		return err
	}
	defer c.Close()
	s, err := c.NewSession(ctx, client.WithTTL(cfg.ttl), client.WithOwner(cfg.owner))
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		s.Close(cctx) // after a loss the session is gone: errors expected
	}()
	m, err := s.Mutex(cfg.shard)
	if err != nil {
		return err
	}
	h, err := m.Lock(ctx, client.OnQueued(func(pos int) {
		fmt.Fprintf(out, "%s: waiting for %s (position %d)\n", cfg.owner, cfg.shard, pos)
	}))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%s: owns %s with token %d\n", cfg.owner, cfg.shard, h.Token())
	o := &Owner{Guard: g, Shard: cfg.shard, Name: cfg.owner, Interval: cfg.interval, Writes: cfg.writes, Out: out}
	err = o.Run(ctx, h)
	if errors.Is(err, pgguard.ErrStale) {
		return err // a newer owner holds the lock: there is nothing to release
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	h.Unlock(uctx) // after a loss this reports ErrNotHeld: nothing to do
	return err
}

// schema is the example's own tables: the shard's current state (one row,
// overwritten) and a log of every accepted write.
const schema = `
CREATE TABLE IF NOT EXISTS shard_state (
    shard      text PRIMARY KEY,
    owner      text NOT NULL,
    token      bigint NOT NULL,
    seq        int NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS shard_log (
    id         bigserial PRIMARY KEY,
    shard      text NOT NULL,
    owner      text NOT NULL,
    token      bigint NOT NULL,
    seq        int NOT NULL,
    written_at timestamptz NOT NULL DEFAULT now()
);`

// setup creates the guard's and the example's tables (idempotent).
func setup(ctx context.Context, conn *pgx.Conn) error {
	if err := pgguard.Migrate(ctx, conn); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('examples/shard-owner schema'))`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, schema)
		return err
	})
}

// errLost: the hold ended before the owner was done.
var errLost = errors.New("shard-owner: lost the lock")

// Owner writes a shard's state while it holds the shard's lock. Run it on
// one goroutine.
type Owner struct {
	Guard    *pgguard.Guard
	Shard    string
	Name     string
	Interval time.Duration
	Writes   int // 0: until ctx ends or the hold is lost
	Out      io.Writer

	// beforeWrite, if set, runs after the owner has checked its hold and
	// before it writes: the place where a pause does the most harm. Tests
	// stall the owner here.
	beforeWrite func(seq int)
}

// Run writes every Interval until Writes are done (nil), ctx ends (its
// error), the hold turns suspect or lost (errLost) or a write is rejected as
// stale (an error matching pgguard.ErrStale: a newer owner exists).
//
// The owner checks its hold before each write and stops as soon as the
// hold's Context is cancelled. That check can always be overtaken by a
// pause right after it, so the write itself is fenced, and it deliberately
// runs on ctx rather than on the hold's Context: whether a late write may
// land is decided by the fence in PostgreSQL, not by this process's view of
// its lease.
func (o *Owner) Run(ctx context.Context, h *client.Hold) error {
	for seq := 1; o.Writes == 0 || seq <= o.Writes; seq++ {
		if seq > 1 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-h.Context().Done():
				return fmt.Errorf("%w (%v): stopping before write %d", errLost, h.State(), seq)
			case <-time.After(o.Interval):
			}
		}
		if err := h.Context().Err(); err != nil {
			return fmt.Errorf("%w (%v): stopping before write %d", errLost, h.State(), seq)
		}
		if o.beforeWrite != nil {
			o.beforeWrite(seq)
		}
		if err := o.write(ctx, h.Token(), seq); err != nil {
			return err
		}
		fmt.Fprintf(o.Out, "%s: wrote %s seq %d with token %d\n", o.Name, o.Shard, seq, h.Token())
	}
	return nil
}

// write records one write in one guarded transaction. A commit whose
// answer was lost is retried once with the same operation id; a duplicate
// then means the first attempt had committed.
func (o *Owner) write(ctx context.Context, token uint64, seq int) error {
	f := pgguard.Fence{Key: o.Shard, Token: token, OperationID: fmt.Sprintf("%s/%d/%d", o.Name, token, seq)}
	work := func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO shard_state (shard, owner, token, seq) VALUES ($1, $2, $3, $4)
ON CONFLICT (shard) DO UPDATE SET owner = EXCLUDED.owner, token = EXCLUDED.token, seq = EXCLUDED.seq, updated_at = now()`,
			o.Shard, o.Name, int64(token), seq); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO shard_log (shard, owner, token, seq) VALUES ($1, $2, $3, $4)`, o.Shard, o.Name, int64(token), seq)
		return err
	}
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		wctx, cancel := context.WithTimeout(ctx, writeTimeout)
		err = o.Guard.Do(wctx, f, work)
		cancel()
		if !errors.Is(err, pgguard.ErrUnknownOutcome) {
			break
		}
	}
	if errors.Is(err, pgguard.ErrDuplicate) {
		return nil
	}
	return err
}
