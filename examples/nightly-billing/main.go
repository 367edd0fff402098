// Command send-reminders is a nightly billing job that must never email a
// customer twice: not when it is retried, not when two runs overlap, and
// not when a run that lost its lock (paused past its TTL) wakes up late.
//
// Run it under the lock, which hands it a fencing token:
//
//	go build -o bin/send-reminders ./examples/nightly-billing
//	bin/tenure lock nightly-billing -- bin/send-reminders
//
// It reads TENURE_FENCE_TOKEN (set by `tenure lock`), TENURE_LOCK (the fence
// key; default nightly-billing) and TENURE_PG_DSN (default
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable). Every
// reminder is a row in billing_reminders (an outbox a mailer would deliver
// from), written through guard/pgguard under the operation id
// reminder/<date>/<account>: a second run finds the operation applied and
// sends nothing, and a run with an older token than one already accepted
// is rejected as stale before it sends anything.
//
// Exit status: 0 done, 3 stale (a newer run owns the job), 1 error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-io/tenure/guard/pgguard"
)

// DefaultDSN is the PostgreSQL server used when TENURE_PG_DSN is unset.
const DefaultDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Exit statuses; 3 is also what `tenure fence put` returns for stale.
const (
	exitOK    = 0
	exitError = 1
	exitStale = 3
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := realMain(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// realMain is main without the process: arguments, environment and output
// are passed in, the exit status is returned.
func realMain(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cfg, err := parseConfig(args, getenv, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "send-reminders: %v\n", err)
		return exitError
	}
	rep, err := run(ctx, cfg, stdout)
	fmt.Fprintf(stdout, "send-reminders: %d sent, %d already sent\n", rep.Sent, rep.AlreadySent)
	switch {
	case errors.Is(err, pgguard.ErrStale):
		fmt.Fprintf(stderr, "send-reminders: stopping, a newer run owns the job: %v\n", err)
		return exitStale
	case err != nil:
		fmt.Fprintf(stderr, "send-reminders: %v\n", err)
		return exitError
	}
	return exitOK
}

// config is what one run needs.
type config struct {
	DSN   string
	Key   string // fence key: the lock's name
	Token uint64 // fencing token of the run's hold
	Date  string // billing date, YYYY-MM-DD: part of every operation id
}

func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("send-reminders", flag.ContinueOnError)
	fs.SetOutput(stderr)
	date := fs.String("date", time.Now().UTC().Format(time.DateOnly), "billing date (YYYY-MM-DD); one reminder per account and date")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if _, err := time.Parse(time.DateOnly, *date); err != nil {
		return config{}, fmt.Errorf("-date %q: want YYYY-MM-DD", *date)
	}
	cfg := config{DSN: getenv("TENURE_PG_DSN"), Key: getenv("TENURE_LOCK"), Date: *date}
	if cfg.DSN == "" {
		cfg.DSN = DefaultDSN
	}
	if cfg.Key == "" {
		cfg.Key = "nightly-billing"
	}
	raw := getenv("TENURE_FENCE_TOKEN")
	if raw == "" {
		return config{}, errors.New("TENURE_FENCE_TOKEN is not set: run me under `tenure lock nightly-billing -- ...`")
	}
	tok, err := strconv.ParseUint(raw, 10, 64)
	if err != nil || tok == 0 {
		return config{}, fmt.Errorf("TENURE_FENCE_TOKEN=%q is not a positive integer", raw)
	}
	cfg.Token = tok
	return cfg, nil
}

// schema holds the example's tables and a few demo accounts. The reminders
// table has deliberately no unique constraint: the guard's operation ids
// alone keep every reminder single.
const schema = `
CREATE TABLE IF NOT EXISTS billing_accounts (
    account    text PRIMARY KEY,
    email      text NOT NULL,
    amount_due numeric(12,2) NOT NULL
);
CREATE TABLE IF NOT EXISTS billing_runs (
    run_date   date NOT NULL,
    token      bigint NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS billing_reminders (
    id           bigserial PRIMARY KEY,
    account      text NOT NULL,
    email        text NOT NULL,
    run_date     date NOT NULL,
    token        bigint NOT NULL,
    operation_id text NOT NULL,
    body         text NOT NULL,
    sent_at      timestamptz NOT NULL DEFAULT now()
);
INSERT INTO billing_accounts (account, email, amount_due) VALUES
    ('acme',    'ap@acme.example',      120.00),
    ('globex',  'billing@globex.example', 0.00),
    ('initech', 'finance@initech.example', 75.50)
ON CONFLICT (account) DO NOTHING;`

// setup creates the guard's and the example's tables (idempotent; runs
// that start together take turns on an advisory lock).
func setup(ctx context.Context, conn *pgx.Conn) error {
	if err := pgguard.Migrate(ctx, conn); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('examples/nightly-billing schema'))`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, schema)
		return err
	})
}

// report counts what a run did.
type report struct {
	Sent        int // reminders this run recorded
	AlreadySent int // reminders an earlier run had recorded
}

type due struct {
	account, email, amount string
}

// run sends the day's reminders: one guarded transaction per reminder, so
// that a crash half-way loses nothing and a rerun continues where it
// stopped. It returns an error matching pgguard.ErrStale as soon as a
// newer run's token has been accepted.
func run(ctx context.Context, cfg config, out io.Writer) (report, error) {
	var rep report
	conn, err := pgx.Connect(ctx, cfg.DSN)
	if err != nil {
		return rep, fmt.Errorf("connect to PostgreSQL (TENURE_PG_DSN): %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := setup(ctx, conn); err != nil {
		return rep, err
	}
	g, err := pgguard.New(conn)
	if err != nil {
		return rep, err
	}

	// Claim the night first: this advances the fence to our token, so a
	// run holding an older token is stale from here on, even for
	// reminders that this run finds already sent.
	err = g.Do(ctx, pgguard.Fence{Key: cfg.Key, Token: cfg.Token}, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO billing_runs (run_date, token) VALUES ($1, $2)`, cfg.Date, int64(cfg.Token))
		return err
	})
	if err != nil {
		return rep, err
	}

	rows, err := conn.Query(ctx, `SELECT account, email, amount_due::text FROM billing_accounts WHERE amount_due > 0 ORDER BY account`)
	if err != nil {
		return rep, err
	}
	accounts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (due, error) {
		var d due
		err := r.Scan(&d.account, &d.email, &d.amount)
		return d, err
	})
	if err != nil {
		return rep, err
	}

	for _, a := range accounts {
		op := "reminder/" + cfg.Date + "/" + a.account
		body := fmt.Sprintf("Dear %s, %s is due on your account.", a.account, a.amount)
		err := g.Do(ctx, pgguard.Fence{Key: cfg.Key, Token: cfg.Token, OperationID: op}, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO billing_reminders (account, email, run_date, token, operation_id, body)
VALUES ($1, $2, $3, $4, $5, $6)`, a.account, a.email, cfg.Date, int64(cfg.Token), op, body)
			return err
		})
		switch {
		case err == nil:
			rep.Sent++
			fmt.Fprintf(out, "sent reminder to %s <%s> (token %d)\n", a.account, a.email, cfg.Token)
		case errors.Is(err, pgguard.ErrDuplicate):
			rep.AlreadySent++
			var dup *pgguard.DuplicateError
			errors.As(err, &dup)
			fmt.Fprintf(out, "already sent to %s (by the run with token %d)\n", a.account, dup.Token)
		default:
			return rep, err
		}
	}
	return rep, nil
}
