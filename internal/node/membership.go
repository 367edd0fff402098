package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// Membership changes
//
// A voter joins in three steps, as etcd adds learners and Consul's
// autopilot promotes servers. First its peer address must answer a raft
// RPC: a pre-vote request, which changes nothing on the peer. Then it
// joins as a non-voter, which counts for no quorum, and the leader waits
// until it holds the configuration entry that added it, and so the whole
// log before it. Only then is it promoted to voter. A peer that never
// answers is refused before the configuration changes; one still catching
// up when the caller's context ends stays a non-voter, and adding it again
// promotes it once it has caught up.
//
// The probes use raft's own transport, through the same address overrides
// (Config.Faults, tenurefault builds only) as replication, and hashicorp/raft's public RPC
// types: the pre-vote, and the leader's heartbeat (an AppendEntries
// without entries or commit index, which tells the peer's last index and,
// with a previous entry, whether the peer holds it).

var (
	// ErrPeerUnreachable: a peer did not answer a raft RPC in time.
	ErrPeerUnreachable = errors.New("tenure: peer did not answer")
	// ErrPeerNotListening: nothing accepted a connection at a peer's
	// address (its server is not started yet, or the address is wrong).
	// It comes with ErrPeerUnreachable; a peer that accepts but does not
	// answer, or does not speak raft (or mutual TLS), is ErrPeerUnreachable
	// alone.
	ErrPeerNotListening = errors.New("tenure: nothing listens at the peer address")
	// ErrCatchingUp: a new member joined as a non-voter but has not
	// caught up with the log yet, so it was not made a voter.
	ErrCatchingUp = errors.New("tenure: new member still catching up")
	// ErrStandalone: this node has no peer transport (no PeerAddr), so it
	// cannot have other members.
	ErrStandalone = errors.New("tenure: this node runs without --peer-listen and cannot have other members")
)

// peerPool is how many idle connections raft's transport keeps to each
// peer.
const peerPool = 3

// probeTimeout bounds one probe of a peer.
const probeTimeout = 3 * time.Second

// catchUpPoll is how often the leader asks a new member how far it got.
const catchUpPoll = 20 * time.Millisecond

// Member is one server of the raft configuration.
type Member struct {
	ID       string
	PeerAddr string
	Voter    bool
	Leader   bool
}

// Configuration lists the raft configuration and the log index it was
// committed at (pass it to AddVoter and RemoveServer so that a change
// decided on this configuration is refused if another came first).
func (n *Node) Configuration() ([]Member, uint64, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, 0, mapRaftErr(err)
	}
	leader := raft.ServerID(n.Leader())
	var out []Member
	for _, s := range f.Configuration().Servers {
		out = append(out, Member{ID: string(s.ID), PeerAddr: string(s.Address), Voter: s.Suffrage == raft.Voter, Leader: leader != "" && s.ID == leader})
	}
	return out, f.Index(), nil
}

// Members lists the raft configuration.
func (n *Node) Members() ([]Member, error) {
	ms, _, err := n.Configuration()
	return ms, err
}

func (n *Node) netTransport() (*raft.NetworkTransport, error) {
	nt, ok := n.trans.(*raft.NetworkTransport)
	if !ok {
		return nil, ErrStandalone
	}
	return nt, nil
}

func (n *Node) rpcHeader(nt *raft.NetworkTransport) raft.RPCHeader {
	id := raft.ServerID(n.cfg.NodeID)
	return raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(id), Addr: nt.EncodePeer(id, nt.LocalAddr())}
}

// call runs one RPC of nt, bounded by ctx and probeTimeout. The RPC itself
// ends within the transport's timeout; Close waits for it. With dial, a
// plain TCP dial comes first: it fails fast on a port nothing listens on
// and honours ctx, which the transport's own dial does not (the leader's
// periodic watch of its peers, peers.go, skips it: its RPCs go over the
// transport's pooled connections).
func (n *Node) call(ctx context.Context, id, addr string, dial bool, rpc func() error) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	if dial {
		target := addr
		if r, ok := n.cfg.Faults.route(id); ok {
			target = r
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", target)
		if err != nil {
			return fmt.Errorf("%w: %s at %s: %w", ErrPeerUnreachable, id, addr, notListening{err})
		}
		c.Close()
	}
	done := make(chan error, 1)
	n.probes.Add(1)
	go func() {
		defer n.probes.Done()
		// The transport pools up to peerPool connections per peer: each
		// one to a peer that has restarted since fails once (EOF) and is
		// dropped, so the attempt after the last of them dials afresh.
		err := rpc()
		for range peerPool {
			if err == nil || ctx.Err() != nil || errors.Is(err, ErrOtherCluster) {
				break
			}
			err = rpc()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if errors.Is(err, ErrOtherCluster) {
			return err // it answered: it is another cluster's (peerid.go)
		}
		if err != nil {
			return fmt.Errorf("%w: %s at %s: %v", ErrPeerUnreachable, id, addr, err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: %s at %s: no raft answer: %v", ErrPeerUnreachable, id, addr, ctx.Err())
	}
}

// ProbePeer returns nil if a raft server answers at addr, asked as the
// member id would be. It changes nothing on the peer.
func (n *Node) ProbePeer(ctx context.Context, id, addr string) error {
	nt, err := n.netTransport()
	if err != nil {
		return err
	}
	term := n.raft.CurrentTerm()
	req := &raft.RequestPreVoteRequest{RPCHeader: n.rpcHeader(nt), Term: term, LastLogIndex: n.raft.LastIndex(), LastLogTerm: term}
	return n.call(ctx, id, addr, true, func() error {
		var resp raft.RequestPreVoteResponse
		return nt.RequestPreVote(raft.ServerID(id), raft.ServerAddress(addr), req, &resp)
	})
}

// heartbeat sends member id the leader's heartbeat and returns the peer's
// last log index; with prev > 0 it also asks whether the peer holds entry
// prev of term prevTerm (holds).
func (n *Node) heartbeat(ctx context.Context, id, addr string, prev, prevTerm uint64) (last uint64, holds bool, err error) {
	return n.beat(ctx, id, addr, prev, prevTerm, true)
}

// beat is heartbeat, with call's dial. Only a leader sends one, stamped
// with the term it leads (ErrNotLeader otherwise).
func (n *Node) beat(ctx context.Context, id, addr string, prev, prevTerm uint64, dial bool) (last uint64, holds bool, err error) {
	nt, err := n.netTransport()
	if err != nil {
		return 0, false, err
	}
	// The term this node leads, never raft's current term: a deposed
	// leader has learned a newer term in which another node leads, and a
	// heartbeat stamped with it would make that leader step down and take
	// this node for the leader of its term.
	l := n.leadership()
	if !l.Leading {
		return 0, false, ErrNotLeader
	}
	term := l.Term
	req := &raft.AppendEntriesRequest{RPCHeader: n.rpcHeader(nt), Term: term, PrevLogEntry: prev, PrevLogTerm: prevTerm}
	var resp raft.AppendEntriesResponse
	err = n.call(ctx, id, addr, dial, func() error {
		return nt.AppendEntries(raft.ServerID(id), raft.ServerAddress(addr), req, &resp)
	})
	if err != nil {
		return 0, false, err
	}
	if resp.Term > term {
		return 0, false, ErrNotLeader // a newer leader exists
	}
	return resp.LastLog, resp.Success && prev > 0, nil
}

// Reachable returns the voters among ms that answer the leader's
// heartbeat now, this node included; only the leader can ask.
func (n *Node) Reachable(ctx context.Context, ms []Member) (map[string]bool, error) {
	if !n.IsLeader() {
		return nil, ErrNotLeader
	}
	var mu sync.Mutex
	up := make(map[string]bool)
	var wg sync.WaitGroup
	for _, m := range ms {
		if !m.Voter {
			continue
		}
		if m.ID == n.cfg.NodeID {
			mu.Lock()
			up[m.ID] = true
			mu.Unlock()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := n.heartbeat(ctx, m.ID, m.PeerAddr, 0, 0); err == nil {
				mu.Lock()
				up[m.ID] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return up, nil
}

// AddVoter makes id (at peerAddr) a voting member: a new member first
// joins as a non-voter and is promoted once it holds the whole log (see
// above); an existing voter only has its address updated. prevIndex is
// the configuration index the change was decided on (0: any). Only the
// leader can. A member still catching up when ctx ends stays a non-voter
// and ErrCatchingUp is returned.
func (n *Node) AddVoter(ctx context.Context, id, peerAddr string, prevIndex uint64) error {
	if err := n.checkJoinerVersion(ctx, id, peerAddr); err != nil { // upgrade.go
		return err
	}
	ms, _, err := n.Configuration()
	if err != nil {
		return err
	}
	for _, m := range ms {
		if m.ID == id && m.Voter {
			return mapConfErr(n.await(context.Background(), func() raft.Future {
				return n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(peerAddr), prevIndex, n.timeout(ctx))
			}))
		}
	}
	var f raft.IndexFuture
	if err := n.await(context.Background(), func() raft.Future {
		f = n.raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(peerAddr), prevIndex, n.timeout(ctx))
		return f
	}); err != nil {
		return mapConfErr(err)
	}
	added := f.Index()
	var entry raft.Log
	if err := n.stores.Log.GetLog(added, &entry); err != nil {
		return fmt.Errorf("node: reading the configuration entry %d: %w", added, err)
	}
	poll := time.NewTicker(catchUpPoll)
	defer poll.Stop()
	var last uint64
	for {
		l, holds, err := n.heartbeat(ctx, id, peerAddr, 0, 0)
		if err == nil && l >= added {
			l, holds, err = n.heartbeat(ctx, id, peerAddr, added, entry.Term)
		}
		if errors.Is(err, ErrNotLeader) {
			return err
		}
		if err == nil {
			last = l
		}
		if holds {
			break
		}
		select {
		case <-poll.C:
		case <-ctx.Done():
			return fmt.Errorf("%w: %s at %s joined as a non-voter and holds log index %d of %d; add it again to make it a voter once it has caught up", ErrCatchingUp, id, peerAddr, last, added)
		case <-n.quit:
			return ErrClosed
		}
	}
	return mapConfErr(n.await(context.Background(), func() raft.Future {
		return n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(peerAddr), added, n.timeout(ctx))
	}))
}

// RemoveServer removes a member; only the leader can. prevIndex is the
// configuration index the change was decided on (0: any).
func (n *Node) RemoveServer(ctx context.Context, id string, prevIndex uint64) error {
	return mapConfErr(n.await(context.Background(), func() raft.Future {
		return n.raft.RemoveServer(raft.ServerID(id), prevIndex, n.timeout(ctx))
	}))
}

func mapConfErr(err error) error {
	if err == nil {
		return nil
	}
	return mapRaftErr(err)
}

// notListening is a failed dial: ErrPeerNotListening, saying why.
type notListening struct{ err error }

func (e notListening) Error() string        { return e.err.Error() }
func (e notListening) Is(target error) bool { return target == ErrPeerNotListening }
