package etcdapi

// The JSON gateway: etcd's HTTP mapping of its gRPC API (grpc-gateway,
// with etcd's own generated registrations, go.etcd.io/etcd/api/v3/
// etcdserverpb/gw, and etcd's marshaler options, so that requests and
// answers, errors and streams included, are byte for byte etcd's), with
// etcd's /version and /health, on the etcd API's listener (listen.go).
//
// The gateway is a client of the same gRPC server as every other etcd
// client: each HTTP connection has a gRPC connection of its own to it,
// in memory (gwConn, pipeListener), whose peer address is the HTTP
// client's and whose TLS state is the HTTP connection's. So a request
// through the gateway meets every door a gRPC request meets: the
// interceptors (metrics, "no leader"), authorization (the token header,
// or the client certificate), the request size limit, the watch limits
// per connection, forwarding from a follower to the leader.
//
// etcd's token header: Authorization: <token>, as /v3/auth/authenticate
// hands it out, reaches the server as the metadata "authorization"
// (grpc-gateway's mapping), which the server reads as etcd does when the
// metadata "token" is absent (credentialOf); Grpc-Metadata-Token works
// too, as on etcd.

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/soheilhy/cmux"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/etcdserverpb/gw"
	"go.etcd.io/etcd/api/v3/version"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// Bounds of a gateway request's body: its size (a request at etcd's
// request size limit, base64-encoded in JSON, fits), and how long it may
// take to arrive (a watch's or keepalive's answer then streams for as
// long as the client reads it).
const (
	maxGatewayBody     = maxRequestBytes * 3 / 2
	gatewayBodyTimeout = 30 * time.Second
)

// healthTimeout bounds /health's read (etcd: its request timeout).
const healthTimeout = 5 * time.Second

// ClusterVersion is the cluster version the etcd API reports (/version's
// etcdcluster): etcd's major.minor of the API version it implements
// (Status's version), as an etcd cluster of that version reports it.
// Clients such as Patroni choose their API prefix by it.
var ClusterVersion = version.Cluster(version.Version) + ".0"

// gateway is the HTTP side of the listener.
type gateway struct {
	s    *Server
	mux  *runtime.ServeMux
	pipe *pipeListener
	// conns are the HTTP connections' gateway connections, by HTTP
	// connection (connContext adds, connState removes).
	conns sync.Map
}

func (s *Server) newGateway(ctx context.Context) (*gateway, error) {
	g := &gateway{s: s, pipe: newPipeListener()}
	// etcd's options (embed.serveCtx.registerGateway).
	g.mux = runtime.NewServeMux(runtime.WithMarshalerOption(runtime.MIMEWildcard, &runtime.HTTPBodyMarshaler{
		Marshaler: &runtime.JSONPb{
			MarshalOptions:   protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: false},
			UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: true},
		},
	}))
	cc := connByRequest{}
	for _, err := range []error{
		gw.RegisterKVHandlerClient(ctx, g.mux, pb.NewKVClient(cc)),
		gw.RegisterWatchHandlerClient(ctx, g.mux, pb.NewWatchClient(cc)),
		gw.RegisterLeaseHandlerClient(ctx, g.mux, pb.NewLeaseClient(cc)),
		gw.RegisterClusterHandlerClient(ctx, g.mux, pb.NewClusterClient(cc)),
		gw.RegisterMaintenanceHandlerClient(ctx, g.mux, pb.NewMaintenanceClient(cc)),
		gw.RegisterAuthHandlerClient(ctx, g.mux, pb.NewAuthClient(cc)),
	} {
		if err != nil {
			return nil, err
		}
	}
	return g, nil
}

// close ends the gateway's connections to the gRPC server.
func (g *gateway) close() {
	g.pipe.Close()
	g.conns.Range(func(k, v any) bool {
		g.conns.Delete(k)
		v.(*gwConn).close()
		return true
	})
}

// ServeHTTP serves one HTTP request: /v3/ (and its older names /v3beta/
// and /v3alpha/) through the gateway, /version, /health.
func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// A browser sends Origin with a request a web page makes; etcd's
	// clients never do. Such a request is refused rather than served to
	// any page the user visits (no CORS either).
	if r.Header.Get("Origin") != "" {
		http.Error(w, "etcdserver: a request from a web page (with an Origin header) is refused", http.StatusForbidden)
		return
	}
	p := r.URL.Path
	for _, alias := range []string{"/v3beta/", "/v3alpha/"} {
		if rest, ok := strings.CutPrefix(p, alias); ok {
			p = "/v3/" + rest
			r.URL.Path, r.URL.RawPath = p, ""
		}
	}
	switch {
	case strings.HasPrefix(p, "/v3/"):
		g.serveAPI(w, r)
	case p == "/version":
		g.serveVersion(w, r)
	case p == "/health":
		g.serveHealth(w, r)
	default:
		http.NotFound(w, r)
	}
}

// serveAPI serves a request of the gateway, its body bounded in size and
// in time.
func (g *gateway) serveAPI(w http.ResponseWriter, r *http.Request) {
	if r.Body != nil && r.Body != http.NoBody {
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Now().Add(gatewayBodyTimeout))
		r.Body = &boundedBody{ReadCloser: http.MaxBytesReader(w, r.Body, maxGatewayBody), rc: rc}
	}
	g.mux.ServeHTTP(w, r)
}

// boundedBody lifts the body's read deadline once it has been read
// whole: the connection then only waits for the client to go.
type boundedBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	done bool
}

func (b *boundedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) && !b.done {
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// serveVersion answers etcd's /version.
func (g *gateway) serveVersion(w http.ResponseWriter, r *http.Request) {
	if !allowGet(w, r) {
		return
	}
	b, _ := json.Marshal(version.Versions{Server: version.Version, Cluster: ClusterVersion, Storage: ClusterVersion})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// health is /health's answer, as etcd's.
type health struct {
	Health string `json:"health"`
	Reason string `json:"reason"`
}

// serveHealth answers etcd's /health: healthy when this node knows a
// leader and a linearizable read succeeds (?serializable=true: when this
// node answers at all), with etcd's reasons otherwise (503).
func (g *gateway) serveHealth(w http.ResponseWriter, r *http.Request) {
	if !allowGet(w, r) {
		return
	}
	h := health{Health: "true"}
	if r.URL.Query().Get("serializable") != "true" {
		if g.s.front.Leader() == "" {
			h = health{Health: "false", Reason: "RAFT NO LEADER"}
		} else if err := g.s.healthRead(r.Context()); err != nil {
			h = health{Health: "false", Reason: "RANGE ERROR:" + err.Error()}
		}
	}
	d, _ := json.Marshal(h)
	if h.Health != "true" {
		http.Error(w, string(d), http.StatusServiceUnavailable)
		return
	}
	_, _ = w.Write(d)
}

// healthRead is /health's check that the cluster answers reads: on the
// leader a linearizable read, on a follower the leader's answer to a
// request that needs no credential.
func (s *Server) healthRead(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	fw, err := s.forward(ctx)
	if err != nil {
		return err
	}
	if fw == nil {
		return toGRPC(s.linearizable(ctx))
	}
	_, err = pb.NewAuthClient(fw.conn).AuthStatus(fw.ctx, &pb.AuthStatusRequest{})
	return err
}

func allowGet(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet {
		return true
	}
	w.Header().Set("Allow", http.MethodGet)
	http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
	return false
}

// gwConnKey is the context key of a request's gwConn.
type gwConnKey struct{}

// connContext gives an HTTP connection its gateway connection.
func (g *gateway) connContext(ctx context.Context, c net.Conn) context.Context {
	gc := &gwConn{pipe: g.pipe, remote: c.RemoteAddr(), tls: tlsStateOf(c)}
	g.conns.Store(c, gc)
	return context.WithValue(ctx, gwConnKey{}, gc)
}

// connState closes an HTTP connection's gateway connection with it.
func (g *gateway) connState(c net.Conn, st http.ConnState) {
	if st != http.StateClosed && st != http.StateHijacked {
		return
	}
	if v, ok := g.conns.LoadAndDelete(c); ok {
		v.(*gwConn).close()
	}
}

// tlsStateOf is the TLS state of an HTTP connection of the listener (nil:
// plaintext). A member's forwarding identity (the forwarding server name)
// is not a caller's: such a connection counts as one without a
// certificate.
func tlsStateOf(c net.Conn) *tls.ConnectionState {
	for {
		switch cc := c.(type) {
		case *ackFilterConn:
			c = cc.Conn
		case *cmux.MuxConn:
			c = cc.Conn
		case *tls.Conn:
			st := cc.ConnectionState()
			if st.ServerName == forwardServerName {
				return nil
			}
			return &st
		default:
			return nil
		}
	}
}

// gwConn is an HTTP connection's gRPC connection to the server, made at
// its first gateway request and closed with it.
type gwConn struct {
	pipe   *pipeListener
	remote net.Addr
	tls    *tls.ConnectionState
	// mu guards cc and closed.
	mu     sync.Mutex
	cc     *grpc.ClientConn
	closed bool
}

// gwConnBuffer is the gateway's gRPC connections' buffer size each way
// (gRPC's default is 32 KiB): one per HTTP connection.
const gwConnBuffer = 8 << 10

func (c *gwConn) conn() (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, status.Error(codes.Canceled, "etcdserver: the connection is closed")
	}
	if c.cc == nil {
		cc, err := grpc.NewClient("passthrough:///tenure-etcd-gateway",
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return c.pipe.dial(ctx, c) }),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32)),
			grpc.WithReadBufferSize(gwConnBuffer), grpc.WithWriteBufferSize(gwConnBuffer))
		if err != nil {
			return nil, status.Errorf(codes.Internal, "etcdserver: gateway: %v", err)
		}
		c.cc = cc
	}
	return c.cc, nil
}

func (c *gwConn) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.cc != nil {
		_ = c.cc.Close()
	}
}

// connByRequest is the gateway's client connection: each call goes on
// the gRPC connection of the HTTP connection it came on.
type connByRequest struct{}

func connOf(ctx context.Context) (*grpc.ClientConn, error) {
	gc, ok := ctx.Value(gwConnKey{}).(*gwConn)
	if !ok {
		return nil, status.Error(codes.Internal, "etcdserver: gateway: a request without its connection")
	}
	return gc.conn()
}

func (connByRequest) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	cc, err := connOf(ctx)
	if err != nil {
		return err
	}
	return cc.Invoke(ctx, method, args, reply, opts...)
}

func (connByRequest) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cc, err := connOf(ctx)
	if err != nil {
		return nil, err
	}
	return cc.NewStream(ctx, desc, method, opts...)
}

// pipeListener is the gRPC server's listener for the gateway's
// connections, in memory.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

// dial connects gc to the server; the server's end reports gc's HTTP
// client as its peer.
func (l *pipeListener) dial(ctx context.Context, gc *gwConn) (net.Conn, error) {
	client, srv := net.Pipe()
	select {
	case l.conns <- &gatewayConn{Conn: srv, remote: gc.remote, tls: gc.tls}:
		return client, nil
	case <-l.done:
	case <-ctx.Done():
	}
	client.Close()
	srv.Close()
	return nil, net.ErrClosed
}

// pipeAddr is the address of the gateway's side of its connections.
type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "etcd-gateway" }

// gatewayConn is the server's end of a gateway connection: its peer is
// the HTTP client, its TLS state the HTTP connection's (connCreds).
type gatewayConn struct {
	net.Conn
	remote net.Addr
	tls    *tls.ConnectionState
}

func (c *gatewayConn) RemoteAddr() net.Addr { return c.remote }
func (c *gatewayConn) LocalAddr() net.Addr  { return pipeAddr{} }
