package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/pgtest"
	"github.com/tenure-io/tenure/internal/testutil"
)

// job runs the program as `tenure lock nightly-billing -- send-reminders`
// would: with the hold's token in its environment.
func job(t *testing.T, dsn string, token uint64) (code int, stdout string) {
	t.Helper()
	env := map[string]string{
		"TENURE_PG_DSN":      dsn,
		"TENURE_LOCK":        "nightly-billing",
		"TENURE_FENCE_TOKEN": fmt.Sprint(token),
	}
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code = realMain(ctx, []string{"-date", "2031-01-31"}, func(k string) string { return env[k] }, &out, &errOut)
	t.Logf("token %d: exit %d\n%s%s", token, code, out.String(), errOut.String())
	return code, out.String()
}

// reminders counts the reminders per account.
func reminders(t *testing.T, dsn string) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT account, count(*) FROM billing_reminders GROUP BY account`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for rows.Next() {
		var a string
		var n int
		if err := rows.Scan(&a, &n); err != nil {
			t.Fatal(err)
		}
		got[a] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

func wantOnce(t *testing.T, got map[string]int, accounts ...string) {
	t.Helper()
	if len(got) != len(accounts) {
		t.Fatalf("reminders %v, want one each for %v", got, accounts)
	}
	for _, a := range accounts {
		if got[a] != 1 {
			t.Fatalf("reminders %v, want exactly one for %s", got, a)
		}
	}
}

// TestNoReminderTwice runs the job under real Tenure locks: twice with the
// same token (a retry), with a newer token (the next run), and late with
// the old token (a run that lost its lock). Every reminder exists once, and
// the late run is stale and sends nothing.
func TestNoReminderTwice(t *testing.T) {
	t.Parallel()
	dsn := pgtest.SchemaDSN(t)
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() }) // after the sessions' cleanups
	lock := func() *client.Hold {
		s, err := c.NewSession(ctx, client.WithTTL(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			s.Close(cctx)
		})
		m, err := s.Mutex("nightly-billing")
		if err != nil {
			t.Fatal(err)
		}
		h, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}

	first := lock()
	old := first.Token()
	if code, out := job(t, dsn, old); code != exitOK || !strings.Contains(out, "2 sent, 0 already sent") {
		t.Fatalf("first run: exit %d, %q", code, out)
	}
	wantOnce(t, reminders(t, dsn), "acme", "initech")

	// The same run again (a crash and a retry under the same hold).
	if code, out := job(t, dsn, old); code != exitOK || !strings.Contains(out, "0 sent, 2 already sent") {
		t.Fatalf("rerun: exit %d, %q", code, out)
	}
	wantOnce(t, reminders(t, dsn), "acme", "initech")
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// The next holder, with a new customer in arrears meanwhile.
	next := lock()
	if next.Token() <= old {
		t.Fatalf("new token %d is not above %d", next.Token(), old)
	}
	addAccount(t, dsn, "umbrella", 12.00)
	if code, out := job(t, dsn, next.Token()); code != exitOK || !strings.Contains(out, "1 sent, 2 already sent") {
		t.Fatalf("run with a newer token: exit %d, %q", code, out)
	}
	wantOnce(t, reminders(t, dsn), "acme", "initech", "umbrella")

	// The old run wakes up late: stale, and nothing is sent, not even to
	// the account it has not seen yet.
	addAccount(t, dsn, "hooli", 99.00)
	if code, out := job(t, dsn, old); code != exitStale || !strings.Contains(out, "0 sent, 0 already sent") {
		t.Fatalf("late run with the old token: exit %d, %q; want stale (3) and nothing sent", code, out)
	}
	wantOnce(t, reminders(t, dsn), "acme", "initech", "umbrella")
}

func addAccount(t *testing.T, dsn, account string, due float64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `INSERT INTO billing_accounts VALUES ($1, $2, $3)`, account, account+"@example.com", due); err != nil {
		t.Fatal(err)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"not under tenure lock", nil, nil, "TENURE_FENCE_TOKEN is not set"},
		{"bad token", nil, map[string]string{"TENURE_FENCE_TOKEN": "abc"}, "not a positive integer"},
		{"zero token", nil, map[string]string{"TENURE_FENCE_TOKEN": "0"}, "not a positive integer"},
		{"bad date", []string{"-date", "31/01/2031"}, map[string]string{"TENURE_FENCE_TOKEN": "7"}, "want YYYY-MM-DD"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := realMain(context.Background(), c.args, func(k string) string { return c.env[k] }, &out, &errOut)
			if code != exitError || !strings.Contains(errOut.String(), c.want) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", code, errOut.String(), exitError, c.want)
			}
		})
	}
}
