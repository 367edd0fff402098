package server

import (
	"slices"
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
// goes to the acquire requests of its session for its lock (no broadcast,
// no herd), and a session's end goes to the streams attached to it.
type Hub struct {
	// mu guards waits, streams and observers.
	mu sync.Mutex
	// waits: the acquire requests waiting for an event, by session and
	// lock. The state machine keeps a session to one acquisition of a
	// lock; more than one request waits for it only while a resumed
	// acquire takes over from a request of a stream that ended (each
	// request tells its acquisition's events by its revision).
	waits map[waitKey][]grantWaiter
	// streams: the session stream attached to each session; more holds
	// the others of a session with more than one (a resume while the
	// stream it takes over from is still attached), which is rare: a
	// pointer per session rather than a slice or a set saves about 60
	// bytes of each of a million idle sessions.
	streams   map[uint64]*sessionStream
	more      map[uint64][]*sessionStream
	observers map[string]map[*observer]struct{}

	// kv is the key-value event history that watches read (watch.go).
	kv *watchRing
	// queues: waiting dequeues (queue.go).
	queues queueWaiters
	// clock dates revisions (revclock.go).
	clock *revisionClock
	// changes tells the dashboard the state changed (dashboard.go).
	changes changeFeed
	// acl tells open streams the ACLs changed (revoke.go).
	acl *aclFeed
	// metrics are this process's (internal/metrics).
	metrics *metrics.Metrics
	// znodes receives the events of ZooKeeper's watches (Front.OnZnodeEvents).
	znodes atomic.Pointer[func(fsm.Event)]
}

// grantWaiter is an acquire request waiting for the events of its
// session's acquisition of a lock (a pendingAcquire). wake is called on the
// state machine's apply path, in the order of the events, without the
// hub's lock held; it must not block.
type grantWaiter interface {
	wake(e fsm.Event)
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
	h := &Hub{waits: make(map[waitKey][]grantWaiter), streams: make(map[uint64]*sessionStream), more: make(map[uint64][]*sessionStream), observers: make(map[string]map[*observer]struct{}), kv: newWatchRing(DefaultKVLimits().WatchHistory, DefaultKVLimits().WatchHistoryBytes),
		clock: newRevisionClock(time.Now()), metrics: metrics.New(), acl: newACLFeed()}
	return h
}

// Metrics are the metrics of the process this hub serves: its events and
// the service's requests feed them.
func (h *Hub) Metrics() *metrics.Metrics { return h.metrics }

// Sink receives the state machine's events; it never blocks.
func (h *Hub) Sink(e fsm.Event) {
	switch e.Kind {
	case fsm.EventZnode, fsm.EventSessionEnded, fsm.EventApplied, fsm.EventRestored:
		if fn := h.znodes.Load(); fn != nil {
			(*fn)(e)
		}
	}
	switch e.Kind {
	case fsm.EventApplied:
		h.clock.applied(e.Revision, time.Now())
		h.acl.feed() // before the batch's events reach watchers
		h.kv.feed(e)
		h.changes.publish(e.Revision)
	case fsm.EventRestored:
		h.clock.restored(e.Revision)
		h.acl.feed()
		h.kv.feed(e)
		h.changes.publish(e.Revision)
	case fsm.EventKVPut, fsm.EventKVDelete:
		h.kv.feed(e)
	case fsm.EventGranted, fsm.EventWaitEnded:
		// Woken outside the lock: a waiter answers its request, which
		// may unregister it. Almost always one waiter: no allocation.
		var buf [2]grantWaiter
		h.mu.Lock()
		targets := append(buf[:0], h.waits[waitKey{e.Session, e.Name}]...)
		h.mu.Unlock()
		for _, w := range targets {
			w.wake(e)
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
		targets := h.attachedLocked(e.Session)
		h.mu.Unlock()
		for _, ss := range targets {
			ss.sessionEnded(e.Expired)
		}
	}
}

// register adds w, a request waiting for the events of (session, name):
// every such event from now on wakes it, until it is unregistered.
func (h *Hub) register(k waitKey, w grantWaiter) {
	h.mu.Lock()
	h.waits[k] = append(h.waits[k], w)
	h.mu.Unlock()
}

// unregister removes w; an event being delivered meanwhile may still wake
// it once.
func (h *Hub) unregister(k waitKey, w grantWaiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ws := slices.DeleteFunc(h.waits[k], func(o grantWaiter) bool { return o == w })
	if len(ws) == 0 {
		delete(h.waits, k)
		return
	}
	h.waits[k] = ws
}

func (h *Hub) attach(id uint64, ss *sessionStream) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch first, ok := h.streams[id]; {
	case !ok:
		h.streams[id] = ss
	case first != ss && !slices.Contains(h.more[id], ss):
		h.more[id] = append(h.more[id], ss)
	}
}

func (h *Hub) detach(id uint64, ss *sessionStream) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.streams[id] == ss {
		// The first of the others, if any, takes its place.
		if rest := h.more[id]; len(rest) > 0 {
			h.streams[id] = rest[0]
			h.setMoreLocked(id, rest[1:])
		} else {
			delete(h.streams, id)
		}
		return
	}
	h.setMoreLocked(id, slices.DeleteFunc(h.more[id], func(o *sessionStream) bool { return o == ss }))
}

func (h *Hub) setMoreLocked(id uint64, rest []*sessionStream) {
	if len(rest) == 0 {
		delete(h.more, id)
		return
	}
	h.more[id] = rest
}

// attachedLocked returns the session streams attached to session id.
func (h *Hub) attachedLocked(id uint64) []*sessionStream {
	first, ok := h.streams[id]
	if !ok {
		return nil
	}
	return append([]*sessionStream{first}, h.more[id]...)
}
