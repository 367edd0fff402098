package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The HTTP listener (Config.HTTPListen) serves:
//
//	/metrics        Prometheus exposition of internal/metrics
//	/healthz        200 while the process is up
//	/readyz         200 when the node knows a leader, has applied what is
//	                committed and its storage accepts a write; else 503
//	                with the reason
//	/debug/pprof/   Go's profiles, only with Config.Pprof
//	/               the dashboard (internal/dashboard)
//
// It is plain HTTP on the address given (loopback by default).

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

func (d *Daemon) httpHandler(pprofOn bool, dash http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", dash)
	mux.Handle("GET /metrics", promhttp.HandlerFor(d.Hub.Metrics().Registry(), promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
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
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	return mux
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
	errc := make(chan error, 1)
	go func() { errc <- d.httpSrv.Serve(d.httpLis) }()
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
