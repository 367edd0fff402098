package node

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// Forwarding Tenure's API over the peer port
//
// A follower serves a client's request that needs the leader by relaying
// it to the leader (internal/server's forward.go). It reaches the leader
// over the peer listener raft already uses, with the peer TLS that guards
// it, and not over the leader's client API: a leader whose client API
// cannot be reached while it keeps leading (a firewall, a dead client
// network) still serves the clients of its followers, so their holds
// survive. A connection whose first byte is forwardProto is neither
// raft's (raft's RPC types are small numbers), nor the identity hello's
// (peerid.go), nor a version probe (upgrade.go); after a handshake that
// proves the dialer is a member of this cluster it carries HTTP/2 (gRPC)
// and is handed to the listener ForwardListener returns, raft seeing the
// connection end. A connection whose first byte is zkRelayProto proves
// the same, and carries ZooKeeper's protocol to the ZooKeeper front
// (zkrelay.go):
//
//	dialer:   forwardProto (or zkRelayProto), forwardVersion
//	acceptor: a nonce of forwardNonceLen random bytes
//	dialer:   len, node id, HMAC-SHA256 over the nonce and the node id,
//	          keyed by one of the cluster's signing keys (which only
//	          members hold, replicated in the state)
//	acceptor: forwardOK, or forwardRefused and closes
//
// The proof holds with or without peer TLS (which, outside loopback,
// protected mode requires): a stranger on the peer port, or a member of
// another cluster sharing the peers' CA, gets no API over it. The dialer
// signs with its newest key; the acceptor accepts any of its own, so a key
// rotation or retirement being applied does not stop forwarding for long.

const (
	forwardProto   byte = 'F'
	forwardVersion byte = 1

	forwardOK      byte = 0
	forwardRefused byte = 1

	forwardNonceLen = 16
)

// MaxForwardConns bounds the forwarded-API connections a node holds open
// at once; another is closed as it is accepted. A member keeps one to the
// leader.
const MaxForwardConns = 64

// ErrForwardRefused: the member dialled refused to take forwarded requests
// from this node (it does not hold the same signing keys: another
// cluster, or no key yet).
var ErrForwardRefused = errors.New("node: the peer refused the forwarding handshake")

// forwardListener is the net.Listener of forwarded-API connections: the
// peer listener hands it every connection that passed the handshake.
type forwardListener struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	// bound is how many connections it holds open at once.
	bound int
	// served: someone takes its connections; until then the handshake
	// is not answered, as a release without this kind of connection
	// does not answer it (zkrelay.go).
	served atomic.Bool

	// mu guards open and closed, and orders hand against Close.
	mu     sync.Mutex
	open   int
	closed bool
}

// newForwardListener returns a listener holding at most bound connections
// open, of which up to queue may wait to be accepted.
func newForwardListener(addr net.Addr, bound, queue int) *forwardListener {
	return &forwardListener{addr: addr, conns: make(chan net.Conn, queue), done: make(chan struct{}), bound: bound}
}

// Accept implements net.Listener.
func (l *forwardListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener; it is idempotent. Connections handed to
// it and not accepted yet, or handed to it afterwards, are closed.
func (l *forwardListener) Close() error {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.done)
	}
	var left []net.Conn
	for len(l.conns) > 0 {
		left = append(left, <-l.conns)
	}
	l.mu.Unlock()
	for _, c := range left {
		c.Close()
	}
	return nil
}

// held is how many of its connections are open.
func (l *forwardListener) held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// Addr implements net.Listener: the peer listener's address.
func (l *forwardListener) Addr() net.Addr { return l.addr }

// hand gives the listener c, or closes it when the listener is closed,
// full, or holds its bound already.
func (l *forwardListener) hand(c net.Conn) {
	l.mu.Lock()
	if l.closed || l.open >= l.bound {
		l.mu.Unlock()
		c.Close()
		return
	}
	l.open++
	fc := &countedConn{Conn: c, l: l}
	queued := false
	select {
	case l.conns <- fc:
		queued = true
	default: // nobody accepts: the server is not serving
	}
	l.mu.Unlock()
	if !queued {
		fc.Close()
	}
}

// countedConn is a forwarded-API connection, counted while open.
type countedConn struct {
	net.Conn
	l    *forwardListener
	once sync.Once
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		c.l.open--
		c.l.mu.Unlock()
	})
	return err
}

// ForwardListener returns the listener of forwarded-API connections that
// reach this node on its peer port, for a gRPC server of Tenure's API
// that believes what a member forwards (internal/server); nil for a
// standalone node. The listener is closed when the node closes; the
// connections it handed out are their server's to close.
func (n *Node) ForwardListener() net.Listener {
	if n.fwd == nil {
		return nil
	}
	return n.fwd
}

// forwardStream is a raft.StreamLayer that takes the forwarded-API
// connections (forwardProto) out of raft's way.
type forwardStream struct {
	raft.StreamLayer
	n *Node
}

// Accept implements net.Listener; the first byte is read on raft's
// goroutine for the connection, as the identity handshake's is.
func (s forwardStream) Accept() (net.Conn, error) {
	c, err := s.StreamLayer.Accept()
	if err != nil {
		return nil, err
	}
	return &forwardConn{Conn: c, n: s.n}, nil
}

// forwardConn is an accepted peer connection, until its first byte says
// whether it is raft's or a forwarded-API one.
type forwardConn struct {
	net.Conn
	n       *Node
	checked bool // only raft's goroutine for the connection reads
	handed  bool // handed to the forward listener: raft no longer owns it
}

func (c *forwardConn) Read(b []byte) (int, error) {
	if c.checked || len(b) == 0 {
		if c.handed {
			return 0, io.EOF
		}
		return c.Conn.Read(b)
	}
	c.checked = true
	var first [1]byte
	if _, err := io.ReadFull(c.Conn, first[:]); err != nil {
		return 0, err
	}
	l := c.n.doorOf(first[0])
	if l == nil {
		b[0] = first[0]
		return 1, nil
	}
	c.handed = true
	if err := c.n.acceptForward(c.Conn, l); err != nil {
		c.n.cfg.Logger.Debug("forwarded API connection refused", "remote", c.Conn.RemoteAddr(), "err", err)
		c.Conn.Close()
	}
	return 0, io.EOF // raft lets go of the connection
}

// Close implements net.Conn: a connection handed to the forward listener
// is no longer raft's to close.
func (c *forwardConn) Close() error {
	if c.handed {
		return nil
	}
	return c.Conn.Close()
}

// forwardMAC is the dialer's proof for nonce under a signing key's seed.
func forwardMAC(seed, nonce []byte, node string) []byte {
	k := hmac.New(sha256.New, seed)
	k.Write([]byte("tenure forwarded api"))
	h := hmac.New(sha256.New, k.Sum(nil))
	h.Write(nonce)
	h.Write([]byte{0})
	h.Write([]byte(node))
	return h.Sum(nil)
}

// doorOf is the listener of the connections whose first byte is first,
// nil for raft's (and the identity hello's, and a version probe's).
func (n *Node) doorOf(first byte) *forwardListener {
	switch first {
	case forwardProto:
		return n.fwd
	case zkRelayProto:
		if n.cfg.Faults.refuseZkRelay() {
			return nil // as a release without it: raft closes the connection
		}
		return n.zkRelay
	}
	return nil
}

// acceptForward runs the acceptor's side of the handshake on c (its first
// byte read) and hands c to l.
func (n *Node) acceptForward(c net.Conn, l *forwardListener) error {
	if l == nil {
		return errors.New("no forward listener")
	}
	if !l.served.Load() {
		// Nobody takes this kind of connection here: closed unanswered,
		// as a release that does not know it closes it.
		return errors.New("this node does not serve this kind of connection")
	}
	_ = c.SetDeadline(time.Now().Add(peerHandshakeTimeout))
	var version [1]byte
	if _, err := io.ReadFull(c, version[:]); err != nil {
		return err
	}
	if version[0] != forwardVersion {
		return fmt.Errorf("forwarding version %d, this node speaks %d", version[0], forwardVersion)
	}
	nonce := make([]byte, forwardNonceLen)
	if _, err := rand.Read(nonce); err != nil {
		return err
	}
	if _, err := c.Write(nonce); err != nil {
		return err
	}
	node, err := readField(c)
	if err != nil {
		return err
	}
	mac := make([]byte, sha256.Size)
	if _, err := io.ReadFull(c, mac); err != nil {
		return err
	}
	ok := false
	if sec := n.Security(); sec != nil {
		for _, k := range sec.Keys {
			if hmac.Equal(mac, forwardMAC(k.Seed, nonce, string(node))) {
				ok = true
			}
		}
	}
	if !ok {
		_, _ = c.Write([]byte{forwardRefused})
		return fmt.Errorf("node %q did not prove it holds this cluster's signing keys", node)
	}
	if _, err := c.Write([]byte{forwardOK}); err != nil {
		return err
	}
	_ = c.SetDeadline(time.Time{})
	l.hand(c)
	return nil
}

// DialForward opens a forwarded-API connection to member id over its peer
// listener (with peer TLS when it is on) and proves this node a member of
// the cluster; the connection then carries HTTP/2. It fails with
// ErrStandalone on a standalone node, ErrForwardRefused when the member
// refused the proof, and otherwise when id is not a member or cannot be
// reached within ctx.
func (n *Node) DialForward(ctx context.Context, id string) (net.Conn, error) {
	return n.dialDoor(ctx, id, forwardProto)
}

// dialDoor opens a connection of kind proto (forwardProto, zkRelayProto)
// to member id's peer listener and runs the dialer's side of the
// handshake on it.
func (n *Node) dialDoor(ctx context.Context, id string, proto byte) (net.Conn, error) {
	if n.peerStream == nil {
		return nil, ErrStandalone
	}
	sec := n.Security()
	if sec == nil || len(sec.Keys) == 0 {
		return nil, fmt.Errorf("%w: this node holds no signing key yet", ErrForwardRefused)
	}
	seed := sec.Keys[len(sec.Keys)-1].Seed
	addr := ""
	ms, err := n.Members()
	if err != nil {
		return nil, err
	}
	for _, m := range ms {
		if m.ID == id {
			addr = m.PeerAddr
		}
	}
	if addr == "" {
		return nil, fmt.Errorf("node: %s is not a member", id)
	}
	if r, ok := n.cfg.Faults.route(id); ok {
		addr = r
	}
	deadline := time.Now().Add(peerHandshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c, err := n.peerStream.Dial(raft.ServerAddress(addr), time.Until(deadline))
	if err != nil {
		return nil, fmt.Errorf("%w: %s at %s: %v", ErrPeerUnreachable, id, addr, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	_ = c.SetDeadline(deadline)
	if err := n.forwardHello(c, seed, proto); err != nil {
		c.Close()
		return nil, fmt.Errorf("%s at %s: %w", id, addr, err)
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// forwardHello runs the dialer's side of the handshake of a connection
// of kind proto on c.
func (n *Node) forwardHello(c net.Conn, seed []byte, proto byte) error {
	if _, err := c.Write([]byte{proto, forwardVersion}); err != nil {
		return err
	}
	nonce := make([]byte, forwardNonceLen)
	if _, err := io.ReadFull(c, nonce); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err) {
			return fmt.Errorf("%w: %v", ErrDoorUnsupported, err)
		}
		return err
	}
	msg := appendField(nil, []byte(n.cfg.NodeID))
	msg = append(msg, forwardMAC(seed, nonce, n.cfg.NodeID)...)
	if _, err := c.Write(msg); err != nil {
		return err
	}
	var answer [1]byte
	if _, err := io.ReadFull(c, answer[:]); err != nil {
		return err
	}
	if answer[0] != forwardOK {
		return ErrForwardRefused
	}
	return nil
}
