package node

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tenure-io/tenure/internal/fsm"
)

// The peer identity handshake
//
// Every raft connection a node dials starts, inside TLS when peer TLS is
// on, with a hello naming the dialer's cluster and node; the node that
// accepts it answers with its own, and refuses the connection (answering
// so, then closing it) when both clusters are known and differ. Until
// then raft reads nothing from the connection, so nothing of another
// cluster reaches the data directory. A node that does not know its
// cluster yet (a new one that joins) records the dialer's, durably, before
// it answers.
//
//	hello:  identityHello, version 1, len, cluster id, len, node id
//	answer: status (identityOK, identityRefused, identityFailed), len,
//	        cluster id, len, node id (or, when failed, len, message)
//
// A connection that does not start with identityHello is raft's own (its
// first byte is an RPC type, 0 to 4), from a release without the
// handshake: it is accepted, for rolling upgrades. Such a release closes
// a connection whose first byte it does not know; the dialer then dials
// again without the hello and keeps doing so for that address for
// legacyRecheck.

const (
	identityHello   byte = 'T' // never a raft RPC type
	identityVersion byte = 1

	identityOK      byte = 0
	identityRefused byte = 1
	identityFailed  byte = 2
)

// legacyRecheck is how long a peer that closed the connection on the hello
// is dialed without it.
const legacyRecheck = time.Minute

// identityStream is a raft.StreamLayer whose connections start with the
// identity handshake.
type identityStream struct {
	raft.StreamLayer
	ident *identity
	// refused is told about every connection refused as another
	// cluster's, on either side; first is true for one this node
	// accepted before any node of its own cluster had connected to it.
	refused func(err error, first bool)
	// own: a node of this node's cluster has connected to it.
	own atomic.Bool

	// mu guards legacy.
	mu     sync.Mutex
	legacy map[raft.ServerAddress]time.Time
}

func newIdentityStream(inner raft.StreamLayer, ident *identity, refused func(error, bool)) *identityStream {
	return &identityStream{StreamLayer: inner, ident: ident, refused: refused, legacy: map[raft.ServerAddress]time.Time{}}
}

// Accept implements net.Listener: the handshake runs when raft first reads
// from the connection, on raft's goroutine for it.
func (s *identityStream) Accept() (net.Conn, error) {
	c, err := s.StreamLayer.Accept()
	if err != nil {
		return nil, err
	}
	return &identityConn{Conn: c, s: s}, nil
}

// Dial implements raft.StreamLayer.
func (s *identityStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	s.mu.Lock()
	until, legacy := s.legacy[address]
	if legacy && time.Now().After(until) {
		delete(s.legacy, address)
		legacy = false
	}
	s.mu.Unlock()
	if legacy {
		return s.StreamLayer.Dial(address, timeout)
	}
	c, err := s.StreamLayer.Dial(address, timeout)
	if err != nil {
		return nil, err
	}
	status, cluster, node, err := s.hello(c, timeout)
	switch {
	case err != nil && errors.Is(err, errNoAnswer):
		// A release without the handshake closed the connection.
		c.Close()
		s.mu.Lock()
		s.legacy[address] = time.Now().Add(legacyRecheck)
		s.mu.Unlock()
		return s.StreamLayer.Dial(address, timeout)
	case err != nil:
		c.Close()
		return nil, err
	case status == identityRefused:
		c.Close()
		err := fmt.Errorf("%w: node %s at %s belongs to cluster %s, and this node (%s) to cluster %s: it refused this node", ErrOtherCluster, node, address, fsm.ClusterIDString(cluster), s.ident.node, fsm.ClusterIDString(s.ident.clusterID()))
		s.refused(err, false)
		return nil, err
	case status == identityFailed:
		c.Close()
		return nil, fmt.Errorf("node: peer %s could not take the connection: %s", address, node)
	}
	return c, nil
}

// errNoAnswer: the peer closed the connection without answering the hello.
var errNoAnswer = errors.New("node: the peer closed the connection on the identity hello")

// hello sends this node's hello on c and reads the answer, within timeout.
func (s *identityStream) hello(c net.Conn, timeout time.Duration) (status byte, cluster []byte, node string, err error) {
	c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	msg := []byte{identityHello, identityVersion}
	msg = appendField(msg, s.ident.clusterID())
	msg = appendField(msg, []byte(s.ident.node))
	if _, err := c.Write(msg); err != nil {
		return 0, nil, "", fmt.Errorf("node: identity hello: %w", err)
	}
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err) {
			return 0, nil, "", errNoAnswer
		}
		return 0, nil, "", fmt.Errorf("node: identity answer: %w", err)
	}
	if cluster, err = readField(c); err == nil {
		var n []byte
		n, err = readField(c)
		node = string(n)
	}
	if err != nil {
		return 0, nil, "", fmt.Errorf("node: identity answer: %w", err)
	}
	return b[0], cluster, node, nil
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && !op.Timeout()
}

// appendField appends a field of at most 255 bytes, after its length.
func appendField(b, field []byte) []byte {
	field = field[:min(len(field), 255)]
	return append(append(b, byte(len(field))), field...)
}

// readField reads a field appendField wrote.
func readField(r io.Reader) ([]byte, error) {
	var n [1]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	f := make([]byte, n[0])
	_, err := io.ReadFull(r, f)
	return f, err
}

// identityConn is an accepted connection; the first Read runs the
// handshake (see identityStream).
type identityConn struct {
	net.Conn
	s    *identityStream
	once sync.Once
	err  error
	// first is raft's first byte, read to tell a hello from raft's own
	// traffic, until raft reads it.
	first []byte
}

func (c *identityConn) Read(b []byte) (int, error) {
	c.once.Do(c.accept)
	if c.err != nil {
		return 0, c.err
	}
	if len(c.first) > 0 && len(b) > 0 {
		n := copy(b, c.first)
		c.first = c.first[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}

// accept reads the hello, if the connection starts with one, and answers it.
func (c *identityConn) accept() {
	c.Conn.SetReadDeadline(time.Now().Add(peerHandshakeTimeout))
	defer c.Conn.SetReadDeadline(time.Time{})
	var b [1]byte
	if _, c.err = io.ReadFull(c.Conn, b[:]); c.err != nil {
		return
	}
	if b[0] != identityHello {
		c.first = b[:] // raft's own, from a release without the handshake
		return
	}
	var version [1]byte
	var cluster, node []byte
	if _, c.err = io.ReadFull(c.Conn, version[:]); c.err == nil {
		if cluster, c.err = readField(c.Conn); c.err == nil {
			node, c.err = readField(c.Conn)
		}
	}
	if c.err != nil {
		c.Conn.Close()
		return
	}
	from := fmt.Sprintf("node %s at %s", node, c.Conn.RemoteAddr())
	ident := c.s.ident
	answer := []byte{identityOK}
	if err := ident.learn(cluster, from); err != nil {
		c.err = err
		if errors.Is(err, ErrOtherCluster) {
			answer = []byte{identityRefused}
			c.s.refused(err, !c.s.own.Load())
		} else {
			answer = appendField([]byte{identityFailed, 0}, []byte(err.Error()))
		}
	}
	if answer[0] == identityOK && len(cluster) > 0 {
		c.s.own.Store(true)
	}
	if answer[0] != identityFailed {
		answer = appendField(answer, ident.clusterID())
		answer = appendField(answer, []byte(ident.node))
	}
	c.Conn.SetWriteDeadline(time.Now().Add(peerHandshakeTimeout))
	if _, err := c.Conn.Write(answer); err != nil && c.err == nil {
		c.err = err
	}
	c.Conn.SetWriteDeadline(time.Time{})
	if c.err != nil {
		c.Conn.Close()
	}
}

// tcpStream is raft's TCP stream layer (as raft.NewTCPTransport builds
// it), for identityStream to wrap.
type tcpStream struct {
	net.Listener
	advertise net.Addr
}

// newTCPStream listens on bind; advertise (nil: the listener's address)
// must be an address other members can dial.
func newTCPStream(bind string, advertise net.Addr) (*tcpStream, error) {
	lis, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, err
	}
	if advertise == nil {
		advertise = lis.Addr()
	}
	if tcp, ok := advertise.(*net.TCPAddr); !ok || tcp.IP == nil || tcp.IP.IsUnspecified() {
		lis.Close()
		return nil, fmt.Errorf("node: peer address %s is not one other members can dial (give --peer-advertise)", advertise)
	}
	return &tcpStream{Listener: lis, advertise: advertise}, nil
}

// Addr implements net.Listener: the address other members dial.
func (s *tcpStream) Addr() net.Addr { return s.advertise }

// Dial implements raft.StreamLayer.
func (s *tcpStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout("tcp", string(address), timeout)
}
