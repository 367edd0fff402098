package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/guard/pgguard"
	"github.com/tenure-io/tenure/internal/pgtest"
	"github.com/tenure-io/tenure/internal/testutil"
)

// tWriter routes an owner's output to the test log.
type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// owner connects one owner to PostgreSQL and takes the shard's lock through
// the given Tenure endpoint.
func owner(ctx context.Context, t *testing.T, dsn, endpoint, name string, ttl time.Duration) (*pgguard.Guard, *client.Hold) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if err := setup(ctx, conn); err != nil {
		t.Fatal(err)
	}
	g, err := pgguard.New(conn)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.Dial(ctx, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := c.NewSession(ctx, client.WithTTL(ttl), client.WithOwner(name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s.Close(cctx)
	})
	m, err := s.Mutex("shard-7")
	if err != nil {
		t.Fatal(err)
	}
	h, err := m.Lock(ctx)
	if err != nil {
		t.Fatalf("%s: lock: %v", name, err)
	}
	t.Logf("%s holds shard-7 with token %d", name, h.Token())
	return g, h
}

// TestLateOwnerIsFenced: owner A writes, then stalls right after checking
// its hold, with its keepalives held back, past its TTL. B gets the shard
// with a larger token and writes. A's late transaction is rejected as
// stale, and the table keeps B's state.
func TestLateOwnerIsFenced(t *testing.T) {
	t.Parallel()
	dsn := pgtest.SchemaDSN(t)
	srv := testutil.Start(t, "", nil)
	proxy := testutil.StartProxy(t, srv.Addr()) // A's way to Tenure, so A alone can be frozen
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	gA, hA := owner(ctx, t, dsn, proxy.Addr(), "A", time.Second)
	stalled, resume := make(chan struct{}), make(chan struct{})
	a := &Owner{Guard: gA, Shard: "shard-7", Name: "A", Interval: 10 * time.Millisecond, Writes: 2, Out: tWriter{t},
		beforeWrite: func(seq int) {
			if seq == 2 {
				proxy.Pause(true, true) // no keepalive reaches the server any more
				close(stalled)
				<-resume
			}
		}}
	aDone := make(chan error, 1)
	go func() { aDone <- a.Run(ctx, hA) }()
	select {
	case <-stalled:
	case err := <-aDone:
		t.Fatalf("A stopped before its second write: %v", err)
	}

	// B queues for the shard; the server grants it once A's session has
	// expired.
	gB, hB := owner(ctx, t, dsn, srv.Addr(), "B", 5*time.Second)
	if hB.Token() <= hA.Token() {
		t.Fatalf("B's token %d is not above A's %d", hB.Token(), hA.Token())
	}
	b := &Owner{Guard: gB, Shard: "shard-7", Name: "B", Interval: 10 * time.Millisecond, Writes: 1, Out: tWriter{t}}
	if err := b.Run(ctx, hB); err != nil {
		t.Fatalf("B: %v", err)
	}

	// A wakes up and finishes the write it had started.
	proxy.Resume()
	close(resume)
	err := <-aDone
	if !errors.Is(err, pgguard.ErrStale) || !errors.Is(err, client.ErrStale) {
		t.Fatalf("A's late write: %v, want ErrStale", err)
	}
	if code := exitCode(ctx, err); code != exitStale {
		t.Fatalf("A would exit %d, want %d", code, exitStale)
	}
	if s := gA.Stats(); s.Stale != 1 || s.Applied != 1 {
		t.Fatalf("A's guard stats %+v, want 1 applied and 1 stale", s)
	}

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var stateOwner string
	var stateToken int64
	if err := conn.QueryRow(ctx, `SELECT owner, token FROM shard_state WHERE shard = 'shard-7'`).Scan(&stateOwner, &stateToken); err != nil {
		t.Fatal(err)
	}
	if stateOwner != "B" || stateToken != int64(hB.Token()) {
		t.Fatalf("shard_state = (%s, %d), want B's write with token %d", stateOwner, stateToken, hB.Token())
	}
	rows, err := conn.Query(ctx, `SELECT owner || ' ' || token || ' ' || seq FROM shard_log ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	log, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want := []string{fmt.Sprintf("A %d 1", hA.Token()), fmt.Sprintf("B %d 1", hB.Token())}
	if strings.Join(log, ", ") != strings.Join(want, ", ") {
		t.Fatalf("shard_log = %q, want %q (A's first write, then B's; no late write from A)", log, want)
	}
}

// TestCommand runs the program the way its README does, against an
// in-process server.
func TestCommand(t *testing.T) {
	t.Parallel()
	dsn := pgtest.SchemaDSN(t)
	srv := testutil.Start(t, "", nil)
	env := map[string]string{"TENURE_PG_DSN": dsn, "TENURE_ENDPOINT": srv.Addr()}
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code := realMain(ctx, []string{"-shard", "shard-9", "-owner", "cli", "-writes", "3", "-interval", "10ms"},
		func(k string) string { return env[k] }, &out, &errOut)
	if code != exitOK {
		t.Fatalf("exit %d\n%s%s", code, out.String(), errOut.String())
	}
	if n := strings.Count(out.String(), "cli: wrote shard-9"); n != 3 {
		t.Fatalf("%d writes reported, want 3:\n%s", n, out.String())
	}
}

func TestExitCode(t *testing.T) {
	t.Parallel()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	cases := []struct {
		name string
		ctx  context.Context
		err  error
		want int
	}{
		{"done", context.Background(), nil, exitOK},
		{"stale", context.Background(), &pgguard.StaleError{Key: "k", Token: 1, Accepted: 2}, exitStale},
		{"lost", context.Background(), fmt.Errorf("%w (lost)", errLost), exitNotHeld},
		{"stopped by a signal", cancelled, context.Canceled, exitOK},
		{"other", context.Background(), errors.New("boom"), exitError},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := exitCode(c.ctx, c.err); got != c.want {
				t.Fatalf("exitCode(%v) = %d, want %d", c.err, got, c.want)
			}
		})
	}
}
