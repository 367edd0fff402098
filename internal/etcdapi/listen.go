package etcdapi

// The etcd API's listener. etcd serves gRPC and its JSON gateway on one
// port (its embed.serveCtx), and so does Tenure: Serve splits each
// connection by its first bytes (github.com/soheilhy/cmux, which etcd
// uses too) into
//
//   - gRPC (HTTP/2 whose first request has content-type application/grpc),
//     handed to the gRPC server's own Serve: gRPC's hot path is the same
//     as on a listener of its own;
//   - other HTTP/2 (prior knowledge h2c, or ALPN h2 under TLS) and
//     HTTP/1.1, served by an http.Server: the JSON gateway (gateway.go),
//     /version and /health.
//
// Under TLS the handshake is Serve's (ALPN h2 and http/1.1), done while
// the connection is sniffed; the gRPC server's transport credentials
// (connCreds) then report the handshake's state, so that a client
// certificate identifies its caller and a member's forwarding connection
// is recognised (fromMember) exactly as when gRPC did the handshake.
//
// Every stage is bounded: the handshake and the sniffing of the first
// request by sniffTimeout, an HTTP request's headers by
// httpHeaderTimeout and httpMaxHeaderBytes, its body by gatewayBodyTimeout
// and maxGatewayBody, an idle HTTP connection by httpIdleTimeout.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/soheilhy/cmux"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Bounds of the listener's stages (see the comment at the top).
const (
	sniffTimeout       = 10 * time.Second
	httpIdleTimeout    = 60 * time.Second
	httpMaxHeaderBytes = 64 << 10
)

// httpHeaderTimeout bounds the reading of an HTTP request's headers (a
// variable for the tests).
var httpHeaderTimeout = 10 * time.Second

// Serve serves the etcd API on lis until ctx ends or lis fails: gRPC on
// gs (on which Register registered the API, with GRPCOptions), natively,
// and on the same listener the JSON gateway, /version and /health over
// HTTP/1.1 and HTTP/2. tlsConfig nil: plaintext (h2c); otherwise Serve
// does the TLS handshake with it, offering ALPN h2 and http/1.1. Serve
// stops gs and closes lis before it returns; it returns nil when ctx
// ended.
func (s *Server) Serve(ctx context.Context, lis net.Listener, gs *grpc.Server, tlsConfig *tls.Config) error {
	if tlsConfig != nil {
		lis = &tlsListener{Listener: lis, config: withALPN(tlsConfig)}
	}
	m := cmux.New(lis)
	m.SetReadTimeout(sniffTimeout)
	grpcL := m.MatchWithWriters(cmux.HTTP2MatchHeaderFieldPrefixSendSettings("content-type", "application/grpc"))
	h2L := &ackFilterListener{Listener: m.Match(cmux.HTTP2())}
	h1L := m.Match(cmux.Any())

	gw, err := s.newGateway(ctx)
	if err != nil {
		lis.Close()
		return err
	}
	hs := &http.Server{
		Handler:           gw,
		ReadHeaderTimeout: httpHeaderTimeout,
		IdleTimeout:       httpIdleTimeout,
		MaxHeaderBytes:    httpMaxHeaderBytes,
		// No ReadTimeout nor WriteTimeout: a watch's answer is a stream;
		// a request's body has its own deadline (gateway.go).
		BaseContext: func(net.Listener) context.Context { return ctx },
		ConnContext: gw.connContext,
		ConnState:   gw.connState,
		ErrorLog:    log.New(io.Discard, "", 0), // a client's bad request is not the server's error
	}
	hs.Protocols = new(http.Protocols)
	hs.Protocols.SetHTTP1(true)
	hs.Protocols.SetUnencryptedHTTP2(true) // h2L's connections, TLS already undone

	var wg sync.WaitGroup
	errc := make(chan error, 5)
	serve := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errc <- f()
		}()
	}
	serve(func() error { return gs.Serve(grpcL) })
	serve(func() error { return gs.Serve(gw.pipe) })
	serve(func() error { return hs.Serve(h1L) })
	serve(func() error { return hs.Serve(h2L) })
	serve(m.Serve)

	select {
	case <-ctx.Done():
		err = nil
	case err = <-errc:
		if ctx.Err() != nil {
			err = nil
		}
	}
	lis.Close()
	m.Close()
	gw.close()
	gs.Stop() // streams are long-lived: close them rather than wait for them
	hs.Close()
	wg.Wait()
	if err != nil && !errors.Is(err, grpc.ErrServerStopped) && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) && !errors.Is(err, cmux.ErrListenerClosed) && !errors.Is(err, cmux.ErrServerClosed) {
		return fmt.Errorf("etcd API listener: %w", err)
	}
	return nil
}

// tlsListener hands out server-side TLS connections whose handshake is
// still to be done: it happens at the first read, when the mux sniffs the
// connection on a goroutine of its own, within sniffTimeout.
type tlsListener struct {
	net.Listener
	config *tls.Config
}

func (l *tlsListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return tls.Server(c, l.config), nil
}

// alpn is what the listener offers in ALPN: gRPC and HTTP/2 first.
var alpn = []string{"h2", "http/1.1"}

// withALPN is c offering alpn, including in the configurations its
// GetConfigForClient returns (ServerTLS's, for members).
func withALPN(c *tls.Config) *tls.Config {
	c = c.Clone()
	c.NextProtos = alpn
	if get := c.GetConfigForClient; get != nil {
		c.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			cc, err := get(h)
			if cc == nil || err != nil {
				return cc, err
			}
			cc = cc.Clone()
			cc.NextProtos = alpn
			return cc, nil
		}
	}
	return c
}

// connCreds are the etcd gRPC server's transport credentials: the
// listener has done any TLS handshake already (Serve), so they report
// its state, as gRPC's own TLS credentials would, without a second
// handshake. A connection of the gateway (gatewayConn) reports its HTTP
// connection's TLS state, if any; any other connection is plaintext.
type connCreds struct{}

// plainInfo is the AuthInfo of a plaintext connection.
type plainInfo struct{ credentials.CommonAuthInfo }

func (plainInfo) AuthType() string { return "insecure" }

func tlsInfo(st tls.ConnectionState) credentials.AuthInfo {
	return credentials.TLSInfo{State: st, CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}
}

func (connCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	inner := c
	if mc, ok := inner.(*cmux.MuxConn); ok {
		inner = mc.Conn
	}
	switch ic := inner.(type) {
	case *tls.Conn:
		// Handshaken already: the mux read the first request through it.
		return c, tlsInfo(ic.ConnectionState()), nil
	case *gatewayConn:
		if ic.tls != nil {
			return c, tlsInfo(*ic.tls), nil
		}
	}
	return c, plainInfo{credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
}

func (connCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("etcdapi: connCreds are a server's")
}

func (connCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tenure-etcd-listener"}
}

func (c connCreds) Clone() credentials.TransportCredentials { return c }

func (connCreds) OverrideServerName(string) error { return nil }

// ackFilterListener's connections are HTTP/2 connections the mux sniffed
// and found not to be gRPC. To learn that, its matcher sent the client a
// SETTINGS frame of its own (gRPC's clients wait for one before they send
// a request); the client's acknowledgement of it would reach the HTTP/2
// server, which sends its own SETTINGS and refuses a connection that
// acknowledges more than it sent. The filter drops that first
// acknowledgement.
type ackFilterListener struct{ net.Listener }

func (l *ackFilterListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &ackFilterConn{Conn: c}, nil
}

// HTTP/2 framing (RFC 9113): the client's preface, a frame header's size,
// the SETTINGS type and its ACK flag.
const (
	h2PrefaceLen     = 24
	h2FrameHeaderLen = 9
	h2TypeSettings   = 0x4
	h2FlagAck        = 0x1
)

// ackFilterConn passes the client's bytes on whole frames at a time until
// it has dropped the first SETTINGS acknowledgement, then reads through.
// Reads are the HTTP/2 server's reader goroutine's alone.
type ackFilterConn struct {
	net.Conn
	pending  []byte // read, to be passed on
	preface  bool   // the preface is in pending or passed on
	filtered bool   // the acknowledgement is dropped
}

func (c *ackFilterConn) Read(p []byte) (int, error) {
	for len(c.pending) == 0 {
		if c.filtered {
			return c.Conn.Read(p)
		}
		if err := c.next(); err != nil {
			return 0, err
		}
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

// next reads the preface, or one frame, into pending, dropping the first
// SETTINGS acknowledgement.
func (c *ackFilterConn) next() error {
	if !c.preface {
		c.preface = true
		c.pending = make([]byte, h2PrefaceLen)
		_, err := io.ReadFull(c.Conn, c.pending)
		return err
	}
	var h [h2FrameHeaderLen]byte
	if _, err := io.ReadFull(c.Conn, h[:]); err != nil {
		return err
	}
	n := int(h[0])<<16 | int(h[1])<<8 | int(h[2])
	if h[3] == h2TypeSettings && h[4]&h2FlagAck != 0 && n == 0 {
		c.filtered = true
		return nil
	}
	frame := make([]byte, h2FrameHeaderLen+n)
	copy(frame, h[:])
	if _, err := io.ReadFull(c.Conn, frame[h2FrameHeaderLen:]); err != nil {
		return err
	}
	c.pending = frame
	return nil
}
