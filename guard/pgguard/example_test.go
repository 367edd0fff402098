package pgguard_test

import (
	"context"
	"errors"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/guard/pgguard"
)

// A shard owner records its work under the hold's token. The example is
// compiled, not run: it needs a Tenure server and PostgreSQL.
func ExampleGuard_Do() {
	ctx := context.Background()
	db, err := pgx.Connect(ctx, "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	if err := pgguard.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	g, err := pgguard.New(db)
	if err != nil {
		log.Fatal(err)
	}

	c, err := client.Dial(ctx, client.DefaultEndpoint)
	if err != nil {
		log.Fatal(err)
	}
	s, err := c.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	m, err := s.Mutex("shard-7")
	if err != nil {
		log.Fatal(err)
	}
	h, err := m.Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer h.Unlock(context.Background())

	err = g.Do(h.Context(), pgguard.Fence{Key: "shard-7", Token: h.Token(), OperationID: "rebalance-2031-01-31"},
		func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE shards SET state = 'rebalanced' WHERE id = 7`)
			return err
		})
	switch {
	case errors.Is(err, pgguard.ErrStale):
		log.Print("a newer owner has shard-7: stopping")
	case errors.Is(err, pgguard.ErrDuplicate):
		log.Print("already rebalanced")
	case errors.Is(err, pgguard.ErrUnknownOutcome):
		log.Print("commit outcome unknown: retry with the same operation id")
	case err != nil:
		log.Fatal(err)
	}
}
