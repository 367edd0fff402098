package server

import (
	"context"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/dashboard"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/node"
	"github.com/tenure-io/tenure/internal/version"
)

// The dashboard's view of this node (dashboard.Source): the node's own
// state, read locally (it may lag the leader's by what it has not applied
// yet), dated by the hub's revision clock. With --auth every answer is
// the caller's (httpauth.go): a listing holds only the names the caller
// may read (and is refused if it may read none of its kind), a view of
// one lock or queue needs read on it, the cluster's view cluster read,
// and a requeue is the API's QueueDeadRequeue, checked, counted and
// logged as the API's.

// Dashboard is this server as the dashboard's source.
func (s *Server) Dashboard() dashboard.Source { return dashSource{s} }

type dashSource struct{ s *Server }

// dashWaiters bounds the waiters of one lock the dashboard lists.
const dashWaiters = 100

func (d dashSource) ms(rev uint64, now time.Time) int64 {
	return now.Sub(d.s.hub.clock.when(rev)).Milliseconds()
}

// httpError is an error answered with the HTTP status HTTPStatus gives.
type httpError struct{ err error }

func (e httpError) Error() string   { return e.err.Error() }
func (e httpError) Unwrap() error   { return e.err }
func (e httpError) HTTPStatus() int { return HTTPStatus(e.err) }

// dashErr makes err a dashboard.StatusError (nil stays nil).
func dashErr(err error) error {
	if err == nil {
		return nil
	}
	return httpError{err}
}

// Cluster implements dashboard.Source: it needs cluster read.
func (d dashSource) Cluster(ctx context.Context) (dashboard.Cluster, error) {
	if _, err := d.s.accessHTTP(ctx, "HTTP GET /api/cluster", clusterRead); err != nil {
		return dashboard.Cluster{}, dashErr(err)
	}
	st := d.s.node.Status()
	h := d.s.node.Health()
	out := dashboard.Cluster{Node: st.Node, Leader: h.Leader, Term: st.Term, CommitIndex: h.CommitIndex, AppliedIndex: h.AppliedIndex,
		Revision: st.Revision, Voters: st.Voters, Ready: h.Ready(), NotReady: h.Reason(), Version: version.String(), Members: []dashboard.Member{}}
	ms, err := d.s.members(ctx) // the member list's own view
	if err != nil {
		return dashboard.Cluster{}, dashErr(err)
	}
	out.View = ms.GetView()
	for _, m := range ms.GetMembers() {
		out.Members = append(out.Members, dashboard.Member{ID: m.GetId(), PeerAddr: m.GetPeerAddr(), Voter: m.GetVoter(), Leader: m.GetLeader(),
			Reachable: m.GetReachable(), LastContactMs: m.GetLastContactMs(), MatchIndex: m.GetMatchIndex(), Lag: m.GetLag(), Version: memberVersion(m)})
	}
	if out.View != "" {
		var hs []node.MemberHealth
		for _, m := range out.Members {
			hs = append(hs, node.MemberHealth{Member: node.Member{ID: m.ID}, Reachable: m.Reachable})
		}
		out.Degraded = node.Degraded(hs)
	}
	d.s.node.Read(func(s *fsm.State) {
		t := s.Totals()
		out.Summary = dashboard.Summary{Locks: t.Locks, Held: t.Held, Waiters: t.Waiters, Delayed: t.Delayed, Sessions: t.Sessions, Queues: t.Queues}
		s.EachQueue(func(q fsm.QueueSizes) {
			out.Summary.Ready += q.Ready
			out.Summary.InFlight += q.InFlight
			out.Summary.Dead += q.Dead
		})
	})
	return out, nil
}

// memberVersion is member m's release and protocol as text ("" if it
// did not answer).
func memberVersion(m *pb.Member) string {
	switch {
	case m.GetProtocol() == 0:
		return ""
	case m.GetVersion() == "":
		return "protocol " + strconv.FormatUint(uint64(m.GetProtocol()), 10)
	}
	return m.GetVersion() + " (protocol " + strconv.FormatUint(uint64(m.GetProtocol()), 10) + ")"
}

// lockLocked describes the lock of summary l; the state's read lock is held.
func (d dashSource) lockLocked(st *fsm.State, l fsm.LockSummary, now time.Time) dashboard.Lock {
	out := dashboard.Lock{Name: l.Name, Kind: l.Kind, Permits: l.Permits, WaiterCount: l.Waiters, DelayMs: l.DelayMs, Holders: []dashboard.Holder{}, Waiters: []dashboard.Waiter{}}
	for h := range st.LockHolders(l.Name, 0) {
		mode := "exclusive"
		switch {
		case h.Shared:
			mode = "shared"
		case l.Permits > 1:
			mode = "permit"
		}
		out.Holders = append(out.Holders, dashboard.Holder{Owner: h.Owner, Session: h.Session, Token: h.Token, Mode: mode, HeldMs: d.ms(h.Token, now)})
		if len(out.Holders) == maxListedHolders {
			break
		}
	}
	for w := range st.LockWaiters(l.Name, 0) {
		out.Waiters = append(out.Waiters, dashboard.Waiter{Owner: w.Owner, Session: w.Session, QueuedRevision: w.AcquireRevision, Shared: w.Shared, WaitMs: d.ms(w.AcquireRevision, now)})
		if len(out.Waiters) == dashWaiters {
			break
		}
	}
	return out
}

// Locks implements dashboard.Source: the locks under prefix the caller
// may read (looking through at most dashScan).
func (d dashSource) Locks(ctx context.Context, prefix string, limit int) (out []dashboard.Lock, more bool, err error) {
	a, err := d.s.listHTTP(ctx, "HTTP GET /api/locks", fsm.KindLock)
	if err != nil {
		return nil, false, dashErr(err)
	}
	out = []dashboard.Lock{}
	now := time.Now()
	d.s.node.Read(func(st *fsm.State) {
		scanned := 0
		for l := range st.Locks(prefix, "") {
			if scanned++; scanned > dashScan {
				more = true
				break
			}
			if !a.can(fsm.KindLock, l.Name) {
				continue
			}
			if len(out) == limit {
				more = true
				break
			}
			out = append(out, d.lockLocked(st, l, now))
		}
	})
	return out, more, nil
}

// Lock implements dashboard.Source: it needs lock read on name.
func (d dashSource) Lock(ctx context.Context, name string) (l dashboard.Lock, grants []dashboard.Grant, err error) {
	if _, err := d.s.accessHTTP(ctx, "HTTP GET /api/lock", read(fsm.KindLock, name)); err != nil {
		return l, nil, dashErr(err)
	}
	now := time.Now()
	var hist []fsm.GrantView
	d.s.node.Read(func(st *fsm.State) {
		l = d.lockLocked(st, st.LockSummary(name), now)
		hist = st.History(name)
	})
	grants = []dashboard.Grant{}
	for _, g := range hist {
		gr := dashboard.Grant{Owner: g.Owner, Session: g.Session, Token: g.Token, GrantedRevision: g.GrantedRevision, Ended: g.Ended, EndedRevision: g.EndedRevision,
			At: d.s.hub.clock.when(g.GrantedRevision).UnixMilli()}
		if g.Ended != "held" {
			gr.EndedAt = d.s.hub.clock.when(g.EndedRevision).UnixMilli()
		}
		grants = append(grants, gr)
	}
	return l, grants, nil
}

// readable returns the names of names the caller may read as locks.
func (a httpAccess) readable(names []string) []string {
	if !a.on {
		return names
	}
	out := make([]string, 0, len(names))
	for _, n := range names {
		if a.can(fsm.KindLock, n) {
			out = append(out, n)
		}
	}
	return out
}

// Sessions implements dashboard.Source: the sessions whose owner the
// caller may read as a session, with the locks they hold and wait for
// that it may read as locks (looking through at most dashScan).
func (d dashSource) Sessions(ctx context.Context, limit int) (out []dashboard.Session, more bool, err error) {
	a, err := d.s.listHTTP(ctx, "HTTP GET /api/sessions", fsm.KindSession)
	if err != nil {
		return nil, false, dashErr(err)
	}
	out = []dashboard.Session{}
	d.s.node.Read(func(st *fsm.State) {
		scanned := 0
		for v := range st.SessionsAfter(0, 20) {
			if scanned++; scanned > dashScan {
				more = true
				break
			}
			if !a.can(fsm.KindSession, v.Owner) {
				continue
			}
			if len(out) == limit {
				more = true
				break
			}
			out = append(out, dashboard.Session{ID: v.ID, Owner: v.Owner, TTLMs: v.TTLMs, TimeLeftMs: -1, Held: a.readable(v.Held), Waiting: a.readable(v.Waiting), HeldCount: v.HeldCount, WaitCount: v.WaitingCount})
		}
	})
	ids := make([]uint64, len(out))
	for i, v := range out {
		ids[i] = v.ID
	}
	if left, ok := d.s.node.SessionsTimeLeft(ids); ok {
		for i, l := range left {
			if l >= 0 {
				out[i].TimeLeftMs = l.Milliseconds()
			}
		}
	}
	return out, more, nil
}

// Queues implements dashboard.Source: the queues the caller may read.
func (d dashSource) Queues(ctx context.Context, limit int) ([]dashboard.Queue, bool, error) {
	a, err := d.s.listHTTP(ctx, "HTTP GET /api/queues", fsm.KindQueue)
	if err != nil {
		return nil, false, dashErr(err)
	}
	var sizes []fsm.QueueSizes
	d.s.node.Read(func(st *fsm.State) {
		st.EachQueue(func(q fsm.QueueSizes) {
			if a.can(fsm.KindQueue, q.Name) {
				sizes = append(sizes, q)
			}
		})
	})
	sort.Slice(sizes, func(i, j int) bool { return sizes[i].Name < sizes[j].Name })
	out := []dashboard.Queue{}
	now := time.Now()
	for _, q := range sizes {
		if len(out) == limit {
			return out, true, nil
		}
		age := int64(-1)
		if q.OldestReady != 0 {
			age = d.ms(q.OldestReady, now)
		}
		out = append(out, dashboard.Queue{Name: q.Name, Ready: q.Ready, InFlight: q.InFlight, Dead: q.Dead, OldestReadyMs: age})
	}
	return out, false, nil
}

// previewBytes bounds a dead letter's payload shown.
const previewBytes = 120

// DeadLetters implements dashboard.Source: it needs queue read on queue.
func (d dashSource) DeadLetters(ctx context.Context, queue string, limit int) (out []dashboard.DeadLetter, more bool, err error) {
	if _, err := d.s.accessHTTP(ctx, "HTTP GET /api/dead", read(fsm.KindQueue, queue)); err != nil {
		return nil, false, dashErr(err)
	}
	out = []dashboard.DeadLetter{}
	d.s.node.Read(func(st *fsm.State) {
		for it := range st.DeadLetters(queue, 0) {
			if len(out) == limit {
				more = true
				break
			}
			p := it.Payload[:min(len(it.Payload), previewBytes)]
			preview := string(p)
			if !utf8.Valid(p) {
				preview = "(binary)"
			}
			out = append(out, dashboard.DeadLetter{ID: it.ID, Attempts: it.Attempts, Size: len(it.Payload), Preview: preview})
		}
	})
	return out, more, nil
}

// Requeue implements dashboard.Source: the API's QueueDeadRequeue, with
// its rights (queue write), its metrics and its refusal log (callHTTP).
func (d dashSource) Requeue(ctx context.Context, queue string, ids []uint64) (int, error) {
	if len(ids) > fsm.MaxRequeueBatch {
		ids = ids[:fsm.MaxRequeueBatch]
	}
	req := &pb.QueueDeadRequeueRequest{Queue: queue, Ids: ids}
	var resp *pb.QueueDeadRequeueResponse
	err := d.s.callHTTP(ctx, "QueueDeadRequeue", req, func() (err error) {
		resp, err = d.s.QueueDeadRequeue(ctx, req)
		return err
	})
	if err != nil {
		return 0, dashErr(err)
	}
	return int(resp.GetRequeued()), nil
}

// dashScan bounds the locks the elections page looks through.
const dashScan = 100_000

// Elections implements dashboard.Source: the elections the caller may
// read as locks.
func (d dashSource) Elections(ctx context.Context, limit int) (out []dashboard.Election, more bool, err error) {
	a, err := d.s.listHTTP(ctx, "HTTP GET /api/elections", fsm.KindLock)
	if err != nil {
		return nil, false, dashErr(err)
	}
	out = []dashboard.Election{}
	d.s.node.Read(func(st *fsm.State) {
		scanned := 0
		for l := range st.Locks("", "") {
			if scanned++; scanned > dashScan {
				more = true
				break
			}
			if l.Kind != fsm.KindElection || !a.can(fsm.KindLock, l.Name) {
				continue
			}
			if len(out) == limit {
				more = true
				break
			}
			e := dashboard.Election{Name: l.Name}
			for h := range st.LockHolders(l.Name, 0) {
				e.Leader, e.Session, e.Epoch, e.Value = h.Owner, h.Session, h.Token, string(h.Value)
				break
			}
			out = append(out, e)
		}
	})
	return out, more, nil
}

// Changes implements dashboard.Source: any caller the cluster knows may
// follow the revision.
func (d dashSource) Changes(ctx context.Context) (<-chan uint64, func(), error) {
	if err := d.Allowed(ctx); err != nil {
		return nil, nil, err
	}
	// A batch applied between the revision read here and the
	// subscription is not published to it; the reader's first event makes
	// it read the state, which has that batch.
	ch, stop := d.s.hub.changes.subscribe(d.s.node.Status().Revision)
	return ch, stop, nil
}

// Allowed implements dashboard.Source.
func (d dashSource) Allowed(ctx context.Context) error {
	return dashErr(d.s.AuthorizeHTTP(ctx, "HTTP GET /api/events", HTTPKnownCaller))
}

// changeFeed tells subscribers the state's revision after each applied
// batch, coalesced: each has a buffer of one holding the latest. Safe for
// concurrent use; with no subscriber a batch costs one atomic load.
type changeFeed struct {
	n atomic.Int32 // subscribers
	// mu guards subs.
	mu   sync.Mutex
	subs map[chan uint64]struct{}
}

// subscribe adds a subscriber whose channel holds rev at once (the
// revision its reader starts from), until a publish replaces it.
func (f *changeFeed) subscribe(rev uint64) (<-chan uint64, func()) {
	ch := make(chan uint64, 1)
	ch <- rev
	f.mu.Lock()
	if f.subs == nil {
		f.subs = make(map[chan uint64]struct{})
	}
	f.subs[ch] = struct{}{}
	f.n.Add(1)
	f.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			f.mu.Lock()
			delete(f.subs, ch)
			f.n.Add(-1)
			f.mu.Unlock()
		})
	}
}

// publish tells every subscriber the state is at rev; it never blocks.
func (f *changeFeed) publish(rev uint64) {
	if f.n.Load() == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for ch := range f.subs {
		f.sendLocked(ch, rev)
	}
}

// sendLocked replaces what ch has not read with rev; f.mu is held.
func (f *changeFeed) sendLocked(ch chan uint64, rev uint64) {
	select {
	case <-ch: // replace what it has not read with the latest
	default:
	}
	select {
	case ch <- rev:
	default:
	}
}
