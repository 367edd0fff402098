package node

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// Member health
//
// hashicorp/raft keeps each follower's last contact and match index inside
// its replication goroutines and exposes neither; its observer reports a
// failed heartbeat and a resumed one, but not the answers in between, nor
// how far a follower got. So the leader watches its peers itself: every
// half election timeout it sends each other member the leader's heartbeat
// (an AppendEntries without entries, which changes nothing on the peer but
// its last contact with the leader, see membership.go) and keeps when the
// peer last answered and the last log index it reported. A member is
// reachable while it answered within reachWindow election timeouts. Its lag
// is the leader's last index when the probe was sent minus the one the
// member reported (so entries written during the round trip do not count),
// and for an unreachable member the leader's last index now minus the one
// it last reported.
//
// Only the leader watches: a follower's heartbeat would make its peers take
// it for the leader, and a pre-vote (the harmless probe a follower could
// send) is logged as a warning by every peer that has a leader. A follower
// therefore reports no member health (MembersHealth's ok is false).
//
// Reachable (membership.go) still asks every voter afresh before a
// configuration change: a change must be decided on who answers now, not
// on a view up to reachWindow election timeouts old.
//
// The view is reset when leadership (or the term) changes: a new leader
// counts each peer's silence from the moment it took over (a member added
// later, from when it was added), so neither an election nor an add makes
// a member look unreachable.

// reachWindow is how many election timeouts a member may go without
// answering the leader's heartbeat before it counts as unreachable.
const reachWindow = 3

// minPeerWatch bounds how often the leader probes each peer.
const minPeerWatch = 50 * time.Millisecond

// peerWatch is the leader's view of its peers.
type peerWatch struct {
	// mu guards the fields below.
	mu sync.Mutex
	// term is the term the view belongs to (0: this node does not lead).
	term uint64
	// since is when this node began to lead in term.
	since time.Time
	peers map[string]*peerSeen
}

// peerSeen is what the leader has seen of one peer.
type peerSeen struct {
	added    time.Time // when the view took it in (its silence counts from then)
	contact  time.Time // its last answer; zero: none yet in this term
	lastLog  uint64    // the last log index it reported
	sentLast uint64    // the leader's last index when that probe was sent
	inflight bool      // a probe is under way
}

// MemberHealth is one member and its health from the leader's view.
type MemberHealth struct {
	Member
	// Reachable: the member answered the leader's heartbeat within the
	// last few election timeouts (the leader itself always is).
	Reachable bool
	// LastContact is the time since that answer (or, if none came yet,
	// since this node took the lead); 0 for the leader.
	LastContact time.Duration
	// MatchIndex is the member's last log index as it last reported it
	// (0: not reported yet); Lag is how many entries it is behind the
	// leader's last index.
	MatchIndex, Lag uint64
}

// peerWatchEvery is how often the leader probes each peer.
func (n *Node) peerWatchEvery() time.Duration {
	return max(n.cfg.ElectionTimeout/2, minPeerWatch)
}

// reachable is how long a peer may stay silent and still be reachable.
func (n *Node) reachable() time.Duration { return reachWindow * n.cfg.ElectionTimeout }

// watchPeers probes the other members while this node leads (see above),
// until the node closes. Startwork runs it; it waits for its probes.
func (n *Node) watchPeers() {
	defer n.wg.Done()
	if _, err := n.netTransport(); err != nil {
		return // standalone: no peers
	}
	ctx, cancel := context.WithCancel(context.Background())
	var probes sync.WaitGroup
	defer func() {
		cancel()
		probes.Wait()
	}()
	tick := time.NewTicker(n.peerWatchEvery())
	defer tick.Stop()
	for {
		select {
		case <-n.quit:
			return
		case <-tick.C:
		}
		l := n.leadership() // the one leadership value (leadership.go)
		if !l.Leading {
			n.peers.reset(0, time.Time{})
			continue
		}
		term := l.Term
		f := n.raft.GetConfiguration()
		if f.Error() != nil {
			continue
		}
		servers := f.Configuration().Servers
		for _, s := range n.peers.due(term, time.Now(), servers, raft.ServerID(n.cfg.NodeID)) {
			probes.Add(1)
			go func() {
				defer probes.Done()
				sent := n.raft.LastIndex()
				last, _, err := n.beat(ctx, string(s.ID), string(s.Address), 0, 0, false)
				n.peers.answered(term, string(s.ID), last, sent, err == nil, time.Now())
			}()
		}
	}
}

// reset starts a new view for term (0: this node does not lead).
func (w *peerWatch) reset(term uint64, since time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.resetLocked(term, since)
}

func (w *peerWatch) resetLocked(term uint64, since time.Time) {
	if w.term == term {
		return
	}
	w.term, w.since, w.peers = term, since, make(map[string]*peerSeen)
}

// due returns the servers other than self to probe now in term (none with
// a probe under way), and forgets the peers no longer configured.
func (w *peerWatch) due(term uint64, now time.Time, servers []raft.Server, self raft.ServerID) []raft.Server {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.resetLocked(term, now)
	var out []raft.Server
	configured := make(map[string]bool, len(servers))
	for _, s := range servers {
		if s.ID == self {
			continue
		}
		id := string(s.ID)
		configured[id] = true
		p := w.peers[id]
		if p == nil {
			p = &peerSeen{added: now}
			w.peers[id] = p
		}
		if !p.inflight {
			p.inflight = true
			out = append(out, s)
		}
	}
	for id := range w.peers {
		if !configured[id] {
			delete(w.peers, id)
		}
	}
	return out
}

// answered records the end of a probe of id in term, sent when the
// leader's last index was sentLast: ok if it answered, with its last log
// index.
func (w *peerWatch) answered(term uint64, id string, lastLog, sentLast uint64, ok bool, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.peers[id]
	if w.term != term || p == nil {
		return // a view since replaced
	}
	p.inflight = false
	if ok {
		p.contact, p.lastLog, p.sentLast = now, lastLog, sentLast
	}
}

// MembersHealth lists the members with their health from this node's view
// as leader; ok is false on a follower, which does not watch its peers
// (the health fields are then zero: unknown, not unreachable).
func (n *Node) MembersHealth() (_ []MemberHealth, ok bool, err error) {
	ms, err := n.Members()
	if err != nil {
		return nil, false, err
	}
	out := make([]MemberHealth, len(ms))
	for i, m := range ms {
		out[i].Member = m
	}
	l := n.leadership()
	if !l.Leading {
		return out, false, nil
	}
	term, last, now := l.Term, n.raft.LastIndex(), time.Now()
	w := &n.peers
	w.mu.Lock()
	defer w.mu.Unlock()
	w.resetLocked(term, now) // a leader of a moment: its view starts now
	for i := range out {
		h := &out[i]
		if h.ID == n.cfg.NodeID {
			h.Reachable, h.MatchIndex = true, last
			continue
		}
		// A member not probed yet (added a moment ago) counts as just
		// seen; one not answered yet since the view took it in, from then.
		contact, lastLog, ref := now, uint64(0), last
		if p := w.peers[h.ID]; p != nil {
			contact = p.added
			if !p.contact.IsZero() {
				contact, lastLog, ref = p.contact, p.lastLog, p.sentLast
			}
		}
		h.LastContact = max(now.Sub(contact), 0)
		h.Reachable = h.LastContact <= n.reachable()
		h.MatchIndex = lastLog
		if !h.Reachable {
			ref = last // it misses everything written since
		}
		if ref > lastLog {
			h.Lag = ref - lastLog
		}
	}
	return out, true, nil
}

// Degraded names, on the leader, the members that did not answer its
// heartbeat lately ("n3 unreachable", "n2, n3 unreachable"); "" when all
// did, and on a follower, which does not watch its peers. A degraded
// cluster that keeps a quorum is still ready.
func (n *Node) Degraded() string {
	hs, ok, err := n.MembersHealth()
	if err != nil || !ok {
		return ""
	}
	return Degraded(hs)
}

// Degraded names the members of hs, a leader's view (MembersHealth with
// ok), that are not reachable, as Node.Degraded does.
func Degraded(hs []MemberHealth) string {
	var down []string
	for _, h := range hs {
		if !h.Reachable {
			down = append(down, h.ID)
		}
	}
	if len(down) == 0 {
		return ""
	}
	slices.Sort(down)
	return fmt.Sprintf("%s unreachable", strings.Join(down, ", "))
}
