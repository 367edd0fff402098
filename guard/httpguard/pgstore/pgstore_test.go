package pgstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tenure-io/tenure/guard/httpguard"
	"github.com/tenure-io/tenure/guard/httpguard/pgstore"
	"github.com/tenure-io/tenure/internal/pgtest"
)

// pool is a fixed set of connections handed out one caller at a time; it
// satisfies pgstore.DB and is safe for concurrent use (pgxpool is not a
// dependency of this module).
type pool struct {
	conns chan *pgx.Conn
}

// connect opens n connections to the shared server (pgtest.DSN), closed
// when the test ends; an unreachable server fails the test (and -short
// skips it).
func connect(t *testing.T, n int) *pool {
	t.Helper()
	cfg := pgtest.ParseConfig(t, pgtest.DSN())
	p := &pool{conns: make(chan *pgx.Conn, n)}
	for range n {
		p.conns <- pgtest.Connect(t, cfg)
	}
	return p
}

func (p *pool) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c := <-p.conns
	defer func() { p.conns <- c }()
	return c.Exec(ctx, sql, args...)
}

func (p *pool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c := <-p.conns
	return &row{row: c.QueryRow(ctx, sql, args...), done: func() { p.conns <- c }}
}

type row struct {
	row  pgx.Row
	done func()
}

func (r *row) Scan(dest ...any) error {
	defer r.done()
	return r.row.Scan(dest...)
}

// tx runs fn in a transaction on one connection; fn's error rolls back.
func (p *pool) tx(ctx context.Context, fn func(pgx.Tx) error) error {
	c := <-p.conns
	defer func() { p.conns <- c }()
	return pgx.BeginFunc(ctx, c, fn)
}

// collect runs a query and returns its single column.
func collect[T any](t *testing.T, p *pool, sql string) []T {
	t.Helper()
	c := <-p.conns
	defer func() { p.conns <- c }()
	rows, err := c.Query(context.Background(), sql)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[T])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var tableSeq atomic.Int64

// uniqueName returns a table name no other test (or concurrent run) uses.
func uniqueName(prefix string) string {
	return fmt.Sprintf("%s_%d_%d_%d", prefix, os.Getpid(), time.Now().UnixNano(), tableSeq.Add(1))
}

// newStore creates a store on a fresh table, dropped when the test ends.
func newStore(t *testing.T, p *pool) *pgstore.Store {
	t.Helper()
	s, err := pgstore.New(p, uniqueName("httpguard_fence"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateTable(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = p.Exec(context.Background(), "DROP TABLE IF EXISTS "+s.Table()) })
	return s
}

// newEffects creates the handler's own table of effects.
func newEffects(t *testing.T, p *pool) string {
	t.Helper()
	name := pgx.Identifier{uniqueName("httpguard_effects")}.Sanitize()
	if _, err := p.Exec(context.Background(), `CREATE TABLE `+name+` (
    id           bigserial PRIMARY KEY,
    resource_key text      NOT NULL,
    token        bigint    NOT NULL,
    operation_id text      UNIQUE,
    value        text      NOT NULL
)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = p.Exec(context.Background(), "DROP TABLE IF EXISTS "+name) })
	return name
}

func TestAdvance(t *testing.T) {
	p := connect(t, 2)
	s := newStore(t, p)
	ctx := context.Background()
	steps := []struct {
		key      string
		token    uint64
		accepted bool
		current  uint64
	}{
		{"a", 41, true, 41}, // first write for a new key
		{"a", 41, true, 41}, // same holder again
		{"a", 42, true, 42}, // newer holder
		{"a", 41, false, 42},
		{"b", 7, true, 7}, // keys are independent
		{"a", 43, true, 43},
		{"b", 6, false, 7},
	}
	for i, st := range steps {
		ok, cur, err := s.Advance(ctx, st.key, st.token)
		if err != nil || ok != st.accepted || cur != st.current {
			t.Fatalf("step %d: Advance(%s, %d) = %v, %d, %v; want %v, %d", i, st.key, st.token, ok, cur, err, st.accepted, st.current)
		}
	}
	if cur, err := s.Current(ctx, "a"); err != nil || cur != 43 {
		t.Fatalf("Current(a) = %d, %v", cur, err)
	}
	if cur, err := s.Current(ctx, "never"); err != nil || cur != 0 {
		t.Fatalf("Current(never) = %d, %v", cur, err)
	}
	for _, bad := range []uint64{0, 1 << 63} {
		if _, _, err := s.Advance(ctx, "a", bad); err == nil {
			t.Fatalf("token %d accepted", bad)
		}
	}
}

// TestConcurrentFirstWrite: many first writes for one new key race; none
// fails and the largest token wins.
func TestConcurrentFirstWrite(t *testing.T) {
	const n = 16
	p := connect(t, n)
	s := newStore(t, p)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 1; i <= n; i++ {
		wg.Go(func() {
			if _, _, err := s.Advance(context.Background(), "fresh", uint64(i)); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if cur, err := s.Current(context.Background(), "fresh"); err != nil || cur != n {
		t.Fatalf("mark %d, %v; want %d", cur, err, n)
	}
}

// TestAdvanceTxOrdersEffects: workers take ever larger tokens and race to
// apply effects through AdvanceTx in one transaction with the effect. In
// the order the effects were applied, tokens never go down: no effect of
// an older token follows one of a newer token.
func TestAdvanceTxOrdersEffects(t *testing.T) {
	const workers, rounds = 8, 25
	p := connect(t, workers+1)
	s := newStore(t, p)
	eff := newEffects(t, p)
	var next atomic.Uint64
	var stale atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for range rounds {
				token := next.Add(1) // a grant; which worker commits first is up to the scheduler
				err := p.tx(context.Background(), func(tx pgx.Tx) error {
					ok, _, err := s.AdvanceTx(context.Background(), tx, "shard", token)
					if err != nil {
						return err
					}
					if !ok {
						stale.Add(1)
						return errStale
					}
					_, err = tx.Exec(context.Background(), `INSERT INTO `+eff+` (resource_key, token, value) VALUES ('shard', $1, $2)`, int64(token), fmt.Sprint("worker-", w))
					return err
				})
				if err != nil && !errors.Is(err, errStale) {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	tokens := collect[int64](t, p, `SELECT token FROM `+eff+` ORDER BY id`)
	for i := 1; i < len(tokens); i++ {
		if tokens[i] < tokens[i-1] {
			t.Fatalf("effect %d has token %d after token %d: a stale owner's effect landed", i, tokens[i], tokens[i-1])
		}
	}
	if int64(len(tokens))+stale.Load() != workers*rounds {
		t.Fatalf("%d effects + %d stale != %d attempts", len(tokens), stale.Load(), workers*rounds)
	}
	t.Logf("%d effects applied, %d stale attempts rejected", len(tokens), stale.Load())
}

var errStale = errors.New("stale")

type reply struct {
	status int
	body   map[string]any
}

func send(t *testing.T, url string, f httpguard.Fence, value string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(value))
	if err != nil {
		t.Fatal(err)
	}
	f.SetHeaders(req.Header)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := reply{status: resp.StatusCode}
	if err := json.NewDecoder(resp.Body).Decode(&r.body); err != nil {
		t.Fatalf("status %d: body: %v", resp.StatusCode, err)
	}
	return r
}

// TestHandlerTransaction: the handler advances the mark and applies its
// effect in one PostgreSQL transaction, recording the operation id so a
// retry has no second effect. This is seed 002's readiness criterion over
// HTTP: after 42 is accepted, 41 is answered stale and changes nothing, and
// a retried operation id creates no second effect.
func TestHandlerTransaction(t *testing.T) {
	p := connect(t, 4)
	s := newStore(t, p)
	eff := newEffects(t, p)
	g, err := httpguard.New(httpguard.Config{HandlerChecks: true})
	if err != nil {
		t.Fatal(err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, _ := httpguard.FromContext(r.Context())
		value, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var (
			accepted  = true
			current   uint64
			duplicate bool
		)
		err = p.tx(r.Context(), func(tx pgx.Tx) error {
			ok, cur, err := s.AdvanceTx(r.Context(), tx, f.Key, f.Token)
			if err != nil {
				return err
			}
			if !ok {
				accepted, current = false, cur
				return errStale // roll back: no effect
			}
			tag, err := tx.Exec(r.Context(), `INSERT INTO `+eff+` (resource_key, token, operation_id, value) VALUES ($1, $2, $3, $4)
ON CONFLICT (operation_id) DO NOTHING`, f.Key, int64(f.Token), f.OperationID, string(value))
			duplicate = err == nil && tag.RowsAffected() == 0
			return err
		})
		switch {
		case !accepted:
			g.Reject(w, r, f, current)
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
		case duplicate:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintln(w, `{"result":"duplicate"}`)
		default:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintln(w, `{"result":"applied"}`)
		}
	})
	hs := httptest.NewServer(g.Wrap(h))
	defer hs.Close()

	steps := []struct {
		name   string
		fence  httpguard.Fence
		value  string
		status int
		result string
	}{
		{"A writes with 41", httpguard.Fence{Key: "resource-7", Token: 41, OperationID: "A-1"}, "v1", 200, "applied"},
		{"B takes over with 42", httpguard.Fence{Key: "resource-7", Token: 42, OperationID: "B-1"}, "v2", 200, "applied"},
		{"B's retry of the same operation", httpguard.Fence{Key: "resource-7", Token: 42, OperationID: "B-1"}, "v2-other", 200, "duplicate"},
		{"late A with 41", httpguard.Fence{Key: "resource-7", Token: 41, OperationID: "A-2"}, "v1-late", 409, ""},
	}
	for _, st := range steps {
		r := send(t, hs.URL, st.fence, st.value)
		if r.status != st.status {
			t.Fatalf("%s: status %d, want %d (%v)", st.name, r.status, st.status, r.body)
		}
		if st.result != "" && r.body["result"] != st.result {
			t.Fatalf("%s: %v, want result %s", st.name, r.body, st.result)
		}
		if st.status == 409 && (r.body["error"] != "stale fence token" || r.body["token"] != float64(41) || r.body["accepted_token"] != float64(42)) {
			t.Fatalf("%s: body %v", st.name, r.body)
		}
	}
	got := collect[string](t, p, `SELECT value || '@' || token FROM `+eff+` ORDER BY id`)
	if strings.Join(got, ",") != "v1@41,v2@42" {
		t.Fatalf("effects %v, want exactly v1@41 and v2@42", got)
	}
	if cur, err := s.Current(context.Background(), "resource-7"); err != nil || cur != 42 {
		t.Fatalf("mark %d, %v", cur, err)
	}
	if st := g.Stats(); st.Stale != 1 || st.Admitted != 4 {
		t.Fatalf("stats %+v", st)
	}
}

// TestMiddlewareStore: pgstore as the middleware's Store.
func TestMiddlewareStore(t *testing.T) {
	p := connect(t, 4)
	s := newStore(t, p)
	g, err := httpguard.New(httpguard.Config{Store: s})
	if err != nil {
		t.Fatal(err)
	}
	var applied atomic.Int64
	hs := httptest.NewServer(g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		applied.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintln(w, `{"result":"applied"}`)
	})))
	defer hs.Close()
	for i, st := range []struct {
		token  uint64
		status int
	}{{5, 200}, {9, 200}, {9, 200}, {5, 409}, {10, 200}} {
		r := send(t, hs.URL, httpguard.Fence{Key: "k", Token: st.token}, "")
		if r.status != st.status {
			t.Fatalf("step %d: token %d: status %d, want %d", i, st.token, r.status, st.status)
		}
		if r.status == 409 && r.body["accepted_token"] != float64(9) {
			t.Fatalf("stale body %v", r.body)
		}
	}
	if applied.Load() != 4 || g.Stats().Stale != 1 {
		t.Fatalf("applied %d, stats %+v", applied.Load(), g.Stats())
	}
}

func TestNewValidatesTable(t *testing.T) {
	var db pgstore.DB = &pool{}
	for _, tc := range []struct {
		table string
		ok    bool
	}{
		{"", true}, {"fence", true}, {"app.fence", true}, {"a.b.c", false},
		{"fence; DROP TABLE x", false}, {`"quoted"`, false}, {"1abc", false}, {strings.Repeat("x", 64), false},
	} {
		s, err := pgstore.New(db, tc.table)
		if (err == nil) != tc.ok {
			t.Fatalf("New(%q): %v, want ok=%v", tc.table, err, tc.ok)
		}
		if tc.table == "" && s.Table() != strconv.Quote(pgstore.DefaultTable) {
			t.Fatalf("default table %s", s.Table())
		}
	}
}
