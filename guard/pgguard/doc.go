// Package pgguard fences writes to PostgreSQL with Tenure's fencing tokens.
//
// A Tenure lock is a lease: its holder can be paused (GC, swap, SIGSTOP, a
// VM migration) past its TTL and wake up still believing it owns the lock
// that the service has meanwhile granted, with a larger token, to someone
// else. The lock alone cannot stop the late write. The resource has to check
// the token in the same atomic step as the effect; this package does that
// for PostgreSQL.
//
// # Use
//
//	pgguard.Migrate(ctx, pool) // once: CREATE TABLE IF NOT EXISTS ...
//	g, _ := pgguard.New(pool)
//	h, _ := mutex.Lock(ctx) // a Tenure hold on "shard-7"
//	err := g.Do(h.Context(), pgguard.Fence{Key: "shard-7", Token: h.Token(), OperationID: "op-123"},
//		func(ctx context.Context, tx pgx.Tx) error {
//			_, err := tx.Exec(ctx, "UPDATE shards SET state = $1 WHERE id = 7", state)
//			return err
//		})
//	switch {
//	case errors.Is(err, pgguard.ErrStale): // a newer owner exists: stop
//	case errors.Is(err, pgguard.ErrDuplicate): // applied before: nothing to do
//	case err != nil: // rolled back (or, for ErrUnknownOutcome, retry with the same id)
//	}
//
// # What Guard.Do does
//
// Guard.Do runs the caller's work in one transaction that, before the work,
//
//  1. records the operation id in tenure_fence_ops (when one is given): if
//     the id is already recorded for the key, the operation was applied
//     before, Do returns an error matching ErrDuplicate and the work is not
//     run again;
//  2. advances the key's fence row in tenure_fence to the token, if and only
//     if the row's token is not larger (the statement is below): when it
//     changes no row, a larger token has been accepted, Do rolls the
//     transaction back and returns an error matching ErrStale (and
//     client.ErrStale), and the work is never run;
//  3. runs the work with the transaction, then commits.
//
// Step 2 is the conditional UPDATE `... SET fence_token = $token WHERE
// resource_key = $key AND fence_token <= $token`, written as an upsert so
// that the first write for a new key needs no separate step:
//
//	INSERT INTO tenure_fence AS f (resource_key, fence_token, updated_at)
//	VALUES ($1, $2, now())
//	ON CONFLICT (resource_key) DO UPDATE
//	SET fence_token = EXCLUDED.fence_token, updated_at = now()
//	WHERE f.fence_token <= EXCLUDED.fence_token
//
// The fence row, the operation record and every write the work makes
// through the transaction commit together or not at all. A token equal to
// the accepted one is accepted: the same holder may write many times.
//
// # Isolation level, and why the check is one statement
//
// READ COMMITTED (PostgreSQL's default, and Do's default) is enough. The
// upsert locks the key's fence row. A transaction with a lower token that
// arrives while a higher-token transaction holds that lock waits for it; when
// the holder commits, PostgreSQL re-evaluates the WHERE clause against the
// newly committed row (the higher token), the condition is false and the
// statement changes no row: ErrStale. If the holder rolls back instead, the
// waiter sees the old row and proceeds. A new key is just as safe: two
// transactions inserting the same new key conflict on the primary key, and
// the second one waits for the first and then takes the DO UPDATE branch,
// with the WHERE clause evaluated against the first one's committed token.
// The row lock is held until commit, so at most one transaction per key is
// past step 2 at a time, and the transactions that commit for one key do so
// in non-decreasing token order.
//
// A separate SELECT followed by an UPDATE would be wrong. Under READ
// COMMITTED the SELECT takes no lock: two owners can both read token 41,
// both decide they may write (43 ≥ 41 and, paused in between, 42 ≥ 41), and
// the later-committing one, possibly the older owner, overwrites the newer
// owner's token and effect. The check and the advance must be one statement
// (or the row must be locked with SELECT ... FOR UPDATE first, which costs a
// round trip and is easy to forget). Stronger isolation levels are also
// safe, but contention then surfaces as serialization failures (SQLSTATE
// 40001) that the caller has to retry, rather than as ErrStale.
//
// # The safety contract
//
//   - Every writer of the guarded data must go through a Guard with the same
//     Fence.Key, and must make its writes through the transaction handed to
//     the work function. Writes made on another connection, and effects
//     outside PostgreSQL (an email, an HTTP call), are not fenced; record
//     them in the transaction (an outbox row) and perform them from there.
//   - Use one Key per Tenure lock (the lock name is a good key) and the token
//     of the current hold on that lock. Tokens of different locks are
//     comparable numbers but say nothing about each other's resources.
//   - The work function must not commit or roll back the transaction, and
//     must return the first error it meets: a swallowed error leaves the
//     transaction aborted and Do reports the rollback at commit.
//   - An operation id is remembered per key until ForgetOperations removes
//     it; a retry after that point is applied again.
//   - The fence row for a key serialises that key's transactions: keep the
//     work short.
//   - If COMMIT itself fails in a way that leaves its outcome unknown (the
//     connection broke), Do returns an error matching ErrUnknownOutcome (and
//     client.ErrUnknownOutcome). Retry with the same operation id: the retry
//     returns ErrDuplicate if the first attempt committed.
//
// The schema is in schema.sql (embedded as Schema) and is created by
// Migrate. The tables are created in, and looked up through, the
// connection's search_path.
package pgguard
