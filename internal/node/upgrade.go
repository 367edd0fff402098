package node

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/version"
)

// Rolling upgrades: how members report their versions
//
// The cluster version (internal/fsm/version.go) is raised only once every
// voter speaks the newer protocol, and the leader must learn that without
// writing anything to the log while members of an older release are
// present. It asks each member over the peer listener raft already uses,
// with the peer TLS that guards it: a connection whose first byte is
// versionProbe is neither raft's (raft's RPC types are small numbers) nor
// the identity hello's (peerid.go), and is answered with one line,
// "TENURE-VERSION protocol=P min=M release=R", then closed. A member of a
// release before versions takes the byte for an RPC type it does not know
// and closes the connection: it counts as version 1. A member that cannot
// be reached reports nothing, and the version is not raised past it.

// versionProbe is the first byte of a version probe.
const versionProbe = 'V'

// versionRequest is what a prober sends; versionAnswer prefixes the answer.
const (
	versionRequest = string(versionProbe) + "TENURE-VERSION?\n"
	versionAnswer  = "TENURE-VERSION "
)

// versionProbeTimeout bounds one probe, both ends.
const versionProbeTimeout = 2 * time.Second

// versionRaiseEvery is how often the leader, while the cluster version is
// below its own protocol, asks the voters again.
const versionRaiseEvery = 2 * time.Second

// MemberVersion is what a member reports of its build.
type MemberVersion struct {
	// Protocol is the newest format version it speaks: 1 for a member
	// that answered without one (a release before versions), 0 when it
	// did not answer.
	Protocol uint32
	// MinProtocol is the oldest cluster version it serves in (0 unknown).
	MinProtocol uint32
	// Release is its version string ("" unknown).
	Release string
}

// ownVersion is this build's MemberVersion.
func ownVersion() MemberVersion {
	return MemberVersion{Protocol: version.Protocol, MinProtocol: version.MinProtocol, Release: version.String()}
}

// versionStream is a raft.StreamLayer that answers version probes on the
// connections it accepts, and hands every other connection to raft as it
// came.
type versionStream struct {
	raft.StreamLayer
}

// Accept implements net.Listener; the probe is recognised on the
// connection's first read, on raft's goroutine for the connection.
func (s versionStream) Accept() (net.Conn, error) {
	c, err := s.StreamLayer.Accept()
	if err != nil {
		return nil, err
	}
	return &probeConn{Conn: c}, nil
}

// probeConn answers a version probe in place of raft: raft sees the end
// of the connection.
type probeConn struct {
	net.Conn
	checked bool // only raft's goroutine for the connection reads
}

func (c *probeConn) Read(b []byte) (int, error) {
	if c.checked || len(b) == 0 {
		return c.Conn.Read(b)
	}
	c.checked = true
	var first [1]byte
	if _, err := io.ReadFull(c.Conn, first[:]); err != nil {
		return 0, err
	}
	if first[0] != versionProbe {
		b[0] = first[0]
		return 1, nil
	}
	_ = c.Conn.SetDeadline(time.Now().Add(versionProbeTimeout))
	line, err := bufio.NewReaderSize(io.LimitReader(c.Conn, 64), 64).ReadString('\n')
	if err == nil && string(versionProbe)+line == versionRequest {
		v := ownVersion()
		_, _ = fmt.Fprintf(c.Conn, "%sprotocol=%d min=%d release=%s\n", versionAnswer, v.Protocol, v.MinProtocol, strings.ReplaceAll(v.Release, " ", "_"))
	}
	return 0, io.EOF // raft closes the connection
}

// probeVersion asks the member id at addr for its version. An error means
// it did not answer (unreachable, or the peer TLS failed); a member that
// closes the connection without an answer reports Protocol 1.
func (n *Node) probeVersion(ctx context.Context, id, addr string) (MemberVersion, error) {
	if id == n.cfg.NodeID {
		return ownVersion(), nil
	}
	if n.peerStream == nil {
		return MemberVersion{}, ErrStandalone
	}
	deadline := time.Now().Add(versionProbeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	target := addr
	if r, ok := n.cfg.Faults.route(id); ok {
		target = r
	}
	c, err := n.peerStream.Dial(raft.ServerAddress(target), time.Until(deadline))
	if err != nil {
		return MemberVersion{}, fmt.Errorf("%w: %s at %s: %v", ErrPeerUnreachable, id, addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	if _, err := io.WriteString(c, versionRequest); err != nil {
		return MemberVersion{}, fmt.Errorf("%w: %s at %s: %v", ErrPeerUnreachable, id, addr, err)
	}
	line, err := bufio.NewReaderSize(io.LimitReader(c, 512), 512).ReadString('\n')
	if !strings.HasPrefix(line, versionAnswer) {
		var ne net.Error
		if err != nil && errors.As(err, &ne) && ne.Timeout() {
			return MemberVersion{}, fmt.Errorf("%w: %s at %s: no answer to a version probe", ErrPeerUnreachable, id, addr)
		}
		return MemberVersion{Protocol: 1}, nil // a release before versions
	}
	var v MemberVersion
	if _, err := fmt.Sscanf(strings.TrimSpace(line[len(versionAnswer):]), "protocol=%d min=%d release=%s", &v.Protocol, &v.MinProtocol, &v.Release); err != nil || v.Protocol == 0 {
		return MemberVersion{Protocol: 1}, nil
	}
	return v, nil
}

// memberVersionTTL is how long MemberVersions reuses what a member
// reported, when it speaks this build's protocol or a newer one;
// memberVersionRecheck, when it speaks an older one or did not answer
// (it is the member being upgraded, or down).
const (
	memberVersionTTL     = 5 * time.Second
	memberVersionRecheck = time.Second
)

// versionCache holds what each member last reported.
type versionCache struct {
	mu sync.Mutex
	m  map[string]cachedVersion // by member id
}

type cachedVersion struct {
	addr     string
	v        MemberVersion
	answered bool
	at       time.Time
}

// MemberVersions returns the version of every member of ms that answers:
// what it reported within memberVersionTTL (memberVersionRecheck for one
// of an older protocol, or that did not answer), else what it answers now to a
// probe (all asked at once, within ctx and versionProbeTimeout). A member
// that did not answer is missing from the answer. This node answers for
// itself. Safe for concurrent use.
func (n *Node) MemberVersions(ctx context.Context, ms []Member) map[string]MemberVersion {
	return n.memberVersions(ctx, ms, false)
}

// memberVersions is MemberVersions; fresh asks every member anew.
func (n *Node) memberVersions(ctx context.Context, ms []Member, fresh bool) map[string]MemberVersion {
	out := make(map[string]MemberVersion, len(ms))
	var mu sync.Mutex
	var wg sync.WaitGroup
	now := time.Now()
	n.versions.mu.Lock()
	for id, c := range n.versions.m { // a removed member's is forgotten
		if now.Sub(c.at) > 12*memberVersionTTL {
			delete(n.versions.m, id)
		}
	}
	n.versions.mu.Unlock()
	for _, m := range ms {
		n.versions.mu.Lock()
		c, ok := n.versions.m[m.ID]
		n.versions.mu.Unlock()
		ttl := memberVersionRecheck
		if c.answered && c.v.Protocol >= version.Protocol {
			ttl = memberVersionTTL
		}
		if ok && !fresh && c.addr == m.PeerAddr && now.Sub(c.at) < ttl {
			if c.answered {
				out[m.ID] = c.v
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := n.probeVersion(ctx, m.ID, m.PeerAddr)
			n.versions.mu.Lock()
			if n.versions.m == nil {
				n.versions.m = make(map[string]cachedVersion)
			}
			n.versions.m[m.ID] = cachedVersion{addr: m.PeerAddr, v: v, answered: err == nil, at: time.Now()}
			n.versions.mu.Unlock()
			if err == nil {
				mu.Lock()
				out[m.ID] = v
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out
}

// ClusterVersion is the cluster version in effect on this node (as of its
// last applied entry).
func (n *Node) ClusterVersion() uint32 { return n.fsm.ClusterVersion() }

// raiseClusterVersion runs on every member until ctx ends: while this
// node leads and the cluster version is below its protocol, it asks the
// voters for theirs (at once when it becomes leader, then every
// versionRaiseEvery) and proposes SetClusterVersion to the oldest protocol
// among them once that is above the cluster version.
func (n *Node) raiseClusterVersion(ctx context.Context) {
	tick := time.NewTicker(versionRaiseEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.raiseNow:
		case <-tick.C:
		}
		if n.raft.State() != raft.Leader || n.fsm.ClusterVersion() >= version.Protocol {
			continue
		}
		if err := n.tryRaise(ctx); err != nil && ctx.Err() == nil {
			n.cfg.Logger.Debug("cluster version not raised", "err", err)
		}
	}
}

// errVoterSilent: a voter did not report its version (not listening yet,
// or down); the cluster version is not raised past it.
var errVoterSilent = errors.New("a voter did not report its version")

// tryRaise is one attempt of raiseClusterVersion.
func (n *Node) tryRaise(ctx context.Context) error {
	ms, err := n.Members()
	if err != nil {
		return err
	}
	var voters []Member
	for _, m := range ms {
		if m.Voter {
			voters = append(voters, m)
		}
	}
	vs := n.memberVersions(ctx, voters, true)
	target := version.Protocol
	for _, m := range voters {
		v, ok := vs[m.ID]
		if !ok {
			return fmt.Errorf("%w: %s", errVoterSilent, m.ID)
		}
		target = min(target, v.Protocol)
	}
	cv := n.fsm.ClusterVersion()
	if target <= cv {
		return fmt.Errorf("the oldest voter speaks version %d, the cluster is at %d", target, cv)
	}
	cmd := &fsmpb.Command{Op: &fsmpb.Command_SetClusterVersion{SetClusterVersion: &fsmpb.SetClusterVersion{Version: target}}}
	if _, err := n.Propose(ctx, cmd); err != nil && !errors.Is(err, fsm.ErrInvalid) {
		return err
	}
	n.cfg.Logger.Info("cluster version raised: every voter speaks it", "from", cv, "to", n.fsm.ClusterVersion())
	n.applySettings(ctx) // a setting the older version could not write
	n.hooksMu.Lock()
	hooks := n.onRaise
	n.hooksMu.Unlock()
	for _, fn := range hooks {
		fn(ctx)
	}
	return nil
}

// checkJoinerVersion refuses to add a member whose build cannot serve at
// the cluster version in effect: one that speaks only older formats (a
// release before versions counts as 1), or one that needs a newer cluster
// version than this one. A member that does not answer the probe is let
// through: AddVoter's own probe decides whether it is reachable.
func (n *Node) checkJoinerVersion(ctx context.Context, id, addr string) error {
	v, err := n.probeVersion(ctx, id, addr)
	if err != nil {
		return nil
	}
	cv := n.fsm.ClusterVersion()
	switch {
	case v.Protocol < cv:
		return fmt.Errorf("%w: %s speaks format version %d, the cluster is at version %d: run a release of protocol %d or newer on it", fsm.ErrVersion, id, v.Protocol, cv, cv)
	case v.MinProtocol > cv:
		return fmt.Errorf("%w: %s serves only in clusters of version %d or newer, the cluster is at version %d: upgrade the other members first", fsm.ErrVersion, id, v.MinProtocol, cv)
	}
	return nil
}

// TransferLeadership hands leadership to the voter id ("" the most up to
// date one) and waits until this node no longer leads. Only the leader
// can; it returns the new leader's id ("" if it is not known here within
// a few seconds).
func (n *Node) TransferLeadership(ctx context.Context, id string) (string, error) {
	if n.raft.State() != raft.Leader {
		return "", ErrNotLeader
	}
	if id == n.cfg.NodeID {
		return "", fmt.Errorf("%w: %s leads already", fsm.ErrInvalid, id)
	}
	ms, err := n.Members()
	if err != nil {
		return "", err
	}
	var addr string
	others := 0
	for _, m := range ms {
		if m.Voter && m.ID != n.cfg.NodeID {
			others++
			if m.ID == id {
				addr = m.PeerAddr
			}
		}
	}
	switch {
	case others == 0:
		return "", fmt.Errorf("%w: %s is the only voter: there is no one to hand leadership to", fsm.ErrInvalid, n.cfg.NodeID)
	case id != "" && addr == "":
		return "", fmt.Errorf("%w: %s is not another voter of this cluster", fsm.ErrInvalid, id)
	}
	call := func() raft.Future { return n.raft.LeadershipTransfer() }
	if id != "" {
		call = func() raft.Future {
			return n.raft.LeadershipTransferToServer(raft.ServerID(id), raft.ServerAddress(addr))
		}
	}
	if err := n.await(ctx, call); err != nil {
		if errors.Is(err, raft.ErrNotLeader) {
			return "", ErrNotLeader
		}
		return "", fmt.Errorf("node: leadership transfer: %w", err)
	}
	// The new leader is known here once its first heartbeat arrives.
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for i := 0; i < 500; i++ {
		if _, leader := n.raft.LeaderWithID(); leader != "" && string(leader) != n.cfg.NodeID {
			return string(leader), nil
		}
		select {
		case <-ctx.Done():
			return "", nil // handed on; the new leader is not known here yet
		case <-poll.C:
		}
	}
	return "", nil
}
