package httpguard

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/tenure-io/tenure/fenceproof"
)

// Store keeps a durable high-water mark per resource key.
//
// Advance accepts token iff it is at least the highest token accepted for
// key so far, and then records it; the comparison and the update must be
// one atomic step in the store (a read followed by a write leaves the same
// race fencing exists to close). accepted reports the outcome; current is
// the key's high-water mark after the call (for a rejected token, one at
// least as large as the token that beat it). err is non-nil only when the
// outcome is unknown or the store failed; a stale token is not an error.
// Implementations must be safe for concurrent use and must never let the
// mark decrease, including across restarts.
type Store interface {
	Advance(ctx context.Context, key string, token uint64) (accepted bool, current uint64, err error)
}

// Config configures a Guard. Exactly one of Store and HandlerChecks is set.
type Config struct {
	// Store checks and advances the high-water mark before the handler
	// runs; the handler is called only for accepted requests.
	Store Store
	// HandlerChecks declares that the handler checks the fence itself, in
	// the same transaction as its effect (FromContext gives the Fence), and
	// calls Guard.Reject when it is stale. The middleware then only
	// validates headers.
	HandlerChecks bool
	// Concurrent lets requests for one resource key run the handler
	// concurrently. By default (false) the Store path holds a per-key lock
	// in this process from the check until the handler returns, so that
	// effects of a lower token cannot follow effects of a higher one in
	// this process. Ignored with HandlerChecks.
	Concurrent bool
	// OnStale, if set, is called for every request rejected as stale
	// (accepted is 0 when unknown). It runs on the request's goroutine and
	// must be safe for concurrent use.
	OnStale func(r *http.Request, f Fence, accepted uint64)
	// OnError, if set, is called when the store fails (the request is
	// answered 503). Same rules as OnStale.
	OnError func(r *http.Request, f Fence, err error)
	// Verifier, if set, makes the middleware accept a token only with a
	// fence proof (Tenure-Fence-Proof) that it verifies for the request's
	// lock: anything else is answered 403 with Tenure-Fence-Result:
	// forged, before the store or the handler, with no round trip to
	// Tenure. Build it from the cluster's public keys
	// (fenceproof.ParseKeyset), and keep it fresh (Verifier.Refresh) so
	// that keys the cluster retires stop verifying here.
	Verifier *fenceproof.Verifier
	// LockOf names the Tenure lock whose grants may act on a resource key,
	// for the proof check; nil means the lock named like the key. The
	// receiver decides it, never the sender: a proof of a lock the sender
	// holds must not open another lock's resource.
	LockOf func(key string) string
}

// Validate reports whether the configuration is usable.
func (c Config) Validate() error {
	switch {
	case c.Store == nil && !c.HandlerChecks:
		return errors.New("httpguard: no Store and HandlerChecks not set: nothing would check the fence")
	case c.Store != nil && c.HandlerChecks:
		return errors.New("httpguard: both Store and HandlerChecks set: choose where the fence is checked")
	}
	return nil
}

// Stats are a Guard's counters since it was created.
type Stats struct {
	// Admitted: requests passed to the handler (with a Store: accepted by
	// it; with HandlerChecks: with valid headers).
	Admitted uint64
	// Stale: requests answered 409 because a higher token had been
	// accepted for their key, by the Store or through Reject.
	Stale uint64
	// Invalid: requests answered 400 for missing or invalid headers.
	Invalid uint64
	// StoreErrors: requests answered 503 because the Store failed or the
	// request's context ended before the check completed.
	StoreErrors uint64
	// Forged: requests answered 403 because their fence proof did not
	// verify (Config.Verifier). Any is a bug or an attack.
	Forged uint64
}

// Guard is the middleware. It is safe for concurrent use.
type Guard struct {
	cfg Config

	admitted    atomic.Uint64
	stale       atomic.Uint64
	invalid     atomic.Uint64
	storeErrors atomic.Uint64
	forged      atomic.Uint64

	// mu guards keys.
	mu   sync.Mutex
	keys map[string]*keyLock
}

// keyLock serialises the requests for one key; refs counts the requests
// that use or wait for it, so the entry is removed when idle.
type keyLock struct {
	sem  chan struct{}
	refs int
}

// New returns a Guard. It starts nothing.
func New(cfg Config) (*Guard, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Guard{cfg: cfg, keys: make(map[string]*keyLock)}, nil
}

// Stats returns the counters. The stale counter is the first thing to look
// at when diagnosing a late writer: a non-zero value means an old owner
// kept sending after a newer one had been accepted.
func (g *Guard) Stats() Stats {
	return Stats{
		Admitted:    g.admitted.Load(),
		Stale:       g.stale.Load(),
		Invalid:     g.invalid.Load(),
		StoreErrors: g.storeErrors.Load(),
		Forged:      g.forged.Load(),
	}
}

// Wrap returns next guarded by the fence check.
func (g *Guard) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, err := ParseHeaders(r.Header)
		if err != nil {
			g.invalid.Add(1)
			writeJSON(w, http.StatusBadRequest, errorBody{Error: err.Error()})
			return
		}
		if g.cfg.Verifier != nil {
			lock := f.Key
			if g.cfg.LockOf != nil {
				lock = g.cfg.LockOf(f.Key)
			}
			if err := g.cfg.Verifier.Verify(lock, f.Token, f.Proof); err != nil {
				g.forged.Add(1)
				w.Header().Set(HeaderResult, "forged")
				writeJSON(w, http.StatusForbidden, ForgedBody{Error: ForgedMessage, Key: f.Key, Lock: lock, Token: f.Token, Reason: err.Error()})
				return
			}
		}
		r = r.WithContext(NewContext(r.Context(), f))
		if g.cfg.HandlerChecks {
			g.admitted.Add(1)
			next.ServeHTTP(w, r)
			return
		}
		if !g.cfg.Concurrent {
			unlock, err := g.lockKey(r.Context(), f.Key)
			if err != nil {
				// The client went away while waiting its turn.
				g.fail(w, r, f, err)
				return
			}
			defer unlock()
		}
		accepted, current, err := g.cfg.Store.Advance(r.Context(), f.Key, f.Token)
		if err != nil {
			g.fail(w, r, f, err)
			return
		}
		if !accepted {
			g.Reject(w, r, f, current)
			return
		}
		g.admitted.Add(1)
		next.ServeHTTP(w, r)
	})
}

func (g *Guard) fail(w http.ResponseWriter, r *http.Request, f Fence, err error) {
	g.storeErrors.Add(1)
	if g.cfg.OnError != nil {
		g.cfg.OnError(r, f, err)
	}
	writeJSON(w, http.StatusServiceUnavailable, errorBody{Error: "fence check failed; the request was not applied"})
}

// Reject answers a stale request: 409 Conflict with the JSON body and
// headers described in the package doc, and counts it. accepted is the
// resource's accepted token, or 0 if unknown (the field is then omitted).
// Handlers that check the fence themselves (HandlerChecks) call it when
// their check fails, after rolling back their transaction.
func (g *Guard) Reject(w http.ResponseWriter, r *http.Request, f Fence, accepted uint64) {
	g.stale.Add(1)
	if g.cfg.OnStale != nil {
		g.cfg.OnStale(r, f, accepted)
	}
	w.Header().Set(HeaderResult, "stale")
	if accepted != 0 {
		w.Header().Set(HeaderAcceptedToken, strconv.FormatUint(accepted, 10))
	}
	writeJSON(w, http.StatusConflict, StaleBody{Error: StaleMessage, Key: f.Key, Token: f.Token, AcceptedToken: accepted})
}

// lockKey waits for the key's turn, or until ctx ends.
func (g *Guard) lockKey(ctx context.Context, key string) (func(), error) {
	g.mu.Lock()
	kl := g.keys[key]
	if kl == nil {
		kl = &keyLock{sem: make(chan struct{}, 1)}
		g.keys[key] = kl
	}
	kl.refs++
	g.mu.Unlock()
	release := func() {
		g.mu.Lock()
		kl.refs--
		if kl.refs == 0 {
			delete(g.keys, key)
		}
		g.mu.Unlock()
	}
	select {
	case kl.sem <- struct{}{}:
		return func() {
			<-kl.sem
			release()
		}, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}

// StaleMessage is the "error" field of a stale answer.
const StaleMessage = "stale fence token"

// StaleBody is the JSON body of a 409 answer.
type StaleBody struct {
	Error string `json:"error"`
	Key   string `json:"key"`
	// Token is the request's token.
	Token uint64 `json:"token"`
	// AcceptedToken is the resource's accepted token (omitted if unknown).
	AcceptedToken uint64 `json:"accepted_token,omitempty"`
}

// ForgedMessage is the "error" field of a forged answer.
const ForgedMessage = "forged fence proof"

// ForgedBody is the JSON body of a 403 answer to a request whose fence
// proof did not verify.
type ForgedBody struct {
	Error string `json:"error"`
	Key   string `json:"key"`
	// Lock is the lock the proof was checked for.
	Lock string `json:"lock"`
	// Token is the request's token.
	Token uint64 `json:"token"`
	// Reason says why the proof did not verify.
	Reason string `json:"reason"`
}

type errorBody struct {
	Error string `json:"error"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// The bodies are plain structs of strings and integers.
		panic(err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
