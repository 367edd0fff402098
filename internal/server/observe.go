package server

import (
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/metrics"
	"github.com/tenure-io/tenure/internal/version"
)

// Sample reads what the metrics expose of the state and the node (see
// metrics.Source): the state's totals and counters, the sizes of the
// first maxQueues queues by name with the others summed, the open
// watches and raft's view. It holds the state's read lock for O(queues).
func (s *Server) Sample(maxQueues int) metrics.Sample {
	var out metrics.Sample
	var queues []fsm.QueueSizes
	s.node.Read(func(st *fsm.State) {
		out.Totals, out.Counters = st.Totals(), st.Counters()
		st.EachQueue(func(q fsm.QueueSizes) { queues = append(queues, q) })
	})
	sort.Slice(queues, func(i, j int) bool { return queues[i].Name < queues[j].Name })
	now := time.Now()
	age := func(oldest uint64) time.Duration {
		if oldest == 0 {
			return -1
		}
		return now.Sub(s.hub.clock.when(oldest))
	}
	for i, q := range queues {
		if i < maxQueues {
			out.Queues = append(out.Queues, metrics.QueueSample{Name: q.Name, Ready: q.Ready, InFlight: q.InFlight, Dead: q.Dead, OldestReadyAge: age(q.OldestReady)})
			continue
		}
		if i == maxQueues {
			out.Queues = append(out.Queues, metrics.QueueSample{OldestReadyAge: -1})
		}
		rest := &out.Queues[len(out.Queues)-1]
		rest.Ready += q.Ready
		rest.InFlight += q.InFlight
		rest.Dead += q.Dead
		if a := age(q.OldestReady); a > rest.OldestReadyAge {
			rest.OldestReadyAge = a
		}
	}
	out.Watchers = s.watches.open()
	r := s.node.RaftStats()
	out.Raft = metrics.RaftSample{IsLeader: r.IsLeader, Term: r.Term, CommitIndex: r.CommitIndex, AppliedIndex: r.AppliedIndex}
	if hs, ok, err := s.node.MembersHealth(); err == nil && ok {
		for _, h := range hs {
			out.Members = append(out.Members, metrics.MemberSample{ID: h.ID, Reachable: h.Reachable, LastContact: h.LastContact, Lag: h.Lag})
		}
	}
	return out
}

// refused logs, at warn, a request refused for a limit or for rights
// (RESOURCE_EXHAUSTED, PERMISSION_DENIED); other answers are not logged.
// At most maxRefusalLogs a second are logged: a client that keeps being
// refused cannot flood the log; the next record says how many were not.
func (s *Server) refused(method string, code codes.Code, msg string) {
	if code != codes.ResourceExhausted && code != codes.PermissionDenied {
		return
	}
	log, dropped := s.refusals.admit(time.Now())
	if dropped > 0 {
		s.log.Warn("request refusals not logged", "count", dropped)
	}
	if log {
		s.log.Warn("request refused", "method", method, "code", code.String(), "err", msg)
	}
}

// maxRefusalLogs bounds the refusals logged per second.
const maxRefusalLogs = 10

// refusalBudget admits maxRefusalLogs records a second. Safe for
// concurrent use.
type refusalBudget struct {
	// mu guards the fields below.
	mu      sync.Mutex
	second  time.Time // start of the current second
	logged  int
	dropped int
}

// admit reports whether a refusal at now may be logged, and how many were
// left out before it (to be said once).
func (b *refusalBudget) admit(now time.Time) (log bool, dropped int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if now.Sub(b.second) >= time.Second {
		b.second, b.logged = now, 0
		dropped, b.dropped = b.dropped, 0
	}
	if b.logged >= maxRefusalLogs {
		b.dropped++
		return false, dropped
	}
	b.logged++
	return true, dropped
}

// healthStatus fills in a status answer's readiness, commit index and
// version.
func (s *Server) healthStatus(out *pb.StatusResponse) {
	h := s.node.Health()
	out.CommitIndex, out.Ready, out.NotReady, out.Version = h.CommitIndex, h.Ready(), h.Reason(), version.String()
	out.Protocol, out.MinProtocol, out.ClusterVersion = version.Protocol, version.MinProtocol, s.node.ClusterVersion()
	out.Degraded = s.node.Degraded()
}
