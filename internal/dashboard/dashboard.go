// Package dashboard serves Tenure's web dashboard: a page built into the
// binary (go:embed, no build step) that reads the node's state through a
// small JSON API and redraws when the server says the state changed.
// docs/monitoring.md describes its pages; docs/security.md its door.
//
// It reads through a Source, the node's own view (the service implements
// it), which is handed every request's context: the Source decides what
// the request's caller may see (on a node with --auth, only what the
// caller's ACL policies let it read) and answers a refusal with an error
// that carries its HTTP status (StatusError). The page itself and its
// files hold no data and are served to anyone; the page asks for an ACL
// token, keeps it in the tab's session storage and sends it as
// "Authorization: Bearer SECRET" on every request, its change stream
// included (read with fetch, not EventSource, which cannot send it).
//
// Its one write, requeueing dead letters, is a POST that must carry the
// header X-Tenure-Dashboard: 1, which a page of another site cannot send
// without the server's consent (a CORS preflight this handler never
// grants).
package dashboard

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"strconv"
	"time"
)

// Source is what the dashboard reads. Every method gets the request's
// context, must be safe for concurrent use and quick (it runs under a
// request), and answers what the request's caller may not see with an
// error, a StatusError for a refusal.
type Source interface {
	Cluster(ctx context.Context) (Cluster, error)
	// Locks lists the locks under prefix the caller may read.
	Locks(ctx context.Context, prefix string, limit int) ([]Lock, bool, error)
	// Lock describes one lock with its grant history, oldest first.
	Lock(ctx context.Context, name string) (Lock, []Grant, error)
	Sessions(ctx context.Context, limit int) ([]Session, bool, error)
	Queues(ctx context.Context, limit int) ([]Queue, bool, error)
	DeadLetters(ctx context.Context, queue string, limit int) ([]DeadLetter, bool, error)
	// Requeue moves dead letters of queue back to its ready items (all
	// of them, up to a batch, if ids is empty) and says how many, with
	// the checks, the log and the metrics of the API's own requeue.
	Requeue(ctx context.Context, queue string, ids []uint64) (int, error)
	Elections(ctx context.Context, limit int) ([]Election, bool, error)
	// Changes delivers the state's revision, at once and at least once
	// after each change (coalesced: a slow reader sees the latest), until
	// stop.
	Changes(ctx context.Context) (ch <-chan uint64, stop func(), err error)
	// Allowed reports whether the caller of ctx may still follow the
	// changes: the stream ends when it may not (a revoked token).
	Allowed(ctx context.Context) error
}

// StatusError is an error a Source answers with an HTTP status (401 for
// no credential, 403 for a missing right, ...).
type StatusError interface {
	error
	HTTPStatus() int
}

// Cluster is the node's view of the cluster.
type Cluster struct {
	Node         string   `json:"node"`
	Leader       string   `json:"leader"`
	Term         uint64   `json:"term"`
	CommitIndex  uint64   `json:"commit_index"`
	AppliedIndex uint64   `json:"applied_index"`
	Revision     uint64   `json:"revision"`
	Voters       []string `json:"voters"`
	Ready        bool     `json:"ready"`
	NotReady     string   `json:"not_ready"`
	Version      string   `json:"version"`
	// Members lists every member; their health is the leader's view,
	// which View names ("" when this node is a follower: unknown).
	Members []Member `json:"members"`
	View    string   `json:"view"`
	// Degraded names the members that do not answer the leader ("" when
	// all do, or on a follower).
	Degraded string  `json:"degraded"`
	Summary  Summary `json:"summary"`
}

// Member is one member of the cluster and its health from the leader's
// view (zero on a follower).
type Member struct {
	ID            string `json:"id"`
	PeerAddr      string `json:"peer_addr"`
	Voter         bool   `json:"voter"`
	Leader        bool   `json:"leader"`
	Reachable     bool   `json:"reachable"`
	LastContactMs int64  `json:"last_contact_ms"`
	MatchIndex    uint64 `json:"match_index"`
	Lag           uint64 `json:"lag"`
	// Version is the protocol version the member reports ("" none).
	Version string `json:"version"`
}

// Summary counts what the state holds.
type Summary struct {
	Locks    int `json:"locks"`
	Held     int `json:"held"`
	Waiters  int `json:"waiters"`
	Delayed  int `json:"delayed"`
	Sessions int `json:"sessions"`
	Queues   int `json:"queues"`
	// Ready, InFlight and Dead sum the items of every queue.
	Ready    int `json:"ready"`
	InFlight int `json:"inflight"`
	Dead     int `json:"dead"`
}

// Holder is one holder of a lock.
type Holder struct {
	Owner   string `json:"owner"`
	Session uint64 `json:"session"`
	Token   uint64 `json:"token"`
	Mode    string `json:"mode"` // exclusive, shared or permit
	HeldMs  int64  `json:"held_ms"`
}

// Waiter is one queued acquire, in FIFO order.
type Waiter struct {
	Owner          string `json:"owner"`
	Session        uint64 `json:"session"`
	QueuedRevision uint64 `json:"queued_revision"`
	Shared         bool   `json:"shared"`
	WaitMs         int64  `json:"wait_ms"`
}

// Lock is a lock with its holders and waiters.
type Lock struct {
	Name    string   `json:"name"`
	Kind    string   `json:"kind"`
	Permits int      `json:"permits"`
	Holders []Holder `json:"holders"`
	Waiters []Waiter `json:"waiters"`
	// WaiterCount counts every waiter; Waiters lists the first.
	WaiterCount int   `json:"waiter_count"`
	DelayMs     int64 `json:"delay_ms"`
}

// Grant is one record of a lock's history. At and EndedAt are Unix
// milliseconds on this node's clock (EndedAt 0 while held).
type Grant struct {
	Owner           string `json:"owner"`
	Session         uint64 `json:"session"`
	Token           uint64 `json:"token"`
	GrantedRevision uint64 `json:"granted_revision"`
	Ended           string `json:"ended"` // held, released or expired
	EndedRevision   uint64 `json:"ended_revision"`
	At              int64  `json:"at"`
	EndedAt         int64  `json:"ended_at"`
}

// Session is a live session.
type Session struct {
	ID    uint64 `json:"id"`
	Owner string `json:"owner"`
	TTLMs int64  `json:"ttl_ms"`
	// TimeLeftMs: -1 unless this node leads (only the leader keeps
	// deadlines).
	TimeLeftMs int64    `json:"time_left_ms"`
	Held       []string `json:"held"`
	Waiting    []string `json:"waiting"`
	HeldCount  int      `json:"held_count"`
	WaitCount  int      `json:"waiting_count"`
}

// Queue is one queue's sizes.
type Queue struct {
	Name     string `json:"name"`
	Ready    int    `json:"ready"`
	InFlight int    `json:"inflight"`
	Dead     int    `json:"dead"`
	// OldestReadyMs: the oldest ready item's age; -1 if none is ready.
	OldestReadyMs int64 `json:"oldest_ready_ms"`
}

// DeadLetter is one dead-lettered item.
type DeadLetter struct {
	ID       uint64 `json:"id"`
	Attempts uint32 `json:"attempts"`
	Size     int    `json:"size"`
	// Preview is the payload's start, as text where it is UTF-8.
	Preview string `json:"preview"`
}

// Election is an election and its leader.
type Election struct {
	Name    string `json:"name"`
	Leader  string `json:"leader"` // the leader's owner ("" none)
	Session uint64 `json:"session"`
	Value   string `json:"value"`
	Epoch   uint64 `json:"epoch"` // the leader's token
}

// listLimit bounds each listing the dashboard shows.
const listLimit = 1000

// minEventGap is the least time between two change events of a stream:
// a busy server sends at most 10 a second, each saying "redraw".
const minEventGap = 100 * time.Millisecond

//go:embed static
var static embed.FS

// Handler serves the dashboard: the page at /, its files under
// /static/, the API under /api/.
func Handler(src Source) http.Handler {
	files, _ := fs.Sub(static, "static")
	mux := http.NewServeMux()
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(files)))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.ServeFileFS(w, r, files, "index.html")
	})
	mux.HandleFunc("GET /api/cluster", func(w http.ResponseWriter, r *http.Request) {
		c, err := src.Cluster(r.Context())
		reply(w, c, err)
	})
	mux.HandleFunc("GET /api/locks", func(w http.ResponseWriter, r *http.Request) {
		locks, more, err := src.Locks(r.Context(), r.URL.Query().Get("prefix"), listLimit)
		reply(w, map[string]any{"locks": locks, "more": more}, err)
	})
	mux.HandleFunc("GET /api/lock", func(w http.ResponseWriter, r *http.Request) {
		l, grants, err := src.Lock(r.Context(), r.URL.Query().Get("name"))
		reply(w, map[string]any{"lock": l, "grants": grants, "now": time.Now().UnixMilli()}, err)
	})
	mux.HandleFunc("GET /api/sessions", func(w http.ResponseWriter, r *http.Request) {
		s, more, err := src.Sessions(r.Context(), listLimit)
		reply(w, map[string]any{"sessions": s, "more": more}, err)
	})
	mux.HandleFunc("GET /api/queues", func(w http.ResponseWriter, r *http.Request) {
		q, more, err := src.Queues(r.Context(), listLimit)
		reply(w, map[string]any{"queues": q, "more": more}, err)
	})
	mux.HandleFunc("GET /api/dead", func(w http.ResponseWriter, r *http.Request) {
		d, more, err := src.DeadLetters(r.Context(), r.URL.Query().Get("queue"), listLimit)
		reply(w, map[string]any{"items": d, "more": more}, err)
	})
	mux.HandleFunc("POST /api/requeue", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Tenure-Dashboard") != "1" {
			http.Error(w, "requeue needs the header X-Tenure-Dashboard: 1", http.StatusForbidden)
			return
		}
		var req struct {
			Queue string   `json:"queue"`
			IDs   []string `json:"ids"`
		}
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
			http.Error(w, "the body must be {\"queue\":NAME,\"ids\":[ID...]}", http.StatusBadRequest)
			return
		}
		ids := make([]uint64, 0, len(req.IDs))
		for _, s := range req.IDs {
			id, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				http.Error(w, fmt.Sprintf("id %q is not a number", s), http.StatusBadRequest)
				return
			}
			ids = append(ids, id)
		}
		n, err := src.Requeue(r.Context(), req.Queue, ids)
		reply(w, map[string]any{"requeued": n}, err)
	})
	mux.HandleFunc("GET /api/elections", func(w http.ResponseWriter, r *http.Request) {
		e, more, err := src.Elections(r.Context(), listLimit)
		reply(w, map[string]any{"elections": e, "more": more}, err)
	})
	mux.HandleFunc("GET /api/events", func(w http.ResponseWriter, r *http.Request) { events(w, r, src) })
	return mux
}

// fail answers err: with its status if it is a StatusError (401 with the
// Bearer challenge), else 409.
func fail(w http.ResponseWriter, err error) {
	code := http.StatusConflict
	var se StatusError
	if errors.As(err, &se) {
		code = se.HTTPStatus()
	}
	if code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="tenure"`)
	}
	http.Error(w, err.Error(), code)
}

// reply answers v as JSON, or err if it is not nil.
func reply(w http.ResponseWriter, v any, err error) {
	if err != nil {
		fail(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if err := json.NewEncoder(w).Encode(v); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// events streams "change" events (data: the revision) while the client
// stays, at most one per minEventGap, in the format of server-sent
// events. The caller is checked again before every event (and every
// keepalive): the stream ends when its credential no longer works.
func events(w http.ResponseWriter, r *http.Request, src Source) {
	ctx := r.Context()
	ch, stop, err := src.Changes(ctx)
	if err != nil {
		fail(w, err)
		return
	}
	defer stop()
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	send := func(rev uint64) error {
		if err := src.Allowed(ctx); err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "event: change\ndata: %d\n\n", rev); err != nil {
			return err
		}
		return rc.Flush()
	}
	if err := rc.Flush(); err != nil { // the headers: the stream is open
		return
	}
	keepalive := time.NewTicker(15 * time.Second)
	defer keepalive.Stop()
	var last time.Time
	for {
		select {
		case <-r.Context().Done():
			return
		case rev := <-ch:
			if wait := minEventGap - time.Since(last); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-r.Context().Done():
					t.Stop()
					return
				case <-t.C:
				}
				select { // the latest revision, if it moved meanwhile
				case rev = <-ch:
				default:
				}
			}
			last = time.Now()
			if err := send(rev); err != nil {
				return
			}
		case <-keepalive.C:
			if src.Allowed(ctx) != nil {
				return
			}
			if _, err := fmt.Fprint(w, ": keepalive\n\n"); err != nil || errors.Is(rc.Flush(), http.ErrNotSupported) {
				return
			}
		}
	}
}
