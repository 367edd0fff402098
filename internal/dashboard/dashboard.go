// Package dashboard serves Tenure's web dashboard: a page built into the
// binary (go:embed, no build step) that reads the node's state through a
// small JSON API and redraws when a server-sent event says the state
// changed. docs/monitoring.md describes its pages.
//
// It reads through a Source, the node's own view (the service implements
// it). Its one write, requeueing dead letters, is a POST that must carry
// the header X-Tenure-Dashboard: 1, which a page of another site cannot
// send without the server's consent (a CORS preflight this handler never
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

// Source is what the dashboard reads. Every method must be safe for
// concurrent use and quick (it runs under a request).
type Source interface {
	Cluster() Cluster
	Locks(prefix string, limit int) ([]Lock, bool)
	// Lock describes one lock with its grant history, oldest first.
	Lock(name string) (Lock, []Grant)
	Sessions(limit int) ([]Session, bool)
	Queues(limit int) ([]Queue, bool)
	DeadLetters(queue string, limit int) ([]DeadLetter, bool)
	// Requeue moves dead letters of queue back to its ready items (all
	// of them, up to a batch, if ids is empty) and says how many.
	Requeue(ctx context.Context, queue string, ids []uint64) (int, error)
	Elections(limit int) ([]Election, bool)
	// Changes delivers the state's revision, at least once after each
	// change (coalesced: a slow reader sees the latest), until stop.
	Changes() (ch <-chan uint64, stop func())
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
	mux.HandleFunc("GET /api/cluster", func(w http.ResponseWriter, _ *http.Request) { reply(w, src.Cluster()) })
	mux.HandleFunc("GET /api/locks", func(w http.ResponseWriter, r *http.Request) {
		locks, more := src.Locks(r.URL.Query().Get("prefix"), listLimit)
		reply(w, map[string]any{"locks": locks, "more": more})
	})
	mux.HandleFunc("GET /api/lock", func(w http.ResponseWriter, r *http.Request) {
		l, grants := src.Lock(r.URL.Query().Get("name"))
		reply(w, map[string]any{"lock": l, "grants": grants, "now": time.Now().UnixMilli()})
	})
	mux.HandleFunc("GET /api/sessions", func(w http.ResponseWriter, _ *http.Request) {
		s, more := src.Sessions(listLimit)
		reply(w, map[string]any{"sessions": s, "more": more})
	})
	mux.HandleFunc("GET /api/queues", func(w http.ResponseWriter, _ *http.Request) {
		q, more := src.Queues(listLimit)
		reply(w, map[string]any{"queues": q, "more": more})
	})
	mux.HandleFunc("GET /api/dead", func(w http.ResponseWriter, r *http.Request) {
		d, more := src.DeadLetters(r.URL.Query().Get("queue"), listLimit)
		reply(w, map[string]any{"items": d, "more": more})
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
		if err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		reply(w, map[string]any{"requeued": n})
	})
	mux.HandleFunc("GET /api/elections", func(w http.ResponseWriter, _ *http.Request) {
		e, more := src.Elections(listLimit)
		reply(w, map[string]any{"elections": e, "more": more})
	})
	mux.HandleFunc("GET /api/events", func(w http.ResponseWriter, r *http.Request) { events(w, r, src) })
	return mux
}

func reply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if err := json.NewEncoder(w).Encode(v); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// events streams "change" events (data: the revision) while the client
// stays, at most one per minEventGap.
func events(w http.ResponseWriter, r *http.Request, src Source) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	ch, stop := src.Changes()
	defer stop()
	send := func(rev uint64) error {
		if _, err := fmt.Fprintf(w, "event: change\ndata: %d\n\n", rev); err != nil {
			return err
		}
		return rc.Flush()
	}
	if err := send(src.Cluster().Revision); err != nil {
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
			if _, err := fmt.Fprint(w, ": keepalive\n\n"); err != nil || errors.Is(rc.Flush(), http.ErrNotSupported) {
				return
			}
		}
	}
}
