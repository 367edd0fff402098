package etcdapi

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sort"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/server"
)

// Watch ids etcd reserves: a request for id 0 lets the server choose; -1
// answers a request that created no watcher, and a progress report on
// behalf of every watcher of a stream.
const (
	autoWatchID    = 0
	invalidWatchID = -1
)

// Cancel reasons etcd gives when it refuses to create a watcher.
const (
	reasonEmptyRange  = "mvcc: watcher range is empty"
	reasonDuplicateID = "mvcc: duplicate watch ID provided on the WatchStream"
)

// watchServer is etcd's Watch service.
type watchServer struct {
	pb.UnimplementedWatchServer
	s *Server
}

// watcher is one watcher of a stream.
type watcher struct {
	id       int64
	key, end []byte // end in etcd's convention (nil: key alone; "\x00": from key on)
	start    uint64 // the revision asked for (0: the current one + 1)
	noPut    bool
	noDelete bool
	prevKV   bool
	progress bool // progress_notify
	fragment bool
	// cursor reads the node's watch history; nil while the watcher
	// replays the state machine's history window instead (replay).
	cursor  *server.KVCursor
	release func()
	// caughtUp: the last read reached the end of the published history;
	// through: every matching change up to it has been sent.
	caughtUp bool
	through  uint64
	// sent: events were sent since the last progress tick.
	sent bool
}

func (w *watcher) match(c *server.KVChange) bool {
	if (c.Put && w.noPut) || (!c.Put && w.noDelete) {
		return false
	}
	k := []byte(c.KV.Key)
	switch {
	case len(w.end) == 0:
		return bytes.Equal(k, w.key)
	case len(w.end) == 1 && w.end[0] == 0:
		return bytes.Compare(k, w.key) >= 0
	}
	return bytes.Compare(k, w.key) >= 0 && bytes.Compare(k, w.end) < 0
}

// watchStream serves one Watch stream: a goroutine receives the requests
// and hands them, in order, to the stream's loop, which creates and
// cancels watchers and sends every response, so that answers keep the
// order of the requests and a watcher's events follow its creation.
type watchStream struct {
	s      *Server
	stream pb.Watch_WatchServer
	// cred is the caller's credential, read when the stream opened and
	// checked again against the node's current ACLs before every
	// delivery and every revokeCheckInterval (allowed).
	cred     credential
	ctrl     chan *pb.WatchRequest
	watchers map[int64]*watcher
	nextID   int64
	// progressAsked: a ProgressRequest waits for every watcher to catch up.
	progressAsked bool
}

// Watch implements etcd's Watch.Watch.
func (ws *watchServer) Watch(stream pb.Watch_WatchServer) error {
	ctx := stream.Context()
	cred := credentialOf(ctx)
	if err := ws.s.authorizeCred(ctx, cred, "Watch/Watch"); err != nil {
		return err // no credential, or one the ACLs do not know
	}
	st := &watchStream{s: ws.s, stream: stream, cred: cred, ctrl: make(chan *pb.WatchRequest, 16), watchers: make(map[int64]*watcher)}
	defer st.closeAll()
	recvDone := make(chan error, 1)
	go func() { recvDone <- st.recv(ctx) }()
	err := st.loop(ctx, recvDone)
	if errors.Is(err, context.Canceled) {
		return rpctypes.ErrGRPCWatchCanceled
	}
	return err
}

// recv hands the stream's requests to the loop until the client stops
// sending (io.EOF: the loop goes on serving the watchers) or the stream
// breaks.
func (st *watchStream) recv(ctx context.Context) error {
	for {
		req, err := st.stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		select {
		case st.ctrl <- req:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (st *watchStream) closeAll() {
	for _, w := range st.watchers {
		w.release()
	}
}

func (st *watchStream) send(resp *pb.WatchResponse) error { return st.stream.Send(resp) }

// loop serves the stream until it ends.
func (st *watchStream) loop(ctx context.Context, recvDone <-chan error) error {
	interval := st.s.limits.WatchProgressInterval
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	// aclChanged closes at the next change of the node's ACLs: the
	// watchers' rights are checked again then (each event is checked as it
	// is sent, in pump).
	aclChanged := st.s.srv.ACLChanged()
	for {
		// Requests first, without waiting.
		for drained := false; !drained; {
			select {
			case req := <-st.ctrl:
				if err := st.handle(req); err != nil {
					return err
				}
			default:
				drained = true
			}
		}
		notify, busy, err := st.pump()
		if err != nil {
			return err
		}
		if st.progressAsked && !busy {
			st.progressAsked = false
			if err := st.progressAll(); err != nil {
				return err
			}
		}
		if busy {
			continue // more history to send
		}
		select {
		case req := <-st.ctrl:
			if err := st.handle(req); err != nil {
				return err
			}
		case <-notify:
		case <-ticker.C:
			if err := st.tick(); err != nil {
				return err
			}
		case <-aclChanged:
			aclChanged = st.s.srv.ACLChanged() // first, so that no change is missed
			for _, w := range st.sortedWatchers() {
				if err := st.allowed(w); err != nil {
					return err
				}
			}
		case err := <-recvDone:
			if err != nil {
				return err
			}
			recvDone = nil // the client sends no more requests; the watchers go on
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// sortedWatchers returns the stream's watchers by id.
func (st *watchStream) sortedWatchers() []*watcher {
	ws := make([]*watcher, 0, len(st.watchers))
	for _, w := range st.watchers {
		ws = append(ws, w)
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i].id < ws[j].id })
	return ws
}

// pump sends each watcher what the history holds for it (one bounded
// read each). busy: some watcher has more to read; notify: the channel
// closed at the next publication (nil with no watchers).
func (st *watchStream) pump() (notify <-chan struct{}, busy bool, err error) {
	for _, w := range st.sortedWatchers() {
		if w.cursor == nil {
			if err := st.replay(w); err != nil {
				return nil, false, err
			}
			busy = true // read again: from the window, or from the watch history (which gives the channel to wait on)
			continue
		}
		changes, through, caughtUp, n, err := w.cursor.Read(w.match)
		var ce *server.CompactedError
		if errors.As(err, &ce) && st.s.inWindow(w.through+1) {
			w.cursor, busy = nil, true // the node's history lost it (a restore): the window has it
			continue
		}
		if errors.As(err, &ce) {
			if err := st.compacted(w, ce); err != nil {
				return nil, false, err
			}
			continue
		}
		if err != nil {
			return nil, false, err
		}
		w.caughtUp, w.through = caughtUp, through
		if caughtUp {
			notify = n
		} else {
			busy = true
		}
		if len(changes) == 0 {
			continue
		}
		if err := st.allowed(w); err != nil {
			return nil, false, err
		}
		if err := st.sendEvents(w, changes, through); err != nil {
			return nil, false, err
		}
	}
	return notify, busy, nil
}

// allowed checks that the stream's caller may still read w's span: the
// ACLs this node holds when it delivers changes up to a revision include
// every ACL change committed before it, so a change written after a
// revocation is never delivered. A denial ends the stream with
// "permission denied".
func (st *watchStream) allowed(w *watcher) error {
	return st.s.stillAllowed(st.stream.Context(), st.cred, "Watch/Watch", spanRight(w.key, w.end, fsm.AccessRead))
}

// compacted ends a watcher whose history is gone, as etcd does: a
// response with the compact revision (the oldest revision a watch can
// start from again), cancelled, whose header carries no revision.
func (st *watchStream) compacted(w *watcher, ce *server.CompactedError) error {
	st.remove(w)
	hdr := st.s.header(0)
	hdr.Revision = 0
	return st.send(&pb.WatchResponse{Header: hdr, WatchId: w.id, CompactRevision: int64(ce.CompactRevision + 1), Canceled: true})
}

func (st *watchStream) remove(w *watcher) {
	w.release()
	delete(st.watchers, w.id)
}

// event is c as etcd sends it to w. etcd reads an event's previous key at
// the revision before it when it sends it: once that revision is
// compacted (before compactRev; 0: no history kept) the event has none.
func event(w *watcher, c *server.KVChange, compactRev uint64) *mvccpb.Event {
	ev := &mvccpb.Event{Type: mvccpb.PUT, Kv: keyValue(&c.KV)}
	if !c.Put {
		ev.Type = mvccpb.DELETE
		ev.Kv = &mvccpb.KeyValue{Key: []byte(c.KV.Key), ModRevision: int64(c.KV.ModRevision)}
	}
	if w.prevKV && c.Prev != nil && c.KV.ModRevision-1 >= compactRev {
		ev.PrevKv = keyValue(c.Prev)
	}
	return ev
}

func (st *watchStream) sendEvents(w *watcher, changes []server.KVChange, through uint64) error {
	resp := &pb.WatchResponse{Header: st.s.header(through), WatchId: w.id, Events: make([]*mvccpb.Event, len(changes))}
	var compactRev uint64
	if w.prevKV {
		compactRev = st.s.compactRevision()
	}
	for i := range changes {
		resp.Events[i] = event(w, &changes[i], compactRev)
	}
	w.sent = true
	if !w.fragment {
		return sendByRevision(resp, st.send)
	}
	return sendFragments(resp, st.send)
}

// sendByRevision sends a response of several revisions' events above
// maxRequestBytes as several, each of whole revisions, as etcd sends a
// response per revision: values up to --max-value-len then reach a client
// with gRPC's default 4 MiB receive limit (one revision's events stay in
// one response).
func sendByRevision(wr *pb.WatchResponse, send func(*pb.WatchResponse) error) error {
	if len(wr.Events) < 2 || proto.Size(wr) < maxRequestBytes {
		return send(wr)
	}
	evs := wr.Events
	size := 0
	start := 0
	for i, ev := range evs {
		if i > start && size >= maxRequestBytes/2 && ev.Kv.ModRevision != evs[i-1].Kv.ModRevision {
			if err := send(&pb.WatchResponse{Header: wr.Header, WatchId: wr.WatchId, Events: evs[start:i]}); err != nil {
				return err
			}
			start, size = i, 0
		}
		size += proto.Size(ev)
	}
	return send(&pb.WatchResponse{Header: wr.Header, WatchId: wr.WatchId, Events: evs[start:]})
}

// sendFragments is etcd's: a response above maxRequestBytes with more
// than one event goes in several, all but the last marked as fragments.
func sendFragments(wr *pb.WatchResponse, send func(*pb.WatchResponse) error) error {
	if proto.Size(wr) < maxRequestBytes || len(wr.Events) < 2 {
		return send(wr)
	}
	idx := 0
	for {
		cur := &pb.WatchResponse{Header: wr.Header, WatchId: wr.WatchId, Created: wr.Created, Canceled: wr.Canceled,
			CompactRevision: wr.CompactRevision, CancelReason: wr.CancelReason, Fragment: true, Events: make([]*mvccpb.Event, 0)}
		for _, ev := range wr.Events[idx:] {
			cur.Events = append(cur.Events, ev)
			if len(cur.Events) > 1 && proto.Size(cur) >= maxRequestBytes {
				cur.Events = cur.Events[:len(cur.Events)-1]
				break
			}
			idx++
		}
		if idx == len(wr.Events) {
			cur.Fragment = false
		}
		if err := send(cur); err != nil {
			return err
		}
		if !cur.Fragment {
			return nil
		}
	}
}

// handle serves one request of the stream.
func (st *watchStream) handle(req *pb.WatchRequest) error {
	switch r := req.RequestUnion.(type) {
	case *pb.WatchRequest_CreateRequest:
		if r.CreateRequest != nil {
			return st.create(r.CreateRequest)
		}
	case *pb.WatchRequest_CancelRequest:
		if r.CancelRequest == nil {
			return nil
		}
		w, ok := st.watchers[r.CancelRequest.WatchId]
		if !ok {
			return nil // etcd answers nothing
		}
		st.remove(w)
		return st.send(&pb.WatchResponse{Header: st.s.header(0), WatchId: w.id, Canceled: true})
	case *pb.WatchRequest_ProgressRequest:
		if r.ProgressRequest != nil {
			st.progressAsked = true
		}
	}
	return nil
}

// refuse answers a create request that made no watcher.
func (st *watchStream) refuse(reason string) error {
	return st.send(&pb.WatchResponse{Header: st.s.header(0), WatchId: invalidWatchID, Created: true, Canceled: true, CancelReason: reason})
}

func (st *watchStream) create(c *pb.WatchCreateRequest) error {
	key, end := c.Key, c.RangeEnd
	if len(key) == 0 {
		key = []byte{0} // the smallest key
	}
	if c.StartRevision < 0 {
		return st.refuse(rpctypes.ErrCompacted.Error())
	}
	if len(end) > 0 && !(len(end) == 1 && end[0] == 0) && bytes.Compare(key, end) >= 0 {
		return st.refuse(reasonEmptyRange)
	}
	if err := st.s.authorizeCred(st.stream.Context(), st.cred, "Watch/Watch", spanRight(key, end, fsm.AccessRead)); err != nil {
		if s, ok := status.FromError(err); ok && s.Code() == codes.PermissionDenied {
			return st.refuse(rpctypes.ErrGRPCPermissionDenied.Error()) // as etcd refuses a watch
		}
		return err
	}
	id := c.WatchId
	if id == autoWatchID {
		for st.watchers[st.nextID] != nil {
			st.nextID++
		}
		id = st.nextID
		st.nextID++
	} else if st.watchers[id] != nil {
		return st.refuse(reasonDuplicateID)
	}
	release, err := st.s.srv.TakeWatch(st.stream.Context())
	if err != nil {
		return st.refuse("etcdserver: " + err.Error())
	}
	w := &watcher{id: id, key: key, end: end, start: uint64(c.StartRevision), prevKV: c.PrevKv, progress: c.ProgressNotify, fragment: c.Fragment, release: release}
	for _, f := range c.Filters {
		switch f {
		case pb.WatchCreateRequest_NOPUT:
			w.noPut = true
		case pb.WatchCreateRequest_NODELETE:
			w.noDelete = true
		}
	}
	var current, compactRev uint64
	st.s.front.Read(func(s *fsm.State) {
		current = s.Revision()
		if s.KVHistoryKept() {
			compactRev = s.KVCompactRevision()
		}
	})
	from := w.start
	if from == 0 {
		from = current + 1
	}
	if err := st.send(&pb.WatchResponse{Header: st.s.header(current), WatchId: id, Created: true}); err != nil {
		release()
		return err
	}
	if from < compactRev { // before the history window: etcd's answer
		st.watchers[id] = w
		return st.compacted(w, &server.CompactedError{CompactRevision: compactRev - 1})
	}
	cursor, err := st.s.srv.WatchFrom(from)
	var ce *server.CompactedError
	if errors.As(err, &ce) && compactRev > 0 {
		// Older than this node's watch history, inside the window: the
		// watcher replays the window first (replay).
		w.through = from - 1
		st.watchers[id] = w
		return nil
	}
	if errors.As(err, &ce) {
		st.watchers[id] = w
		return st.compacted(w, ce)
	}
	if err != nil {
		release()
		return err
	}
	w.cursor, w.through = cursor, from-1
	st.watchers[id] = w
	return nil
}

// progressAll answers a ProgressRequest once every watcher has caught up,
// with one response on behalf of all (watch id -1) at the revision they
// all reached, as etcd does; a stream without watchers, or with one that
// waits for a future revision, gets none.
func (st *watchStream) progressAll() error {
	if len(st.watchers) == 0 {
		return nil
	}
	rev := ^uint64(0)
	for _, w := range st.watchers {
		if w.start > w.through+1 && w.start != 0 {
			return nil
		}
		rev = min(rev, w.through)
	}
	return st.send(&pb.WatchResponse{Header: st.s.header(rev), WatchId: invalidWatchID})
}

// tick sends the periodic progress reports (progress_notify) to the
// caught-up watchers that sent nothing since the last tick.
func (st *watchStream) tick() error {
	for _, w := range st.sortedWatchers() {
		if w.progress && !w.sent && w.caughtUp && (w.start == 0 || w.through+1 >= w.start) {
			if err := st.send(&pb.WatchResponse{Header: st.s.header(w.through), WatchId: w.id}); err != nil {
				return err
			}
		}
		w.sent = false
	}
	return nil
}

// replayBatch bounds the changes one replay step reads under the state's
// lock (it goes on to the end of a revision).
const replayBatch = 1024

// replay sends a watcher that needs changes older than this node's watch
// history what the state machine's history window holds (one bounded
// read), then moves it to the watch history once that holds the next
// revision it needs. A watcher whose revision the window lost too (it
// was compacted meanwhile) is answered "compacted", as etcd answers it.
func (st *watchStream) replay(w *watcher) error {
	var changes []fsm.KVChange
	var through, compactRev uint64
	var err error
	st.s.front.Read(func(s *fsm.State) {
		changes, through, err = s.KVChangesFrom(w.through+1, replayBatch)
		compactRev = s.KVCompactRevision()
	})
	if errors.Is(err, fsm.ErrCompactedRevision) {
		return st.compacted(w, &server.CompactedError{CompactRevision: max(compactRev, 1) - 1})
	}
	if err != nil {
		return err
	}
	var out []server.KVChange
	for i := range changes {
		c := server.KVChange{Put: changes[i].Put, KV: changes[i].KV, Prev: changes[i].Prev}
		if w.match(&c) {
			out = append(out, c)
		}
	}
	if len(out) > 0 {
		if err := st.allowed(w); err != nil {
			return err
		}
		if err := st.sendEvents(w, out, through); err != nil {
			return err
		}
	}
	w.through, w.caughtUp = through, false
	if cursor, err := st.s.srv.WatchFrom(through + 1); err == nil {
		w.cursor = cursor
	}
	return nil
}

// inWindow reports whether the history window holds the changes from
// revision rev on.
func (s *Server) inWindow(rev uint64) bool {
	c := s.compactRevision()
	return c > 0 && rev >= c
}
