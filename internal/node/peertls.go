package node

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// Peer TLS: raft's NetworkTransport over a stream layer that speaks TLS,
// as Consul and Nomad wrap their raft layers. Both directions use the
// configuration Config.PeerTLS returns at that moment, which must verify
// the other side's certificate (mutual TLS: a peer accepts only
// connections whose client certificate chains to the peers' CA, and
// dials only peers whose server certificate does, for the host it
// dialled). A connection that does not complete its handshake within
// peerHandshakeTimeout is closed.

// peerHandshakeTimeout bounds a peer connection's TLS handshake, so that a
// connection that never speaks does not hold raft's reader forever.
const peerHandshakeTimeout = 10 * time.Second

// tlsStream is a raft.StreamLayer over TLS.
type tlsStream struct {
	net.Listener // the TCP listener
	advertise    net.Addr
	config       func() *tls.Config
}

// newTLSStream is raft's TCP stream layer over TLS.
func newTLSStream(bind string, advertise net.Addr, config func() *tls.Config) (*tlsStream, error) {
	if config == nil || config() == nil {
		return nil, errors.New("node: peer TLS without a configuration")
	}
	tcp, err := newTCPStream(bind, advertise)
	if err != nil {
		return nil, err
	}
	return &tlsStream{Listener: tcp.Listener, advertise: tcp.advertise, config: config}, nil
}

// Accept implements net.Listener: the connection's handshake runs (with
// its timeout) when raft first reads from it, on raft's goroutine for the
// connection, so that a slow peer does not hold up the others.
func (s *tlsStream) Accept() (net.Conn, error) {
	c, err := s.Listener.Accept()
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return s.config(), nil },
	}
	return &handshakeConn{Conn: tls.Server(c, cfg)}, nil
}

// Addr implements net.Listener: the address other members dial.
func (s *tlsStream) Addr() net.Addr { return s.advertise }

// Dial implements raft.StreamLayer.
func (s *tlsStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	host, _, err := net.SplitHostPort(string(address))
	if err != nil {
		return nil, err
	}
	cfg := s.config().Clone()
	cfg.ServerName = host
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: timeout}, Config: cfg}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return d.DialContext(ctx, "tcp", string(address))
}

// handshakeConn is an accepted TLS connection that completes its
// handshake, within peerHandshakeTimeout, before the first read or write.
type handshakeConn struct {
	*tls.Conn
	once sync.Once
	err  error
}

func (c *handshakeConn) handshake() error {
	c.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), peerHandshakeTimeout)
		defer cancel()
		if c.err = c.Conn.HandshakeContext(ctx); c.err != nil {
			c.Conn.Close()
		}
	})
	return c.err
}

func (c *handshakeConn) Read(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

func (c *handshakeConn) Write(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}
