package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// Read rounds
//
// A linearizable read on a leader with peers needs to know that no other
// node has led, and acknowledged a write, since the read began. raft's
// VerifyLeader answers that through the leader loop, which under load is
// busy appending (and fsyncing) the leader's own log: every read then
// waits for the appends queued before it, and etcd's concurrency.Mutex,
// which reads twice per hand-off, waits for them twice. So the leader
// confirms its leadership itself, outside the leader loop, the way raft's
// ReadIndex does (Ongaro's thesis, 6.4):
//
//  1. it reads its Leadership: it serves in term T (it has applied its
//     term's barrier, and with it every entry committed before T);
//  2. it records its commit index C;
//  3. it sends every other voter of its latest configuration a heartbeat
//     stamped with T (the AppendEntries without entries that the member
//     health probes send, peers.go), each a fresh RPC sent after steps
//     1 and 2, and counts the members that answer it without a newer
//     term: with itself, a majority confirms the round;
//  4. it waits until it has applied C, and then reads its state.
//
// Why a read after step 4 sees every write acknowledged before it began:
//
//   - A member answers a heartbeat stamped T without a newer term only
//     while its current term is at most T, that is before it votes in
//     any later term (raft stores the new term before it grants a vote).
//     Any leader of a term after T is elected by a majority of a
//     configuration that overlaps the confirming majority (raft changes
//     membership one server at a time, and this node's latest
//     configuration is the newest any candidate can hold before a later
//     leader appends one), so by a member that answered this round
//     before it voted: every later leader was elected, and so
//     acknowledged its first write, after the round began, after the read
//     began. A round confirmed by replies to heartbeats sent before the
//     read (which raft's VerifyLeader may count, and which a leader
//     resuming from a pause finds waiting in its sockets) would prove
//     nothing: each reply here answers a request sent after step 2, on a
//     connection no other request uses meanwhile.
//   - Writes of term T are acknowledged only by this node, after its
//     state machine applied them; their indexes are at most C, since the
//     commit index only grows. Writes of earlier terms were applied before
//     this node served in T (step 1), and are at most C too.
//   - What the state holds beyond C was committed (a state machine applies
//     only committed entries) before the read looked at it, so it is
//     state the read may see.
//
// Nothing here depends on clocks, timeouts or how long any node was
// paused: a leader that was deposed while a read waited (partitioned,
// paused) gets its heartbeats refused, or no answer, and the read fails
// with ErrNotLeader. The read costs one round trip to the fastest
// majority, which concurrent reads share: a read joins the next round to
// start (never one under way, which may have recorded C before the read
// began), and one round runs at a time.

// errNoReadRound: this node cannot run a read round (it is not a voter
// of its latest configuration); the read asks raft's leader loop.
var errNoReadRound = errors.New("node: no read round")

// readRounds runs the leader's read rounds, one at a time, each shared by
// the reads that joined it before it began.
type readRounds struct {
	// mu guards running and next.
	mu      sync.Mutex
	running *readRound // the round under way, or nil
	next    *readRound // the round reads join; it starts once running ends

	// linesMu guards lines: per peer, its line of heartbeats.
	linesMu sync.Mutex
	lines   map[raft.ServerID]*peerLine
}

// peerLine keeps at most one read round heartbeat in flight to a peer: a
// round that finds one under way waits for it to end, and the next one
// sent answers it and every other round that waited meanwhile. So a slow
// peer gets no pile of heartbeats (nor a pile of connections, each dialled
// afresh once the transport's pool is full), and a round still completes
// on the answers of the fastest majority. Every heartbeat is sent after
// every round it answers registered, so each answer still follows the
// round's start (see above).
type peerLine struct {
	busy    bool         // a heartbeat is in flight
	waiting []lineWaiter // rounds to answer with the next heartbeat
}

// lineWaiter is one round waiting for a peer's answer.
type lineWaiter struct {
	term    uint64
	answers chan<- error    // buffered: one slot per peer of the round
	done    <-chan struct{} // closed when the round has ended
}

// readRound is one confirmation of leadership for the reads that joined it.
type readRound struct {
	prev   *readRound    // the round under way when this one was created
	done   chan struct{} // closed when commit and err are set
	commit uint64        // the commit index recorded before the round
	err    error
}

// confirm returns the commit index recorded by a read round that began
// after the call and confirmed this node's leadership (see above), or why
// it could not be confirmed: ErrNotLeader, or errNoReadRound when no round
// can run here. The caller that creates a round runs it once the round
// under way ends, even if its own ctx ends meanwhile: the others wait on
// it (a round ends within probeTimeout).
func (r *readRounds) confirm(ctx context.Context, n *Node) (uint64, error) {
	r.mu.Lock()
	rd := r.next
	owner := rd == nil
	if owner {
		rd = &readRound{prev: r.running, done: make(chan struct{})}
		r.next = rd
	}
	r.mu.Unlock()
	if owner {
		if rd.prev != nil {
			<-rd.prev.done
		}
		r.mu.Lock()
		r.running, r.next = rd, nil
		r.mu.Unlock()
		rd.commit, rd.err = n.readRound()
		r.mu.Lock()
		r.running = nil
		r.mu.Unlock()
		close(rd.done)
	} else {
		select {
		case <-rd.done:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return rd.commit, rd.err
}

// readRound is steps 1 to 3 of a read round (see above): it returns the
// commit index recorded once a majority of the latest configuration's
// voters, this node included, answered a heartbeat stamped with the term
// this node serves in.
func (n *Node) readRound() (uint64, error) {
	l := n.leadership()
	if !l.Serving() {
		return 0, ErrNotLeader
	}
	term := l.Term
	commit := n.raft.CommitIndex()
	n.cfg.Faults.beforeReadRound(n.cfg.NodeID)
	nt, err := n.netTransport()
	if err != nil {
		return 0, errNoReadRound
	}
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return 0, errNoReadRound
	}
	self := raft.ServerID(n.cfg.NodeID)
	var others []raft.Server
	voter := false
	for _, s := range f.Configuration().Servers {
		switch {
		case s.Suffrage != raft.Voter:
		case s.ID == self:
			voter = true
		default:
			others = append(others, s)
		}
	}
	if !voter {
		return 0, errNoReadRound
	}
	need := (len(others)+1)/2 + 1 // a majority of the voters
	need--                        // this node's own
	if need == 0 {
		return commit, nil
	}
	answers := make(chan error, len(others))
	done := make(chan struct{})
	defer close(done)
	deadline := time.Now().Add(probeTimeout)
	for _, s := range others {
		n.reads.ask(n, nt, s, lineWaiter{term: term, answers: answers, done: done})
	}
	timeout := time.NewTimer(time.Until(deadline))
	defer timeout.Stop()
	var errs []error
	for range others {
		select {
		case err := <-answers:
			if err == nil {
				if need--; need == 0 {
					return commit, nil
				}
				continue
			}
			errs = append(errs, err)
		case <-timeout.C:
			errs = append(errs, fmt.Errorf("%w: no answer in %v", ErrPeerUnreachable, probeTimeout))
			return 0, fmt.Errorf("%w: no majority confirmed its leadership in term %d: %w", ErrNotLeader, term, errors.Join(errs...))
		}
		if len(others)-len(errs) < need {
			break // the rest cannot make a majority
		}
	}
	return 0, fmt.Errorf("%w: no majority confirmed its leadership in term %d: %w", ErrNotLeader, term, errors.Join(errs...))
}

// ask sends peer s a heartbeat for w, or, while one is in flight to it,
// has the next one answer w too (see peerLine).
func (r *readRounds) ask(n *Node, nt *raft.NetworkTransport, s raft.Server, w lineWaiter) {
	r.linesMu.Lock()
	if r.lines == nil {
		r.lines = make(map[raft.ServerID]*peerLine)
	}
	line := r.lines[s.ID]
	if line == nil {
		line = &peerLine{}
		r.lines[s.ID] = line
	}
	line.waiting = append(line.waiting, w)
	if line.busy {
		r.linesMu.Unlock()
		return
	}
	line.busy = true
	r.linesMu.Unlock()
	n.probes.Add(1)
	go func() {
		defer n.probes.Done()
		r.send(n, nt, s, line)
	}()
}

// send runs line's heartbeats until no round waits on it: each for the
// rounds registered before it was sent, stamped with the newest term
// among them (a round of an older term is answered with ErrNotLeader).
// Rounds that have all ended are not sent one. It stops at the node's
// Close: the transport's RPCs then fail.
func (r *readRounds) send(n *Node, nt *raft.NetworkTransport, s raft.Server, line *peerLine) {
	for {
		r.linesMu.Lock()
		ws := line.waiting
		line.waiting = nil
		if len(ws) == 0 {
			line.busy = false
			r.linesMu.Unlock()
			return
		}
		r.linesMu.Unlock()
		term, open := uint64(0), false
		for _, w := range ws {
			term = max(term, w.term)
			select {
			case <-w.done:
			default:
				open = true
			}
		}
		err := errRoundsOver // no heartbeat: no round waits for it
		if open {
			err = n.readBeat(nt, s, term)
		}
		for _, w := range ws {
			switch {
			case w.term != term:
				w.answers <- fmt.Errorf("%w: the round's term %d is over", ErrNotLeader, w.term)
			default:
				w.answers <- err
			}
		}
	}
}

// readBeat sends s one heartbeat stamped term, again on a failure (a
// pooled connection to a peer that has restarted since fails once, EOF,
// and is dropped) up to peerPool times within probeTimeout; raft's
// transport bounds each try.
func (n *Node) readBeat(nt *raft.NetworkTransport, s raft.Server, term uint64) error {
	req := &raft.AppendEntriesRequest{RPCHeader: n.rpcHeader(nt), Term: term}
	deadline := time.Now().Add(probeTimeout)
	var err error
	for range peerPool + 1 {
		var resp raft.AppendEntriesResponse
		if err = nt.AppendEntries(s.ID, s.Address, req, &resp); err == nil {
			if resp.Term > term {
				return fmt.Errorf("%w: %s is in term %d", errNewerTerm, s.ID, resp.Term)
			}
			return nil
		}
		if time.Now().After(deadline) {
			break
		}
	}
	return err
}

// errRoundsOver: a line sent no heartbeat, every round it was for had
// ended.
var errRoundsOver = errors.New("node: read rounds over")

// errNewerTerm: a member answered a read round's heartbeat with a newer
// term than the leader's (another node leads, or is being elected).
var errNewerTerm = errors.New("tenure: a member is in a newer term")

// waitApplied returns once this node has applied index (step 4 above),
// or ctx's error. raft hands committed entries to the state machine a
// moment after it advances the commit index, from the same leader loop
// iteration, so a read rarely waits here, and then briefly: it polls,
// backing off from readPollMin to readPollMax.
func (n *Node) waitApplied(ctx context.Context, index uint64) error {
	wait := readPollMin
	for n.appliedIndex() < index {
		if n.closing() {
			return ErrNotLeader
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, readPollMax)
	}
	return nil
}

const (
	readPollMin = 50 * time.Microsecond
	readPollMax = 2 * time.Millisecond
)
