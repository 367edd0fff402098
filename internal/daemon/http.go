package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tenure-io/tenure/internal/server"
)

// The HTTP listener (Config.HTTPListen) serves:
//
//	/metrics        Prometheus exposition of internal/metrics
//	/healthz        200 while the process is up; with ?verbose, also
//	                the node's readiness and, on the leader, the members
//	                that do not answer it ("degraded: n3 unreachable")
//	/readyz         200 when the node knows a leader, has applied what is
//	                committed and its storage accepts a write; else 503
//	                with the reason
//	/debug/pprof/   Go's profiles, only with Config.Pprof
//	/               the dashboard (internal/dashboard)
//
// It is plain HTTP on the address given (loopback by default), or TLS
// with Config.HTTPTLS.
//
// It is a door like the client API's (docs/security.md, "The HTTP
// listener"). With Config.Auth every path but /healthz, /readyz and the
// dashboard's page and files (which hold no data) needs a credential the
// cluster knows, resolved and checked as the API's are
// (server.AuthorizeHTTP): an ACL token as "Authorization: Bearer SECRET",
// or the client certificate of a TLS listener. /metrics needs cluster
// read (unless Config.MetricsPublic), /debug/pprof/ cluster write (the
// management policy's), and the dashboard's API what each view reads
// (server.Dashboard). Always: a request whose Host is not the listener's
// (DNS rebinding) is refused 421, and every answer carries headers that
// forbid framing, sniffing and foreign content.

// DefaultHTTPListen is `tenure serve`'s --http-listen default.
const DefaultHTTPListen = "127.0.0.1:7071"

// httpReadTimeout bounds the reading of one request, headers and body;
// httpIdleTimeout how long a kept-alive connection may wait for its next
// request.
const (
	httpReadTimeout = 30 * time.Second
	httpIdleTimeout = 60 * time.Second
)

// httpShutdownTimeout bounds a graceful stop of the HTTP listener; open
// streams are closed after it.
const httpShutdownTimeout = 2 * time.Second

// contentSecurityPolicy lets a page of the listener load only its own
// scripts, styles and data, and be framed by nobody.
const contentSecurityPolicy = "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"

// httpDoor is what the HTTP listener checks of every request.
type httpDoor struct {
	srv *server.Server
	// metricsPublic: /metrics needs no credential.
	metricsPublic bool
	hosts         hostCheck
}

// gate serves h to callers with need (server.AuthorizeHTTP); others get
// 401 or 403 with the reason in one line.
func (g httpDoor) gate(need server.HTTPNeed, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := server.HTTPContext(r)
		if err := g.srv.AuthorizeHTTP(ctx, "HTTP "+r.Method+" "+r.URL.Path, need); err != nil {
			code := server.HTTPStatus(err)
			if code == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="tenure"`)
			}
			http.Error(w, err.Error(), code)
			return
		}
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// guard sets the security headers on every answer and refuses a request
// whose Host is not the listener's (the health endpoints excepted: a
// load balancer's probe may name any host, and they answer no data).
func (g httpDoor) guard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", contentSecurityPolicy)
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		if p := r.URL.Path; p != "/healthz" && p != "/readyz" && !g.hosts.allowed(r.Host) {
			http.Error(w, fmt.Sprintf("tenure: Host %q is not this listener's (%s); --http-allowed-hosts names others", r.Host, g.hosts), http.StatusMisdirectedRequest)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func (d *Daemon) httpHandler(pprofOn bool, dash http.Handler) http.Handler {
	g := d.httpDoor
	mux := http.NewServeMux()
	mux.Handle("/", g.gate(server.HTTPKnownCaller, dash))
	// The page and its files hold no data: the page asks for a token.
	mux.Handle("GET /{$}", dash)
	mux.Handle("GET /static/", dash)
	metrics := promhttp.HandlerFor(d.Hub.Metrics().Registry(), promhttp.HandlerOpts{})
	if !g.metricsPublic {
		metrics = g.gate(server.HTTPClusterRead, metrics)
	}
	mux.Handle("GET /metrics", metrics)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if _, verbose := r.URL.Query()["verbose"]; verbose {
			d.healthVerbose(w)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		h := d.Node.Health()
		if !h.Ready() {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready: %s\n", h.Reason())
			return
		}
		fmt.Fprintln(w, "ready")
	})
	if pprofOn {
		prof := func(f http.HandlerFunc) http.Handler { return g.gate(server.HTTPClusterWrite, f) }
		mux.Handle("GET /debug/pprof/", prof(pprof.Index))
		mux.Handle("GET /debug/pprof/cmdline", prof(pprof.Cmdline))
		mux.Handle("GET /debug/pprof/profile", prof(pprof.Profile))
		mux.Handle("GET /debug/pprof/symbol", prof(pprof.Symbol))
		mux.Handle("GET /debug/pprof/trace", prof(pprof.Trace))
	}
	return g.guard(mux)
}

// listenHTTP opens the HTTP listener, with the dashboard dash at /.
func (d *Daemon) listenHTTP(addr string, pprofOn bool, dash http.Handler) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("http listen on %s: %w", addr, err)
	}
	d.httpLis = d.conns.wrap(lis)
	d.httpSrv = &http.Server{
		Handler:           d.httpHandler(pprofOn, dash),
		ReadHeaderTimeout: 10 * time.Second,
		// A request is read whole within ReadTimeout; a kept-alive
		// connection that sends nothing more is closed after IdleTimeout.
		// No WriteTimeout: the dashboard's event streams are long
		// answers.
		ReadTimeout: httpReadTimeout,
		IdleTimeout: httpIdleTimeout,
	}
	return nil
}

// HTTPAddr is the HTTP listener's address ("" when there is none).
func (d *Daemon) HTTPAddr() string {
	if d.httpLis == nil {
		return ""
	}
	return d.httpLis.Addr().String()
}

// serveHTTP serves until ctx ends, then shuts the listener down. Requests
// see ctx end (the dashboard's event streams stop then).
func (d *Daemon) serveHTTP(ctx context.Context) error {
	d.httpSrv.BaseContext = func(net.Listener) context.Context { return ctx }
	lis := d.httpLis
	if d.httpTLS != nil {
		lis = tls.NewListener(lis, d.httpTLS)
	}
	errc := make(chan error, 1)
	go func() { errc <- d.httpSrv.Serve(lis) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), httpShutdownTimeout)
	defer cancel()
	if err := d.httpSrv.Shutdown(sctx); err != nil {
		d.httpSrv.Close() // streams still open: close them
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// healthVerbose writes /healthz?verbose: one line per check, "[+]" or
// "[-]" as Kubernetes' components write theirs. It is still 200: the
// process is up. A degraded cluster (a member does not answer the leader)
// that keeps its quorum is ready; a follower does not watch its peers and
// says which node does.
func (d *Daemon) healthVerbose(w io.Writer) {
	fmt.Fprintln(w, "[+]process ok")
	h := d.Node.Health()
	if h.Ready() {
		fmt.Fprintln(w, "[+]ready ok")
	} else {
		fmt.Fprintf(w, "[-]ready failed: %s\n", h.Reason())
	}
	switch degraded := d.Node.Degraded(); {
	case !h.IsLeader && h.Leader != "":
		fmt.Fprintf(w, "[+]members not watched here: the leader (%s) watches them\n", h.Leader)
	case !h.IsLeader:
		fmt.Fprintln(w, "[-]members unknown: no leader")
	case degraded != "":
		fmt.Fprintf(w, "[-]members degraded: %s\n", degraded)
	default:
		fmt.Fprintln(w, "[+]members ok")
	}
	fmt.Fprintf(w, "healthz check passed (node %s)\n", d.Node.ID())
}
