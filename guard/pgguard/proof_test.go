package pgguard_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/fenceproof"
	"github.com/tenure-io/tenure/guard/pgguard"
	"github.com/tenure-io/tenure/internal/pgtest"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestVerifierRejectsForgedProofs: with a verifier, a token that comes
// without a valid proof for the fence's lock (none, made up, another
// lock's, a real proof with a larger token) is ErrForged, not stale: the
// work does not run, the fence row does not move, so the honest holder
// is not locked out; a valid proof is applied as before.
func TestVerifierRejectsForgedProofs(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx := testCtx(t)
	c := testutil.Dial(t, srv.Addr(), client.WithFenceProofs())
	v := testutil.Verifier(t, ctx, c)
	shard := testutil.Lock(t, ctx, c, "shard-7")
	other := testutil.Lock(t, ctx, c, "shard-8") // a later grant: a larger token

	cfg := pgtest.Schema(t)
	pool := pgtest.NewPool(t, cfg, 2)
	newGuard(t, pool) // migrates
	createDomain(t, pool)
	g, err := pgguard.New(pool, pgguard.WithVerifier(v))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgguard.New(pool, pgguard.WithVerifier(nil)); !errors.Is(err, pgguard.ErrInvalid) {
		t.Fatalf("WithVerifier(nil): %v", err)
	}
	for name, f := range map[string]pgguard.Fence{
		"no proof":                          {Key: "shard-7", Token: 999_999_999},
		"a made-up proof":                   {Key: "shard-7", Token: 999_999_999, Proof: "AQAAAAAAAAAA"},
		"another lock's proof (cross-lock)": {Key: "shard-7", Token: other.Token(), Proof: other.Proof()},
		"a real proof, a larger token":      {Key: "shard-7", Token: other.Token(), Proof: shard.Proof()},
		"the right proof, another lock":     {Key: "shard-7", Lock: "shard-9", Token: shard.Token(), Proof: shard.Proof()},
	} {
		ran, err := setBalanceFenced(ctx, g, f, "forged")
		var fe *pgguard.ForgedError
		if ran || !errors.Is(err, pgguard.ErrForged) || !errors.Is(err, fenceproof.ErrForged) || !errors.As(err, &fe) || errors.Is(err, client.ErrStale) {
			t.Fatalf("%s: ran %v, err %v; want ErrForged (not stale) and no work", name, ran, err)
		}
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM tenure_fence`); n != 0 {
		t.Fatalf("forged tokens moved the fence: %d rows", n)
	}
	if st := g.Stats(); st.Forged != 5 || st.Stale != 0 || st.Applied != 0 {
		t.Fatalf("stats %+v", st)
	}
	if ran, err := setBalanceFenced(ctx, g, pgguard.Fence{Key: "shard-7", Token: shard.Token(), Proof: shard.Proof()}, "valid"); !ran || err != nil {
		t.Fatalf("a valid proof: ran %v, err %v", ran, err)
	}
	// The proof of shard-8's grant opens a resource keyed otherwise that
	// names shard-8 as its lock.
	if ran, err := setBalanceFenced(ctx, g, pgguard.Fence{Key: "account-1", Lock: "shard-8", Token: other.Token(), Proof: other.Proof()}, "valid"); !ran || err != nil {
		t.Fatalf("a valid proof with Fence.Lock: ran %v, err %v", ran, err)
	}
}

// setBalanceFenced is setBalance with a whole Fence.
func setBalanceFenced(ctx context.Context, g *pgguard.Guard, f pgguard.Fence, value string) (ran bool, err error) {
	err = g.Do(ctx, f, func(ctx context.Context, tx pgx.Tx) error {
		ran = true
		_, err := tx.Exec(ctx, `INSERT INTO balances (account, value, token) VALUES ($1, $2, $3)
ON CONFLICT (account) DO UPDATE SET value = EXCLUDED.value, token = EXCLUDED.token`, f.Key, value, int64(f.Token))
		return err
	})
	return ran, err
}
