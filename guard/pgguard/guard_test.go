package pgguard_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/guard/pgguard"
	"github.com/tenure-io/tenure/internal/pgtest"
)

// checkReadiness is the readiness criterion: after token 42 committed, a
// transaction with token 41 gets ErrStale and changes nothing; the row keeps
// the value written under 42; the same operation id retried creates no
// second effect.
func checkReadiness(t *testing.T, db execer, g *pgguard.Guard) {
	t.Helper()
	ctx := testCtx(t)
	const key = "account-7"

	if ran, err := setBalance(ctx, g, key, 42, "op-42", "written under 42"); err != nil || !ran {
		t.Fatalf("write under 42: ran=%v err=%v", ran, err)
	}

	ran, err := setBalance(ctx, g, key, 41, "op-41", "written under 41")
	wantStale(t, err, 41, 42)
	if ran {
		t.Fatal("the work ran for a stale token")
	}
	if v, tok := balance(t, db, key); v != "written under 42" || tok != 42 {
		t.Fatalf("after the stale write the row is (%q, %d), want the value written under 42", v, tok)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM tenure_fence_ops WHERE operation_id = 'op-41'`); n != 0 {
		t.Fatalf("the stale operation was recorded (%d rows)", n)
	}

	// The retry of op-42, with its own token and with a newer one: no
	// second effect, and the fence does not move.
	for _, tok := range []uint64{42, 43} {
		ran, err = setBalance(ctx, g, key, tok, "op-42", "retried")
		wantDuplicate(t, err, 42)
		if ran {
			t.Fatalf("the work ran again for a retried operation id (token %d)", tok)
		}
	}
	if n := queryInt(t, db, `SELECT count(*) FROM effects WHERE op = 'op-42'`); n != 1 {
		t.Fatalf("op-42 has %d effects, want 1", n)
	}
	if v, tok := balance(t, db, key); v != "written under 42" || tok != 42 {
		t.Fatalf("after the retries the row is (%q, %d), want the value written under 42", v, tok)
	}
	if tok, found, err := g.Current(ctx, key); err != nil || !found || tok != 42 {
		t.Fatalf("Current = %d, %v, %v; want 42, true, nil", tok, found, err)
	}
}

func TestReadinessCriterion(t *testing.T) {
	t.Parallel()
	pool, g := setup(t, 2)
	checkReadiness(t, pool, g)
	if got, want := g.Stats(), (pgguard.Stats{Applied: 1, Stale: 1, Duplicate: 2}); got != want {
		t.Fatalf("Stats = %+v, want %+v", got, want)
	}
}

func TestFirstWriteAndEqualToken(t *testing.T) {
	t.Parallel()
	pool, g := setup(t, 2)
	ctx := testCtx(t)
	if _, found, err := g.Current(ctx, "new"); err != nil || found {
		t.Fatalf("Current on a new key = found %v, %v", found, err)
	}
	// The first write for a key creates its fence row; the same token is
	// accepted again (one holder, many transactions); no operation id
	// means no retry detection.
	for i, value := range []string{"a", "b", "c"} {
		if _, err := setBalance(ctx, g, "new", 5, "", value); err != nil {
			t.Fatalf("write %d with token 5: %v", i, err)
		}
	}
	if v, tok := balance(t, pool, "new"); v != "c" || tok != 5 {
		t.Fatalf("row = (%q, %d), want (c, 5)", v, tok)
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM tenure_fence_ops`); n != 0 {
		t.Fatalf("%d operations recorded without operation ids", n)
	}
	// Keys are independent.
	if _, err := setBalance(ctx, g, "other", 1, "o-1", "x"); err != nil {
		t.Fatalf("a low token on another key: %v", err)
	}
}

func TestWorkErrorRollsEverythingBack(t *testing.T) {
	t.Parallel()
	pool, g := setup(t, 2)
	ctx := testCtx(t)
	boom := errors.New("work failed")
	err := g.Do(ctx, pgguard.Fence{Key: "k", Token: 9, OperationID: "op"}, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO balances VALUES ('k', 'half-done', 9)`); err != nil {
			return err
		}
		return boom
	})
	if err != boom {
		t.Fatalf("Do = %v, want the work's error unchanged", err)
	}
	if _, found, _ := g.Current(ctx, "k"); found {
		t.Fatal("the fence row of a rolled-back transaction exists")
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM balances`); n != 0 {
		t.Fatal("the work's write survived its error")
	}
	// The operation was not recorded: a retry applies it.
	if ran, err := setBalance(ctx, g, "k", 9, "op", "done"); err != nil || !ran {
		t.Fatalf("retry after a failed attempt: ran=%v err=%v", ran, err)
	}
}

func TestSwallowedErrorIsReportedAtCommit(t *testing.T) {
	t.Parallel()
	pool, g := setup(t, 2)
	ctx := testCtx(t)
	err := g.Do(ctx, pgguard.Fence{Key: "k", Token: 3, OperationID: "op"}, func(ctx context.Context, tx pgx.Tx) error {
		_, _ = tx.Exec(ctx, `SELECT * FROM no_such_table`) // error ignored: the transaction is aborted
		return nil
	})
	if !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("Do = %v, want the rollback at commit reported", err)
	}
	if _, found, _ := g.Current(ctx, "k"); found {
		t.Fatal("the fence advanced in a transaction that rolled back")
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM tenure_fence_ops`); n != 0 {
		t.Fatal("the operation of a rolled-back transaction was recorded")
	}
	if s := g.Stats(); s.Applied != 0 {
		t.Fatalf("Stats = %+v, want nothing applied", s)
	}
}

func TestInvalidFence(t *testing.T) {
	t.Parallel()
	// Validation happens before the database is touched: no server needed.
	g, err := pgguard.New(failingDB{t})
	if err != nil {
		t.Fatal(err)
	}
	noop := func(context.Context, pgx.Tx) error { return nil }
	cases := []struct {
		name string
		f    pgguard.Fence
		work pgguard.Work
	}{
		{"empty key", pgguard.Fence{Token: 1}, noop},
		{"zero token", pgguard.Fence{Key: "k"}, noop},
		{"token beyond bigint", pgguard.Fence{Key: "k", Token: math.MaxInt64 + 1}, noop},
		{"long key", pgguard.Fence{Key: strings.Repeat("k", pgguard.MaxKeyLen+1), Token: 1}, noop},
		{"key not UTF-8", pgguard.Fence{Key: "\xff", Token: 1}, noop},
		{"NUL in key", pgguard.Fence{Key: "a\x00b", Token: 1}, noop},
		{"long operation id", pgguard.Fence{Key: "k", Token: 1, OperationID: strings.Repeat("o", pgguard.MaxOperationIDLen+1)}, noop},
		{"nil work", pgguard.Fence{Key: "k", Token: 1}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := g.Do(t.Context(), c.f, c.work)
			if !errors.Is(err, pgguard.ErrInvalid) || !errors.Is(err, client.ErrInvalid) {
				t.Fatalf("Do = %v, want ErrInvalid", err)
			}
		})
	}
	if _, err := pgguard.New(nil); !errors.Is(err, pgguard.ErrInvalid) {
		t.Fatalf("New(nil) = %v, want ErrInvalid", err)
	}
	if _, err := pgguard.New(failingDB{t}, pgguard.WithTxOptions(pgx.TxOptions{AccessMode: pgx.ReadOnly})); !errors.Is(err, pgguard.ErrInvalid) {
		t.Fatalf("read-only transactions accepted: %v", err)
	}
}

// failingDB fails the test if the guard reaches the database.
type failingDB struct{ t *testing.T }

func (d failingDB) BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error) {
	d.t.Errorf("the database was reached")
	return nil, errors.New("unexpected BeginTx")
}

// TestLowerTokenWaitsForTheRowLock checks the isolation argument of the
// package documentation: a lower-token transaction that arrives while a
// higher-token one holds the fence row waits for it, then re-evaluates the
// condition against what was committed.
func TestLowerTokenWaitsForTheRowLock(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name          string
		existingKey   bool // the fence row exists before (UPDATE path) or not (INSERT path)
		holderCommits bool
	}{
		{"existing key, holder commits", true, true},
		{"existing key, holder rolls back", true, false},
		{"new key, holder commits", false, true},
		{"new key, holder rolls back", false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cfg := pgtest.Schema(t)
			holderConn, waiterConn, monitor := pgtest.Connect(t, cfg), pgtest.Connect(t, cfg), pgtest.Connect(t, cfg)
			holder := newGuard(t, holderConn)
			createDomain(t, holderConn)
			waiter, err := pgguard.New(waiterConn)
			if err != nil {
				t.Fatal(err)
			}
			ctx := testCtx(t)
			if c.existingKey {
				if _, err := setBalance(ctx, holder, "k", 10, "op-10", "v10"); err != nil {
					t.Fatal(err)
				}
			}

			inside, release := make(chan struct{}), make(chan struct{})
			holderDone := make(chan error, 1)
			go func() {
				holderDone <- holder.Do(ctx, pgguard.Fence{Key: "k", Token: 42, OperationID: "op-42"}, func(ctx context.Context, tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `INSERT INTO effects (key, op, token, value) VALUES ('k', 'op-42', 42, 'v42')`); err != nil {
						return err
					}
					close(inside)
					<-release
					if !c.holderCommits {
						return errors.New("holder gives up")
					}
					return nil
				})
			}()
			select {
			case <-inside:
			case err := <-holderDone:
				t.Fatalf("holder: %v", err)
			}
			waiterDone := make(chan error, 1)
			go func() {
				_, err := setBalance(ctx, waiter, "k", 41, "op-41", "v41")
				waiterDone <- err
			}()
			// The waiter is blocked on a lock, not finished.
			pid := waiterConn.PgConn().PID()
			deadline := time.Now().Add(10 * time.Second)
			for {
				var waitType *string
				if err := monitor.QueryRow(ctx, `SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waitType); err != nil {
					t.Fatal(err)
				}
				if waitType != nil && *waitType == "Lock" {
					break
				}
				select {
				case err := <-waiterDone:
					t.Fatalf("the lower token finished (%v) while the higher one held the fence row", err)
				default:
				}
				if time.Now().After(deadline) {
					t.Fatal("the lower-token transaction never waited for the fence row lock")
				}
				time.Sleep(10 * time.Millisecond)
			}
			close(release)
			if err := <-holderDone; (err == nil) != c.holderCommits {
				t.Fatalf("holder: %v", err)
			}
			err = <-waiterDone
			if c.holderCommits {
				wantStale(t, err, 41, 42)
				if n := queryInt(t, monitor, `SELECT count(*) FROM effects WHERE token = 41`); n != 0 {
					t.Fatal("the stale transaction left an effect")
				}
				return
			}
			if err != nil {
				t.Fatalf("after the holder rolled back, the lower token got %v, want it applied", err)
			}
			if v, tok := balance(t, monitor, "k"); v != "v41" || tok != 41 {
				t.Fatalf("row = (%q, %d), want (v41, 41)", v, tok)
			}
		})
	}
}

// TestConcurrentFirstWrites races many transactions with different tokens
// at a key that has no fence row yet: the accepted ones commit in
// non-decreasing token order and the rest are stale.
func TestConcurrentFirstWrites(t *testing.T) {
	t.Parallel()
	const writers = 8
	pool, g := setup(t, writers)
	ctx := testCtx(t)
	for round := 0; round < 5; round++ {
		key := fmt.Sprintf("key-%d", round)
		start := make(chan struct{})
		errs := make(chan error, writers)
		var wg sync.WaitGroup
		for i := 1; i <= writers; i++ {
			wg.Go(func() {
				<-start
				_, err := setBalance(ctx, g, key, uint64(i), fmt.Sprintf("op-%d", i), fmt.Sprint(i))
				if err != nil && !errors.Is(err, pgguard.ErrStale) {
					errs <- err
				}
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("%s: %v", key, err)
		}
		tokens := effectTokens(t, pool, key)
		if len(tokens) == 0 {
			t.Fatalf("%s: nothing was applied", key)
		}
		for i := 1; i < len(tokens); i++ {
			if tokens[i] < tokens[i-1] {
				t.Fatalf("%s: accepted tokens in commit order %v go down", key, tokens)
			}
		}
		last := tokens[len(tokens)-1]
		if cur, _, _ := g.Current(ctx, key); int64(cur) != last {
			t.Fatalf("%s: fence %d, last accepted effect %d", key, cur, last)
		}
		if v, tok := balance(t, pool, key); tok != last || v != fmt.Sprint(last) {
			t.Fatalf("%s: row (%q, %d), want the last accepted write %d", key, v, tok, last)
		}
	}
	s := g.Stats()
	if s.Applied+s.Stale != 5*writers || s.Applied == 0 {
		t.Fatalf("Stats = %+v: every call must be applied or stale", s)
	}
}

// effectTokens lists a key's effects' tokens in commit order.
func effectTokens(t *testing.T, db execer, key string) []int64 {
	t.Helper()
	var tokens []int64
	inTx(t, db, func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT token FROM effects WHERE key = $1 ORDER BY id`, key)
		if err != nil {
			return err
		}
		tokens, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		return err
	})
	return tokens
}

func TestSameOperationConcurrently(t *testing.T) {
	t.Parallel()
	const writers = 8
	pool, g := setup(t, writers)
	ctx := testCtx(t)
	start := make(chan struct{})
	var (
		mu      sync.Mutex
		applied int
	)
	var wg sync.WaitGroup
	for i := 0; i < writers; i++ {
		wg.Go(func() {
			<-start
			_, err := setBalance(ctx, g, "k", 7, "the-op", "v")
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				applied++
			case errors.Is(err, pgguard.ErrDuplicate):
			default:
				t.Errorf("Do: %v", err)
			}
		})
	}
	close(start)
	wg.Wait()
	if applied != 1 {
		t.Fatalf("the operation was applied %d times, want once", applied)
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM effects`); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	if s := g.Stats(); s.Applied != 1 || s.Duplicate != writers-1 {
		t.Fatalf("Stats = %+v", s)
	}
}

// TestUnknownOutcomeThenRetry loses the answer to COMMIT (the context ends
// while the server is still committing: a deferred trigger sleeps) and
// checks the documented recovery: a retry with the same operation id
// applies the work if and only if the first attempt did not commit.
func TestUnknownOutcomeThenRetry(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// sleep is the deferred trigger's body. On cancellation pgx also
		// sends a cancel request; catching it lets the commit finish
		// after the client has gone.
		sleep     string
		committed bool
	}{
		{"server committed", `BEGIN PERFORM pg_sleep(5); EXCEPTION WHEN query_canceled THEN NULL; END;`, true},
		{"server rolled back", `PERFORM pg_sleep(5);`, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pool, g := setup(t, 2)
			inTx(t, pool, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `
CREATE TABLE slow (id int);
CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN IF NEW.id = 1 THEN `+c.sleep+` END IF; RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON slow
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();`)
				return err
			})
			// Only the first attempt (id 1) is slow to commit.
			work := func(id int) pgguard.Work {
				return func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `INSERT INTO slow VALUES ($1)`, id)
					return err
				}
			}
			fence := pgguard.Fence{Key: "k", Token: 5, OperationID: "op"}
			ctx, cancel := context.WithCancel(testCtx(t))
			err := g.Do(ctx, fence, func(ctx context.Context, tx pgx.Tx) error {
				if err := work(1)(ctx, tx); err != nil {
					return err
				}
				var pid int32
				if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
					return err
				}
				go cancelWhenSleeping(testCtx(t), pool, pid, cancel) // mid-COMMIT
				return nil
			})
			if !errors.Is(err, pgguard.ErrUnknownOutcome) || !errors.Is(err, client.ErrUnknownOutcome) {
				t.Fatalf("Do = %v, want ErrUnknownOutcome", err)
			}
			if s := g.Stats(); s.UnknownOutcome != 1 || s.Applied != 0 {
				t.Fatalf("Stats = %+v", s)
			}
			err = g.Do(testCtx(t), fence, work(2))
			if c.committed {
				wantDuplicate(t, err, 5)
			} else if err != nil {
				t.Fatalf("retry = %v, want the work applied", err)
			}
			if n := queryInt(t, pool, `SELECT count(*) FROM slow`); n != 1 {
				t.Fatalf("%d effects after the retry, want exactly 1", n)
			}
		})
	}
}

func TestForgetOperations(t *testing.T) {
	t.Parallel()
	pool, g := setup(t, 2)
	ctx := testCtx(t)
	if _, err := setBalance(ctx, g, "k", 1, "op", "v"); err != nil {
		t.Fatal(err)
	}
	if n, err := g.ForgetOperations(ctx, time.Now().Add(-time.Hour)); err != nil || n != 0 {
		t.Fatalf("ForgetOperations(an hour ago) = %d, %v; want 0", n, err)
	}
	if _, err := setBalance(ctx, g, "k", 1, "op", "v"); !errors.Is(err, pgguard.ErrDuplicate) {
		t.Fatalf("retry before forgetting = %v, want ErrDuplicate", err)
	}
	if n, err := g.ForgetOperations(ctx, time.Now().Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("ForgetOperations(in an hour) = %d, %v; want 1", n, err)
	}
	if _, err := setBalance(ctx, g, "k", 1, "op", "v"); err != nil {
		t.Fatalf("a forgotten operation id is applied again, got %v", err)
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM effects`); n != 2 {
		t.Fatalf("%d effects, want 2", n)
	}
}

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	t.Parallel()
	cfg := pgtest.Schema(t)
	pool := pgtest.NewPool(t, cfg, 4)
	ctx := testCtx(t)
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Go(func() {
			if err := pgguard.Migrate(ctx, pool); err != nil {
				t.Errorf("concurrent Migrate: %v", err)
			}
		})
	}
	wg.Wait()
	if err := pgguard.Migrate(ctx, pool); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	n := queryInt(t, pool, `SELECT count(*) FROM information_schema.tables
WHERE table_schema = current_schema() AND table_name IN ('tenure_fence', 'tenure_fence_ops')`)
	if n != 2 {
		t.Fatalf("%d guard tables in the schema, want 2", n)
	}
	if !strings.Contains(pgguard.Schema, "CREATE TABLE IF NOT EXISTS tenure_fence (") {
		t.Fatal("the embedded schema lacks the fence table")
	}
}

// cancelWhenSleeping calls cancel once backend pid is inside pg_sleep (the
// slow deferred trigger, that is: in the middle of its COMMIT).
func cancelWhenSleeping(ctx context.Context, db execer, pid int32, cancel context.CancelFunc) {
	defer cancel()
	for ctx.Err() == nil {
		var wait *string
		err := pgx.BeginTxFunc(ctx, db, pgx.TxOptions{}, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, `SELECT wait_event FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&wait)
		})
		if err == nil && wait != nil && *wait == "PgSleep" {
			return
		}
		time.Sleep(5 * time.Millisecond) // polling another session's state: there is no event to wait on
	}
}
