package server

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/fsm"
)

// Watch history: the hub appends every key change to one bounded ring, in
// log order; watchers read it at their own pace, each with its own cursor.
// A batch of applied log entries becomes visible to watchers at once
// (EventApplied), with one broadcast (a closed channel) however many
// watchers there are: the apply path never does per-watcher work, and a
// slow watcher slows nobody. A watcher whose cursor falls out of the ring
// (it read too slowly, or asked for an old revision) ends with
// ErrCompacted, which says from which revision history is available.

// ErrCompacted: a watch needs changes older than the event history the
// server keeps. Re-read the keys and watch again from the read's revision + 1.
var ErrCompacted = errors.New("tenure: watch history compacted")

// CompactedError is the ErrCompacted a watch ends with.
type CompactedError struct {
	// CompactRevision: the history holds only changes after this revision.
	CompactRevision uint64
	// CurrentRevision: the last revision the history has seen.
	CurrentRevision uint64
	// Requested: the first revision the watch needed.
	Requested uint64
	// Limit describes the history's bound, for the message.
	Limit string
}

func (e *CompactedError) Error() string {
	return fmt.Sprintf("%v: revision %d is not in the event history, which holds revisions %d..%d (%s); re-read and watch from the read's revision + 1",
		ErrCompacted, e.Requested, e.CompactRevision+1, e.CurrentRevision, e.Limit)
}

// Unwrap makes errors.Is(err, ErrCompacted) hold.
func (e *CompactedError) Unwrap() error { return ErrCompacted }

// kvEvent is one key change in the history: prev is the key before it
// (nil: it did not exist). wire is its API form, built once and shared,
// read-only, by every watcher that sends it.
type kvEvent struct {
	put  bool
	kv   fsm.KV
	prev *fsm.KV
	wire *pb.KVEvent
}

func newKVEvent(put bool, kv fsm.KV, prev *fsm.KV) kvEvent {
	typ := pb.KVEventType_KV_EVENT_TYPE_DELETE
	if put {
		typ = pb.KVEventType_KV_EVENT_TYPE_PUT
	}
	return kvEvent{put: put, kv: kv, prev: prev, wire: &pb.KVEvent{Type: typ, Kv: kvToProto(&kv)}}
}

// size counts the previous value too: the history keeps it alive.
func (e *kvEvent) size() int {
	n := len(e.kv.Key) + len(e.kv.Value) + 64
	if e.prev != nil {
		n += len(e.prev.Value) + 48
	}
	return n
}

// watchRing is the bounded event history. Lock order: Hub.mu is never held
// while taking watchRing.mu.
type watchRing struct {
	// mu guards the fields below.
	mu sync.RWMutex
	// buf is a circular buffer holding the events with sequence numbers
	// [first, next); buf[head] holds first. Sequence numbers only grow.
	buf         []kvEvent
	head        int
	first, next uint64
	// published: events [first, published) are visible to watchers (whole
	// applied batches; never half a transaction).
	published uint64
	bytes     int
	maxEvents int
	maxBytes  int
	// compactRev: the history holds every change after this revision.
	compactRev uint64
	// through: the state's revision once the published events were applied.
	through uint64
	// notify is closed (and replaced) whenever events are published.
	notify chan struct{}
}

func newWatchRing(maxEvents, maxBytes int) *watchRing {
	return &watchRing{maxEvents: maxEvents, maxBytes: maxBytes, notify: make(chan struct{})}
}

// configure sets the history's bounds (evicting at the next append).
func (r *watchRing) configure(maxEvents, maxBytes int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.maxEvents, r.maxBytes = maxEvents, maxBytes
}

func (r *watchRing) limitLocked() string {
	return fmt.Sprintf("the last %d events or %d bytes, --watch-history and --watch-history-bytes", r.maxEvents, r.maxBytes)
}

// feed takes one state-machine event; it never blocks on watchers.
func (r *watchRing) feed(e fsm.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch e.Kind {
	case fsm.EventKVPut, fsm.EventKVDelete:
		r.appendLocked(newKVEvent(e.Kind == fsm.EventKVPut, *e.KV, e.Prev))
	case fsm.EventApplied:
		r.through = max(r.through, e.Revision)
		if r.published != r.next {
			r.published = r.next
			close(r.notify)
			r.notify = make(chan struct{})
		}
	case fsm.EventRestored:
		// The state jumped to a snapshot: what happened before it is not
		// replayed. Skip a sequence number so that every cursor, even one
		// that was caught up, falls out of the ring.
		r.next++
		r.first, r.published = r.next, r.next
		r.head, r.bytes = 0, 0
		clear(r.buf)
		r.compactRev, r.through = e.Revision, e.Revision
		close(r.notify)
		r.notify = make(chan struct{})
	}
}

func (r *watchRing) count() int { return int(r.next - r.first) }

func (r *watchRing) at(seq uint64) *kvEvent {
	return &r.buf[(r.head+int(seq-r.first))%len(r.buf)]
}

func (r *watchRing) appendLocked(ev kvEvent) {
	for r.count() > 0 && (r.count() >= r.maxEvents || r.bytes+ev.size() > r.maxBytes) {
		old := r.at(r.first)
		r.compactRev = max(r.compactRev, old.kv.ModRevision)
		r.bytes -= old.size()
		*old = kvEvent{}
		r.head = (r.head + 1) % len(r.buf)
		r.first++
		if r.published < r.first {
			r.published = r.first
		}
	}
	if r.count() == len(r.buf) { // grow, up to maxEvents
		n := min(max(2*len(r.buf), 1024), max(r.maxEvents, 1))
		nb := make([]kvEvent, n)
		for i := range r.count() {
			nb[i] = r.buf[(r.head+i)%len(r.buf)]
		}
		r.buf, r.head = nb, 0
	}
	r.next++
	*r.at(r.next - 1) = ev
	r.bytes += ev.size()
}

// compactedLocked describes why a watch needing revision rev cannot go on.
func (r *watchRing) compactedLocked(rev uint64) error {
	return &CompactedError{CompactRevision: r.compactRev, CurrentRevision: r.through, Requested: rev, Limit: r.limitLocked()}
}

// seek returns the cursor of the first change at or after revision start,
// or a CompactedError when the history no longer goes back that far.
func (r *watchRing) seek(start uint64) (uint64, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if start <= r.compactRev {
		return 0, r.compactedLocked(start)
	}
	i := sort.Search(r.count(), func(i int) bool { return r.at(r.first+uint64(i)).kv.ModRevision >= start })
	return r.first + uint64(i), nil
}

// watchScan bounds how many events one read looks at under the lock (it
// goes on to the end of a revision, so a transaction is never split).
const watchScan = 4096

// read returns the matching published events from cursor on (next is
// the first revision the watch still needs): at most
// about watchScan looked at, ending at a revision boundary. through is the
// revision up to which the watch is complete after these events; caughtUp
// says whether the cursor reached the published end (then notify is the
// channel closed on the next publication).
func (r *watchRing) read(cursor uint64, next uint64, match func(*kvEvent) bool) (evs []kvEvent, cur, through uint64, caughtUp bool, notify <-chan struct{}, err error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if cursor < r.first {
		// Evicted past the cursor. Only what the watch still needs counts:
		// the evicted changes may all be older than next (a watch that
		// starts in the future).
		if r.compactRev >= next {
			return nil, cursor, 0, false, nil, r.compactedLocked(next)
		}
		cursor = r.first
	}
	var lastRev uint64
	scanned := 0
	for cursor < r.published {
		ev := r.at(cursor)
		if scanned >= watchScan && ev.kv.ModRevision != lastRev {
			return evs, cursor, lastRev, false, nil, nil
		}
		if match(ev) {
			evs = append(evs, *ev)
		}
		lastRev = ev.kv.ModRevision
		scanned++
		cursor++
	}
	return evs, cursor, r.through, true, r.notify, nil
}

// history reports the revisions the ring covers: (compactRev, through].
func (r *watchRing) history() (compactRev, through uint64) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.compactRev, r.through
}

// watchStatus adds the watch history's extent to a Status answer.
func (s *Server) watchStatus(out *pb.StatusResponse) {
	r := s.hub.kv
	r.mu.RLock()
	defer r.mu.RUnlock()
	out.WatchCompactRevision, out.WatchHistoryEvents = r.compactRev, uint64(r.count())
}

// maxWatchResponseBytes bounds the events of one watch response, so that
// values up to --max-value-len reach a client with gRPC's default 4 MiB
// receive limit: a response ends at a revision's last event once it
// holds this much (one revision's events are never split, so a
// transaction's may take more).
const maxWatchResponseBytes = 2 << 20

// watchResponses are the responses that send evs, in order and whole
// revisions each, the last one at revision through.
func watchResponses(evs []kvEvent, through uint64) []*pb.KVWatchResponse {
	var out []*pb.KVWatchResponse
	cur := &pb.KVWatchResponse{}
	size := 0
	for i := range evs {
		rev := evs[i].kv.ModRevision
		if size >= maxWatchResponseBytes && len(cur.Events) > 0 && rev != evs[i-1].kv.ModRevision {
			cur.Revision = evs[i-1].kv.ModRevision
			out = append(out, cur)
			cur, size = &pb.KVWatchResponse{}, 0
		}
		cur.Events = append(cur.Events, evs[i].wire)
		size += len(evs[i].kv.Key) + len(evs[i].kv.Value) + 64
	}
	cur.Revision = through
	return append(out, cur)
}

func kvToProto(kv *fsm.KV) *pb.KVKeyValue {
	// A key that is not UTF-8 (the etcd API's) shows Go-quoted: Tenure's
	// keys are text (fsm.ShowKey).
	return &pb.KVKeyValue{Key: fsm.ShowKey(kv.Key), Value: kv.Value, CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision, Version: kv.Version, Session: kv.Session}
}

// KVWatch implements pb.TenureServer.
func (s *Server) KVWatch(req *pb.KVWatchRequest, stream pb.Tenure_KVWatchServer) error {
	if err := fsm.ValidateKVKey(req.GetKey(), req.GetPrefix()); err != nil {
		return toStatus(err)
	}
	if err := s.admitKey(req.GetKey()); err != nil {
		return toStatus(err)
	}
	ctx := stream.Context()
	release, err := s.watches.take(ctx)
	if err != nil {
		return toStatus(err)
	}
	defer release()
	start := req.GetStartRevision()
	if start == 0 {
		if err := s.node.LinearizableRead(ctx); err != nil {
			return toStatus(err)
		}
		s.node.Read(func(st *fsm.State) { start = st.Revision() + 1 })
	}
	ring := s.hub.kv
	cursor, err := ring.seek(start)
	if err != nil {
		return toStatus(err)
	}
	key, prefix := req.GetKey(), req.GetPrefix()
	match := func(ev *kvEvent) bool {
		kv := &ev.kv
		if kv.ModRevision < start {
			// The cursor may sit before changes at or below the start:
			// a future start, or changes not yet published when the
			// current revision was read.
			return false
		}
		if prefix {
			return strings.HasPrefix(kv.Key, key)
		}
		return kv.Key == key
	}
	sent := start - 1 // every matching change up to sent has been sent
	if err := stream.Send(&pb.KVWatchResponse{Created: true, Revision: sent}); err != nil {
		return err
	}
	rights, _, _ := rightsOf(req)
	return s.watchLoop(ctx, stream, ring, cursor, sent, match, s.streamRights(ctx, "KVWatch", rights...))
}

// watchLoop sends the watch's events until ctx ends, or its caller loses
// the rights the watch needs (revoke.go): checked before every send, and
// whenever the ACLs change.
func (s *Server) watchLoop(ctx context.Context, stream pb.Tenure_KVWatchServer, ring *watchRing, cursor, sent uint64, match func(*kvEvent) bool, rights *streamRights) error {
	interval := s.limits.KV.WatchProgressInterval
	progress := time.NewTimer(interval)
	defer progress.Stop()
	wantProgress := false
	for {
		acl := s.hub.acl.changed()
		if err := rights.check(); err != nil {
			return toStatus(err)
		}
		evs, cur, through, caughtUp, notify, err := ring.read(cursor, sent+1, match)
		if err != nil {
			return toStatus(err)
		}
		cursor = cur
		if len(evs) > 0 {
			// The ACLs now hold every change committed before these
			// events (revoke.go).
			if err := rights.check(); err != nil {
				return toStatus(err)
			}
			for _, resp := range watchResponses(evs, max(through, sent)) {
				if err := stream.Send(resp); err != nil {
					return err
				}
				sent = resp.Revision
			}
			progress.Reset(interval)
			continue
		}
		sent = max(sent, through)
		if !caughtUp {
			continue
		}
		if wantProgress {
			wantProgress = false
			if err := stream.Send(&pb.KVWatchResponse{Progress: true, Revision: sent}); err != nil {
				return err
			}
			progress.Reset(interval)
		}
		select {
		case <-notify:
		case <-acl:
		case <-progress.C:
			wantProgress = true // after a fresh read: through moves without a notify
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// KVChange is one change of a key in the watch history, as the other APIs
// a node serves (the etcd API) read it.
type KVChange struct {
	// Put: the key was written; else deleted, and KV holds only its Key
	// and ModRevision (the revision of the delete).
	Put bool
	KV  fsm.KV
	// Prev is the key before the change; nil if it did not exist.
	Prev *fsm.KV
}

// KVCursor reads the watch history from a revision on, for the other APIs
// a node serves. It is not safe for concurrent use.
type KVCursor struct {
	ring   *watchRing
	cursor uint64
	start  uint64 // changes below it are skipped
	next   uint64 // the first revision the reader still needs
}

// WatchFrom returns a cursor at the first change at or after revision
// start (at least 1), or a *CompactedError when the history no longer goes
// back that far.
func (s *Server) WatchFrom(start uint64) (*KVCursor, error) {
	cursor, err := s.hub.kv.seek(start)
	if err != nil {
		return nil, err
	}
	return &KVCursor{ring: s.hub.kv, cursor: cursor, start: start, next: start}, nil
}

// Read returns the published changes after the cursor that match, in log
// order, and moves past them; it looks at a bounded number of changes
// and never splits a revision. through is the revision up to which the
// reader has seen every matching change once it has these; caughtUp says
// whether the cursor reached the end of what is published, and then
// notify is closed at the next publication. A cursor that fell out of
// the history (its reader was too slow) fails with a *CompactedError.
func (c *KVCursor) Read(match func(*KVChange) bool) (changes []KVChange, through uint64, caughtUp bool, notify <-chan struct{}, err error) {
	var ch KVChange
	evs, cur, through, caughtUp, notify, err := c.ring.read(c.cursor, c.next, func(ev *kvEvent) bool {
		if ev.kv.ModRevision < c.start {
			return false
		}
		ch = KVChange{Put: ev.put, KV: ev.kv, Prev: ev.prev}
		return match(&ch)
	})
	if err != nil {
		return nil, 0, false, nil, err
	}
	c.cursor = cur
	if len(evs) > 0 {
		changes = make([]KVChange, len(evs))
		for i := range evs {
			changes[i] = KVChange{Put: evs[i].put, KV: evs[i].kv, Prev: evs[i].prev}
		}
	}
	through = max(through, c.next-1)
	c.next = through + 1
	return changes, through, caughtUp, notify, nil
}

// KVUnchangedSince reports whether the watch history shows that no key
// changed after revision rev up to current: then the key-value store at
// rev is what it is at current. False when the history does not cover
// that span.
func (s *Server) KVUnchangedSince(rev, current uint64) bool {
	r := s.hub.kv
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.compactRev > rev || r.through < current {
		return false
	}
	return r.published == r.first || r.at(r.published-1).kv.ModRevision <= rev
}

// KVLimits are this node's key-value limits, defaults filled in.
func (s *Server) KVLimits() KVLimits { return s.limits.KV }

// TakeWatch reserves one of this node's watch slots (--max-watches, and
// --max-watches-per-connection for ctx's connection) for a watch of
// another API; release frees it. Past a limit it fails with ErrLimit.
func (s *Server) TakeWatch(ctx context.Context) (release func(), err error) {
	return s.watches.take(ctx)
}
