package pgguard_test

import (
	"context"
	"testing"

	"github.com/tenure-io/tenure/guard/pgguard"
	"github.com/tenure-io/tenure/internal/pgtest"
)

// TestFenceSurvivesRestart runs the readiness criterion on a private
// PostgreSQL instance, restarts it (a clean shutdown, then a crash) and
// checks that the fence row, the value and the operation record are all
// still there and still enforced.
func TestFenceSurvivesRestart(t *testing.T) {
	t.Parallel()
	in := pgtest.StartPrivate(t)
	cfg := in.Config(t)

	conn := pgtest.Connect(t, cfg)
	g := newGuard(t, conn)
	createDomain(t, conn)
	checkReadiness(t, conn, g)
	conn.Close(context.Background())

	// reopen restarts the server in the given mode and checks the state
	// written under the given token survived.
	reopen := func(mode string, token uint64, value, op string) *pgguard.Guard {
		t.Helper()
		in.Stop(t, mode)
		in.Start(t)
		conn := pgtest.Connect(t, cfg)
		g, err := pgguard.New(conn)
		if err != nil {
			t.Fatal(err)
		}
		ctx := testCtx(t)
		if tok, found, err := g.Current(ctx, "account-7"); err != nil || !found || tok != token {
			t.Fatalf("after a %s restart the fence is %d (found %v, %v), want %d", mode, tok, found, err, token)
		}
		if v, tok := balance(t, conn, "account-7"); v != value || tok != int64(token) {
			t.Fatalf("after a %s restart the row is (%q, %d), want (%q, %d)", mode, v, tok, value, token)
		}
		// Still enforced: a lower token is stale, the operation a duplicate.
		ran, err := setBalance(ctx, g, "account-7", token-1, "late", "late")
		wantStale(t, err, token-1, token)
		if ran {
			t.Fatal("the work ran for a stale token")
		}
		ran, err = setBalance(ctx, g, "account-7", token, op, "retried")
		wantDuplicate(t, err, token)
		if ran {
			t.Fatal("the work ran for a retried operation")
		}
		if n := queryInt(t, conn, `SELECT count(*) FROM effects WHERE op = $1`, op); n != 1 {
			t.Fatalf("%s has %d effects, want 1", op, n)
		}
		return g
	}

	g = reopen("fast", 42, "written under 42", "op-42")
	if _, err := setBalance(testCtx(t), g, "account-7", 43, "op-43", "written under 43"); err != nil {
		t.Fatal(err)
	}
	// A crash: no shutdown checkpoint, so the committed transaction comes
	// back from the WAL.
	reopen("immediate", 43, "written under 43", "op-43")
}
