package pgguard_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/guard/pgguard"
	"github.com/tenure-io/tenure/internal/pgtest"
	"github.com/tenure-io/tenure/internal/testutil"
)

// attempt is one guarded write a worker made with one hold's token.
type attempt struct {
	worker int
	shard  string
	token  uint64
	op     string
	paused bool
	err    error
}

// TestShardsUnderContention: 16 workers compete for 4 shards through a
// real Tenure server, with short session TTLs. Some workers freeze while
// holding (their traffic to Tenure is held back and they sleep past the
// TTL, as in a GC pause), so their lock is given to another worker and
// their write arrives late. Every worker writes once per hold through the
// guard with its hold's token, deliberately without looking at the hold's
// state. Afterwards, per shard, the accepted effects carry strictly
// increasing tokens in commit order, and every rejected attempt was stale
// and left no effect.
func TestShardsUnderContention(t *testing.T) {
	t.Parallel()
	const (
		workers  = 16
		shards   = 4
		ttl      = time.Second
		runFor   = 8 * time.Second
		pauseMin = 1500 * time.Millisecond // past the TTL
		pauseMax = 2500 * time.Millisecond
	)
	srv := testutil.Start(t, "", nil)
	pool, g := setup(t, workers)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)

	ctx := testCtx(t)
	end := time.Now().Add(runFor)
	var (
		mu       sync.Mutex
		attempts []attempt
	)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		// Each worker reaches Tenure through its own fault-injecting
		// proxy, so that it can be frozen alone.
		proxy := testutil.StartProxy(t, srv.Addr())
		c, err := client.Dial(ctx, proxy.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		rng := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Go(func() {
			for i := 0; time.Now().Before(end); i++ {
				a, ok := holdAndWrite(ctx, t, c, proxy, g, rng, w, i, end, ttl, pauseMin, pauseMax, shards)
				if ok {
					mu.Lock()
					attempts = append(attempts, a)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()

	var accepted, stale, paused int
	for _, a := range attempts {
		if a.paused {
			paused++
		}
		switch {
		case a.err == nil:
			accepted++
		case errors.Is(a.err, pgguard.ErrStale) && errors.Is(a.err, client.ErrStale):
			stale++
			var se *pgguard.StaleError
			if !errors.As(a.err, &se) || se.Accepted <= a.token {
				t.Errorf("worker %d, %s token %d: stale with accepted token %d", a.worker, a.shard, a.token, se.Accepted)
			}
		default:
			t.Errorf("worker %d, %s token %d: %v", a.worker, a.shard, a.token, a.err)
		}
	}
	t.Logf("%d attempts: %d accepted, %d stale; %d writers paused past their TTL", len(attempts), accepted, stale, paused)
	if stale == 0 {
		t.Fatal("no stale write was attempted: the test proved nothing (make the pauses longer?)")
	}
	if s := g.Stats(); s.Applied != uint64(accepted) || s.Stale != uint64(stale) {
		t.Errorf("Stats = %+v, want %d applied and %d stale", s, accepted, stale)
	}

	// The table: per shard, strictly increasing tokens in commit order
	// (each hold writes once), exactly the accepted attempts, and the fence
	// row at the last accepted token.
	type effect struct {
		key, op string
		token   int64
	}
	var effects []effect
	inTx(t, pool, func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT key, op, token FROM effects ORDER BY id`)
		if err != nil {
			return err
		}
		effects, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (effect, error) {
			var e effect
			err := r.Scan(&e.key, &e.op, &e.token)
			return e, err
		})
		return err
	})
	if len(effects) != accepted {
		t.Fatalf("%d effects in the table, %d accepted attempts", len(effects), accepted)
	}
	rejected := map[string]bool{}
	for _, a := range attempts {
		if a.err != nil {
			rejected[a.op] = true
		}
	}
	last := map[string]int64{}
	for _, e := range effects {
		if rejected[e.op] {
			t.Errorf("%s: the rejected operation %s has an effect", e.key, e.op)
		}
		if e.token <= last[e.key] {
			t.Errorf("%s: token %d (%s) committed after token %d", e.key, e.token, e.op, last[e.key])
		}
		last[e.key] = e.token
	}
	for key, tok := range last {
		if cur, _, err := g.Current(ctx, key); err != nil || int64(cur) != tok {
			t.Errorf("%s: fence %d (%v), last accepted effect %d", key, cur, err, tok)
		}
	}
}

// holdAndWrite takes one shard's lock, maybe freezes past the TTL, and
// writes once through the guard with the hold's token. ok is false when
// no lock was granted before the end of the run.
func holdAndWrite(ctx context.Context, t *testing.T, c *client.Client, proxy *testutil.Proxy, g *pgguard.Guard,
	rng *rand.Rand, w, i int, end time.Time, ttl, pauseMin, pauseMax time.Duration, shards int) (a attempt, ok bool) {
	shard := fmt.Sprintf("shard-%d", rng.IntN(shards))
	sess, err := c.NewSession(ctx, client.WithTTL(ttl), client.WithOwner(fmt.Sprintf("worker-%d", w)))
	if err != nil {
		t.Errorf("worker %d: session: %v", w, err)
		return a, false
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = sess.Close(cctx) // after a pause the session is gone: errors expected
	}()
	m, err := sess.Mutex(shard)
	if err != nil {
		t.Errorf("worker %d: mutex: %v", w, err)
		return a, false
	}
	lctx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	h, err := m.Lock(lctx)
	if err != nil {
		return a, false // the run ended while waiting (or the session was lost)
	}
	a = attempt{worker: w, shard: shard, token: h.Token(), op: fmt.Sprintf("w%d-%d", w, i)}
	if rng.Float64() < 0.3 {
		// Frozen: no keepalive leaves, the server expires the session and
		// grants the shard to the next waiter.
		a.paused = true
		proxy.Pause(true, true)
		time.Sleep(pauseMin + time.Duration(rng.Int64N(int64(pauseMax-pauseMin))))
		proxy.Resume()
	} else {
		time.Sleep(time.Duration(rng.Int64N(int64(20 * time.Millisecond)))) // some work
	}
	a.err = g.Do(ctx, pgguard.Fence{Key: shard, Token: a.token, OperationID: a.op}, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (key, op, token, value, worker) VALUES ($1, $2, $3, 'work', $4)`,
			shard, a.op, int64(a.token), w)
		return err
	})
	uctx, ucancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer ucancel()
	_ = h.Unlock(uctx) // ErrNotHeld after a pause
	return a, true
}

// Compile-time check: the test pool is a pgguard.DB.
var _ pgguard.DB = (*pgtest.Pool)(nil)
