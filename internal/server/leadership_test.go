//go:build tenurefault

package server_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/clock"
	"github.com/tenure-io/tenure/internal/node"
	"github.com/tenure-io/tenure/internal/testutil"
)

// leadershipLog records every Leadership value one node publishes, by
// sequence number.
type leadershipLog struct {
	mu   sync.Mutex
	vals map[uint64]node.Leadership
}

func recordLeadership(n *node.Node) *leadershipLog {
	lg := &leadershipLog{vals: make(map[uint64]node.Leadership)}
	add := func(v node.Leadership) {
		lg.mu.Lock()
		lg.vals[v.Seq] = v
		lg.mu.Unlock()
	}
	n.OnLeadership(add)
	add(n.Leadership()) // published before the watcher, or again after it
	return lg
}

// window returns the values published from seq lo to hi; ok is false if
// one of them was never seen by the watcher.
func (lg *leadershipLog) window(lo, hi uint64) (vs []node.Leadership, ok bool) {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	for s := lo; s <= hi; s++ {
		v, found := lg.vals[s]
		if !found {
			return nil, false
		}
		vs = append(vs, v)
	}
	return vs, true
}

// leadershipSample is what every consumer of one node's leadership said
// between the publications lo and hi (read before and after), at wall
// times t0 and t1.
type leadershipSample struct {
	lo, hi uint64
	t0, t1 time.Time

	isLeader, serving, caughtUp, confirmed bool
	leader                                 string
	term                                   uint64
	lessorActs                             bool // SessionsTimeLeft's ok: the lessor acts

	health     *node.Health
	server     string // "serving", "not serving" or "" (not asked)
	serverCode codes.Code
}

// sampleLeadership asks every consumer of n's leadership in turn, until
// stop is closed: the node's predicates and its lessor each time, and
// every tenth time also its health and, over the wire, the server's
// serving check (a put bound to a session that does not exist: a serving
// server answers NOT_FOUND from its state, any other "not the leader").
func sampleLeadership(n *node.Node, api pb.TenureClient, stop <-chan struct{}) []leadershipSample {
	var out []leadershipSample
	tick := time.NewTicker(2 * time.Millisecond) // pacing only
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return out
		case <-tick.C:
		}
		s := leadershipSample{t0: time.Now(), lo: n.Leadership().Seq}
		s.isLeader = n.IsLeader()
		s.serving = n.Serving()
		s.caughtUp = n.CaughtUpLeader()
		s.confirmed = n.LeadershipConfirmed()
		s.leader = n.Leader()
		s.term = n.Term()
		_, s.lessorActs = n.SessionsTimeLeft(nil)
		if i%10 == 0 {
			h := n.Health()
			s.health = &h
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := api.KVPut(ctx, &pb.KVPutRequest{Key: "probe", Session: 1 << 60, SessionSecret: make([]byte, 32)})
			cancel()
			switch s.serverCode = status.Code(err); s.serverCode {
			case codes.NotFound:
				s.server = "serving"
			case codes.Unavailable:
				s.server = "not serving"
			default:
				s.server = fmt.Sprintf("unexpected answer %v", err)
			}
		}
		s.hi, s.t1 = n.Leadership().Seq, time.Now()
		out = append(out, s)
	}
}

// some reports whether one of vs satisfies ok.
func some(vs []node.Leadership, ok func(node.Leadership) bool) bool {
	for _, v := range vs {
		if ok(v) {
			return true
		}
	}
	return false
}

// checkSample returns what, in s, no value published in its window
// explains.
func checkSample(s leadershipSample, vs []node.Leadership) []string {
	var bad []string
	check := func(what string, ok func(node.Leadership) bool) {
		if !some(vs, ok) {
			bad = append(bad, what)
		}
	}
	check(fmt.Sprintf("IsLeader %v", s.isLeader), func(v node.Leadership) bool { return v.Leading == s.isLeader })
	check(fmt.Sprintf("Serving %v", s.serving), func(v node.Leadership) bool { return v.Serving() == s.serving })
	check(fmt.Sprintf("CaughtUpLeader %v", s.caughtUp), func(v node.Leadership) bool { return v.Serving() == s.caughtUp })
	check(fmt.Sprintf("LeadershipConfirmed %v", s.confirmed), func(v node.Leadership) bool {
		if s.confirmed {
			return v.Leading && v.LeaseUntil.After(s.t0)
		}
		return !v.Leading || !v.LeaseUntil.After(s.t1)
	})
	check(fmt.Sprintf("Leader %q", s.leader), func(v node.Leadership) bool { return v.Leader == s.leader })
	check(fmt.Sprintf("Term %d", s.term), func(v node.Leadership) bool { return v.Term == s.term })
	check(fmt.Sprintf("lessor acts %v", s.lessorActs), func(v node.Leadership) bool { return v.Serving() == s.lessorActs })
	if h := s.health; h != nil {
		check(fmt.Sprintf("health term %d leader %q leading %v caught up %v", h.Term, h.Leader, h.IsLeader, h.CaughtUp), func(v node.Leadership) bool {
			return v.Term == h.Term && v.Leader == h.Leader && v.Leading == h.IsLeader && (!h.IsLeader || !h.CaughtUp || v.Serving())
		})
	}
	switch s.server {
	case "", "serving", "not serving":
		if s.server != "" {
			check("server "+s.server, func(v node.Leadership) bool { return v.Serving() == (s.server == "serving") })
		}
	default:
		bad = append(bad, "server: "+s.server)
	}
	return bad
}

// TestEveryConsumerSeesThePublishedLeadership: leadership moves twice
// while clients lock and unlock (a leader is cut off from its peers, then
// healed; each member handles each change late), and every consumer of each node's leadership answers from a
// value the node published: the node's predicates, its lessor, its health
// and its server's serving check each answer as one of the values
// published while it was asked, never from a copy of its own that lags.
// The published values number every change, their terms never go back,
// a leading value names its node, and no two nodes name different leaders
// in one term.
func TestEveryConsumerSeesThePublishedLeadership(t *testing.T) {
	testutil.Slow(t)
	// Each member takes its time over each leadership change, as one
	// busy promoting does: a consumer that learned of changes there
	// would lag behind the published value.
	lc := startLinkedMembersFaults(t, 3, clock.Real, node.Faults{LeaderChangeDelay: 300 * time.Millisecond})
	logs := make([]*leadershipLog, len(lc.ms))
	for i, m := range lc.ms {
		logs[i] = recordLeadership(m.d.Node)
	}

	// Load: sessions locking and unlocking through every member.
	var eps []string
	for _, m := range lc.ms {
		eps = append(eps, m.d.Addr())
	}
	c := testutil.Dial(t, strings.Join(eps, ","))
	ctx, cancel := context.WithCancel(context.Background())
	var load sync.WaitGroup
	var cycles atomic.Int64
	defer func() { cancel(); load.Wait() }()
	for w := range 4 {
		load.Go(func() {
			for ctx.Err() == nil {
				sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
				s, err := c.NewSession(sctx)
				scancel()
				if err != nil {
					continue
				}
				m, _ := s.Mutex(fmt.Sprint("load-", w))
				for ctx.Err() == nil {
					lctx, lcancel := context.WithTimeout(ctx, 2*time.Second)
					h, err := m.Lock(lctx)
					if err == nil {
						err = h.Unlock(lctx)
					}
					lcancel()
					if err != nil {
						break
					}
					cycles.Add(1)
				}
				cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Second)
				_ = s.Close(cctx)
				ccancel()
			}
		})
	}

	stop := make(chan struct{})
	samples := make([][]leadershipSample, len(lc.ms))
	var sampling sync.WaitGroup
	for i, m := range lc.ms {
		// The node's own forward door: its serving check, never
		// forwarded to another member (forward.go).
		api := forwardAPI(t, m.d, m.id)
		sampling.Go(func() { samples[i] = sampleLeadership(m.d.Node, api, stop) })
	}

	moved := 0
	for round := range 2 {
		li := lc.leader(t)
		before := cycles.Load()
		testutil.WaitFor(t, "lock cycles under this leader", 30*time.Second, func() bool { return cycles.Load() > before+20 })
		lc.cut(li, false)
		testutil.WaitFor(t, fmt.Sprintf("round %d: another member serves", round), 30*time.Second, func() bool {
			for i, m := range lc.ms {
				if i != li && m.d.Node.Serving() {
					return true
				}
			}
			return false
		})
		testutil.WaitFor(t, fmt.Sprintf("round %d: the cut-off leader stops serving", round), 30*time.Second, func() bool { return !lc.ms[li].d.Node.Serving() })
		lc.cut(li, true)
		moved++
		before = cycles.Load()
		testutil.WaitFor(t, "lock cycles under the new leader", 30*time.Second, func() bool { return cycles.Load() > before+20 })
	}
	close(stop)
	sampling.Wait()
	cancel()
	load.Wait()
	t.Logf("leadership moved %d times; %d lock cycles", moved, cycles.Load())

	leaders := make(map[uint64]string) // term → the leader some node named
	for i, m := range lc.ms {
		lg := logs[i]
		lg.mu.Lock()
		var first uint64 = 1 << 63
		var last uint64
		for s := range lg.vals {
			first, last = min(first, s), max(last, s)
		}
		var prev node.Leadership
		for s := first; s <= last; s++ {
			v, ok := lg.vals[s]
			if !ok {
				t.Errorf("%s: publication %d (of %d..%d) not seen", m.id, s, first, last)
				continue
			}
			if s > first && v.Term < prev.Term {
				t.Errorf("%s: publication %d has term %d after term %d", m.id, s, v.Term, prev.Term)
			}
			if v.Leading && v.Leader != m.id {
				t.Errorf("%s: publication %d leads but names %q", m.id, s, v.Leader)
			}
			if v.BarrierApplied > v.Term {
				t.Errorf("%s: publication %d: barrier of term %d applied in term %d", m.id, s, v.BarrierApplied, v.Term)
			}
			if v.Leader != "" {
				if l, ok := leaders[v.Term]; ok && l != v.Leader {
					t.Errorf("term %d has two leaders: %s and %s", v.Term, l, v.Leader)
				}
				leaders[v.Term] = v.Leader
			}
			prev = v
		}
		lg.mu.Unlock()
		servedTerms := 0
		for s := first; s <= last; s++ {
			if v := lg.vals[s]; v.Serving() && (s == first || !lg.vals[s-1].Serving()) {
				servedTerms++
			}
		}
		t.Logf("%s: %d values published (seq %d..%d), served %d times, %d samples", m.id, last-first+1, first, last, servedTerms, len(samples[i]))

		var lastTerm uint64
		reported := 0
		for _, s := range samples[i] {
			if s.term < lastTerm {
				t.Errorf("%s: Term went back from %d to %d", m.id, lastTerm, s.term)
			}
			lastTerm = s.term
			vs, ok := lg.window(s.lo, s.hi)
			if !ok {
				t.Errorf("%s: a publication of %d..%d was not seen", m.id, s.lo, s.hi)
				continue
			}
			if bad := checkSample(s, vs); len(bad) > 0 && reported < 10 {
				reported++
				t.Errorf("%s: asked between publications %d and %d (%+v), no published value explains %s", m.id, s.lo, s.hi, vs, strings.Join(bad, ", "))
			}
		}
	}
	// Both changes were seen as published values: at least three terms
	// had a leader.
	if len(leaders) < 3 {
		t.Errorf("published leaders by term: %v; want at least 3 terms", leaders)
	}
}
