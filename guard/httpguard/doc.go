// Package httpguard fences HTTP requests: a service that receives effects
// (writes, charges, messages) rejects every request whose fencing token is
// below the highest token it has already accepted for the same resource,
// and the sending side refuses to send at all while its hold is not Held.
//
// # Wire contract
//
// A fenced request carries three headers:
//
//	Tenure-Fence-Token:  the sender's fencing token, decimal, 1..2^63-1 (required)
//	Tenure-Resource-Key: the resource the token is for, 1..256 bytes (required)
//	Tenure-Operation-Id: the business operation, up to 256 bytes (optional)
//
// A request is accepted iff its token is at least the highest token
// accepted for its resource key (equal tokens are accepted: one holder
// sends many requests under one grant). A request with a lower token is
// answered 409 Conflict, the handler is not called, and the body names both
// tokens:
//
//	{"error":"stale fence token","key":"shard-7","token":41,"accepted_token":42}
//
// with the response header Tenure-Fence-Result: stale. Missing or invalid
// headers are answered 400 Bad Request with {"error":"..."} saying which
// header and why. A failure of the store that keeps the high-water mark is
// answered 503 Service Unavailable; the handler is not called.
//
// # Where the check happens
//
// The check must be atomic with the effect, or a request admitted just
// before a newer token arrived can still land its effect after the newer
// one. Two ways are offered, chosen in Config:
//
//  1. The handler's own transaction (Config.HandlerChecks). The middleware
//     only parses and validates the headers and puts the Fence in the
//     request context (FromContext). The handler advances the high-water
//     mark inside the same database transaction as its effect and calls
//     Guard.Reject when the fence is stale. For PostgreSQL, use
//     guard/pgguard's Do inside the handler (it also records the operation
//     id, so a retried request has no second effect), or
//     pgstore.Store.AdvanceTx with the handler's pgx.Tx. This is the only
//     way that stays atomic when several replicas of the service run.
//  2. A Store (Config.Store): the middleware calls Store.Advance before the
//     handler and calls the handler only if the token was accepted. While
//     the handler runs, the middleware holds a per-key lock in this
//     process (unless Config.Concurrent), so a newer token's request waits
//     until an older token's handler has returned: within one process, no
//     effect of a lower token follows an effect of a higher one. Across
//     several replicas of the service the Store alone is a check followed
//     by an act; use the transactional way there. Two Store
//     implementations ship: RegisterStore (a Tenure fenced register per
//     key) and pgstore.Store (a PostgreSQL table).
//
// With pgguard, the handler of path 1 looks like this:
//
//	hg, _ := httpguard.New(httpguard.Config{HandlerChecks: true})
//	pg, _ := pgguard.New(pool)
//	mux.Handle("/charge", hg.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
//		f, _ := httpguard.FromContext(r.Context())
//		err := pg.Do(r.Context(), pgguard.Fence{Key: f.Key, Token: f.Token, OperationID: f.OperationID},
//			func(ctx context.Context, tx pgx.Tx) error {
//				_, err := tx.Exec(ctx, `INSERT INTO charges ...`)
//				return err
//			})
//		var stale *pgguard.StaleError
//		switch {
//		case errors.As(err, &stale):
//			hg.Reject(w, r, f, stale.Accepted) // 409, counted in Stats().Stale
//		case errors.Is(err, pgguard.ErrDuplicate):
//			w.WriteHeader(http.StatusOK) // applied by an earlier attempt
//		case err != nil:
//			http.Error(w, "charge failed", http.StatusInternalServerError)
//		}
//	})))
//
// # Operation ids
//
// The operation id is passed to the handler in Fence.OperationID. Fencing
// orders owners; it does not make a retry harmless. Record the operation id
// in the same transaction as the effect (pgguard does) so a retried request
// is recognised. The middleware does not deduplicate by itself: recording
// the id and applying the effect in two separate steps would either lose an
// effect or repeat it after a crash between them.
//
// # Sending side
//
// Transport is an http.RoundTripper that adds the headers from a hold and
// returns an error without sending when the hold is not Held, and cancels
// an in-flight request the moment the hold stops being Held. Refusing to
// send is an optimisation; the receiving side's check is the protection.
// CheckResponse turns a guard's 409 into an error matching client.ErrStale.
//
// # Diagnostics
//
// Guard.Stats counts admitted, stale, invalid and failed requests; a rising
// stale count means owners act after losing their lock (see
// `tenure lock history NAME -o json` for how their grants ended), a rising
// invalid count means a sender does not fence. Config.OnStale and
// Config.OnError log individual events. docs/fencing.md has the full
// diagnostics table.
package httpguard
