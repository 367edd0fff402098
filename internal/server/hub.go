package server

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/metrics"
)

type waitKey struct {
	session uint64
	name    string
}

// Hub routes state-machine events to the requests waiting for them: a grant
// goes to the one waiting acquire it is for (no broadcast, no herd), and a
// session's end goes to the streams attached to it.
type Hub struct {
	// grants counts EventGranted notifications delivered to waiters.
	grants atomic.Uint64

	// mu guards waits, streams and observers.
	mu        sync.Mutex
	waits     map[waitKey]chan fsm.Event
	streams   map[uint64]map[*sessionStream]struct{}
	observers map[string]map[*observer]struct{}

	// kv is the key-value event history that watches read (watch.go).
	kv *watchRing
	// queues: waiting dequeues (queue.go).
	queues queueWaiters
	// clock dates revisions (revclock.go).
	clock *revisionClock
	// changes tells the dashboard the state changed (dashboard.go).
	changes changeFeed
	// metrics are this process's (internal/metrics).
	metrics *metrics.Metrics
}

// observerBuffer is how many leader changes an observer may lag behind
// before its stream is ended with an error.
const observerBuffer = 1024

type observer struct {
	ch       chan fsm.Event
	lost     chan struct{} // closed when ch overflowed
	lostOnce sync.Once
}

func (h *Hub) observe(name string) *observer {
	h.mu.Lock()
	defer h.mu.Unlock()
	ob := &observer{ch: make(chan fsm.Event, observerBuffer), lost: make(chan struct{})}
	if h.observers[name] == nil {
		h.observers[name] = make(map[*observer]struct{})
	}
	h.observers[name][ob] = struct{}{}
	return ob
}

func (h *Hub) unobserve(name string, ob *observer) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.observers[name], ob)
	if len(h.observers[name]) == 0 {
		delete(h.observers, name)
	}
}

// NewHub returns an empty hub.
func NewHub() *Hub {
	h := &Hub{waits: make(map[waitKey]chan fsm.Event), streams: make(map[uint64]map[*sessionStream]struct{}), observers: make(map[string]map[*observer]struct{}), kv: newWatchRing(DefaultKVLimits().WatchHistory, DefaultKVLimits().WatchHistoryBytes),
		clock: newRevisionClock(time.Now()), metrics: metrics.New()}
	return h
}

// Metrics are the metrics of the process this hub serves: its events and
// the service's requests feed them.
func (h *Hub) Metrics() *metrics.Metrics { return h.metrics }

// Sink receives the state machine's events; it never blocks.
func (h *Hub) Sink(e fsm.Event) {
	switch e.Kind {
	case fsm.EventApplied:
		h.clock.applied(e.Revision, time.Now())
		h.kv.feed(e)
		h.changes.publish(e.Revision)
	case fsm.EventRestored:
		h.clock.restored(e.Revision)
		h.kv.feed(e)
		h.changes.publish(e.Revision)
	case fsm.EventKVPut, fsm.EventKVDelete:
		h.kv.feed(e)
	case fsm.EventGranted, fsm.EventWaitEnded:
		h.mu.Lock()
		ch := h.waits[waitKey{e.Session, e.Name}]
		h.mu.Unlock()
		if ch == nil {
			return
		}
		// Count before delivering, so that a reader who saw the grant
		// arrive also sees it counted.
		if e.Kind == fsm.EventGranted {
			h.grants.Add(1)
		}
		select {
		case ch <- e:
		default:
			if e.Kind == fsm.EventGranted {
				h.grants.Add(^uint64(0)) // not delivered
			}
		}
	case fsm.EventHolderChanged:
		h.mu.Lock()
		for ob := range h.observers[e.Name] {
			select {
			case ob.ch <- e:
			default:
				ob.lostOnce.Do(func() { close(ob.lost) })
			}
		}
		h.mu.Unlock()
	case fsm.EventQueueReady:
		h.queueEvent(e)
	case fsm.EventSessionEnded:
		h.mu.Lock()
		var targets []*sessionStream
		for ss := range h.streams[e.Session] {
			targets = append(targets, ss)
		}
		h.mu.Unlock()
		for _, ss := range targets {
			ss.sessionEnded(e.Expired)
		}
	}
}

// GrantNotifications reports how many grant notifications were delivered.
func (h *Hub) GrantNotifications() uint64 { return h.grants.Load() }

// register takes the slot for (session, name). A session has at most one
// acquisition per lock; with takeover (a resumed acquire) an existing slot
// belongs to a request of a stream that broke and is taken over, without
// it the request is a duplicate and register fails.
func (h *Hub) register(k waitKey, takeover bool) (chan fsm.Event, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, busy := h.waits[k]; busy && !takeover {
		return nil, false
	}
	ch := make(chan fsm.Event, 2)
	h.waits[k] = ch
	return ch, true
}

func (h *Hub) unregister(k waitKey, ch chan fsm.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.waits[k] == ch {
		delete(h.waits, k)
	}
}

func (h *Hub) attach(id uint64, ss *sessionStream) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.streams[id]
	if m == nil {
		m = make(map[*sessionStream]struct{})
		h.streams[id] = m
	}
	m[ss] = struct{}{}
}

func (h *Hub) detach(id uint64, ss *sessionStream) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.streams[id], ss)
	if len(h.streams[id]) == 0 {
		delete(h.streams, id)
	}
}
