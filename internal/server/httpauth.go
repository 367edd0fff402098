package server

// The HTTP listener's door (internal/daemon/http.go and the dashboard):
// an HTTP request answers to the same identity resolution, ACL check and
// refusal log as a gRPC request (auth.go).
//
// Its credential is carried where a gRPC request carries its own:
// HTTPContext puts the bearer token of its Authorization header into the
// incoming metadata as tenure-auth-token, and its verified TLS client
// certificate into the peer's TLS state, so that callerOf resolves an
// HTTP caller exactly as a gRPC one, again at every use (a token revoked
// stops working at once). Under --auth, a request that carries no
// credential, or one the cluster does not know, is ErrUnauthenticated
// (HTTP 401); one whose caller lacks the right is the API's denial (HTTP
// 403). Both are logged as the API's refusals are (method "HTTP GET
// /path", code PermissionDenied: what the gRPC API answers the same
// caller).
//
// The dashboard's actions run the API's own methods (callHTTP): the same
// authorize, handler, metrics and refusal log as the gRPC call.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/node"
)

// ErrUnauthenticated is returned for an HTTP request to a node that runs
// with --auth when the request carries no credential (no bearer token, no
// verified client certificate) or a token the cluster does not know.
var ErrUnauthenticated = errors.New("tenure: unauthenticated")

// errBadAuthorization: an Authorization header that is not a bearer token.
var errBadAuthorization = errors.New("the Authorization header is not \"Bearer SECRET\"")

// httpCredKey marks a context made by HTTPContext; its value is the
// Authorization header's problem, if any.
type httpCredKey struct{}

// HTTPContext returns r's context carrying r's credential as a gRPC
// request's context carries its own: the secret of an "Authorization:
// Bearer SECRET" header as the tenure-auth-token metadata, and the client
// certificate the TLS layer verified (r.TLS) as the peer's. Any other
// Authorization header is no credential (ErrUnauthenticated under --auth).
func HTTPContext(r *http.Request) context.Context {
	ctx := r.Context()
	var bad error
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, secret, _ := strings.Cut(h, " ")
		secret = strings.TrimSpace(secret)
		if !strings.EqualFold(scheme, "Bearer") || secret == "" {
			bad = errBadAuthorization
		} else {
			ctx = metadata.NewIncomingContext(ctx, metadata.Pairs(AuthTokenHeader, secret))
		}
	}
	if r.TLS != nil {
		p := &peer.Peer{AuthInfo: credentials.TLSInfo{State: *r.TLS}}
		ctx = peer.NewContext(ctx, p)
	}
	return context.WithValue(ctx, httpCredKey{}, bad)
}

// HTTPNeed is what an HTTP endpoint needs of its caller.
type HTTPNeed int

// The needs of the HTTP listener's endpoints.
const (
	// HTTPKnownCaller: any caller the cluster knows (a valid token, or a
	// verified client certificate).
	HTTPKnownCaller HTTPNeed = iota + 1
	// HTTPClusterRead: cluster read (/metrics, the dashboard's cluster view).
	HTTPClusterRead
	// HTTPClusterWrite: cluster write, which the management policy grants
	// (/debug/pprof).
	HTTPClusterWrite
)

// AuthorizeHTTP checks that the caller of ctx (made by HTTPContext) may
// use an endpoint that needs need; what names the request in the refusal
// log (e.g. "HTTP GET /metrics"). nil when auth is off. Otherwise
// ErrUnauthenticated for an unknown caller, or the API's denial (an error
// matching fsm.ErrPermissionDenied, or node.ErrNotLeader from a follower
// whose copy of the ACLs may be behind: see deny). Every refusal is
// logged. Safe for concurrent use.
func (s *Server) AuthorizeHTTP(ctx context.Context, what string, need HTTPNeed) error {
	if !s.AuthEnforced() {
		return nil
	}
	c, sec, err := s.httpCaller(ctx, what)
	if err != nil {
		return err
	}
	var r []right
	switch need {
	case HTTPKnownCaller:
	case HTTPClusterRead:
		r = []right{clusterRead}
	default:
		r = []right{clusterWrite}
	}
	return s.httpRefused(what, s.check(c, sec, what, r...))
}

// httpCaller resolves the caller of ctx; ErrUnauthenticated (logged) if
// the cluster does not know it.
func (s *Server) httpCaller(ctx context.Context, what string) (caller, *fsm.Security, error) {
	sec := s.node.Security()
	if bad, _ := ctx.Value(httpCredKey{}).(error); bad != nil {
		return caller{}, sec, s.httpRefused(what, fmt.Errorf("%w: %v", ErrUnauthenticated, bad))
	}
	c := callerOf(ctx, sec)
	switch {
	case c.badToken:
		return c, sec, s.httpRefused(what, fmt.Errorf("%w: the bearer token is unknown or revoked", ErrUnauthenticated))
	case c.kind == "":
		return c, sec, s.httpRefused(what, fmt.Errorf("%w: no credential: send an ACL token as \"Authorization: Bearer SECRET\", or a client certificate", ErrUnauthenticated))
	}
	return c, sec, nil
}

// httpRefused logs err, a refusal of an HTTP request, as the API logs its
// own (observe.go: refused), and returns it.
func (s *Server) httpRefused(what string, err error) error {
	if err != nil {
		s.refused(what, codes.PermissionDenied, err.Error())
	}
	return err
}

// httpAccess is what the caller of an HTTP request may read, for
// filtering what the dashboard lists. With auth off it allows everything.
type httpAccess struct {
	on  bool
	c   caller
	sec *fsm.Security
}

// accessHTTP resolves ctx's caller for filtering: ErrUnauthenticated if
// it is unknown, and a denial (403) if need is set and the caller lacks
// it (what names the request in the log).
func (s *Server) accessHTTP(ctx context.Context, what string, need ...right) (httpAccess, error) {
	if !s.AuthEnforced() {
		return httpAccess{}, nil
	}
	c, sec, err := s.httpCaller(ctx, what)
	if err != nil {
		return httpAccess{}, err
	}
	if err := s.httpRefused(what, s.check(c, sec, what, need...)); err != nil {
		return httpAccess{}, err
	}
	return httpAccess{on: true, c: c, sec: sec}, nil
}

// can reports whether the caller may read name of kind.
func (a httpAccess) can(kind fsm.Kind, name string) bool {
	return !a.on || a.sec.Allowed(a.c.policies, kind, name, fsm.AccessRead)
}

// anyOf reports whether some rule of the caller's policies grants read
// (or write) on some name of kind: a listing of that kind is then
// answered, filtered; otherwise it is refused.
func (a httpAccess) anyOf(kind fsm.Kind) bool {
	if !a.on {
		return true
	}
	for _, p := range a.sec.Policies() {
		if !contains(a.c.policies, p.Name) {
			continue
		}
		for _, r := range p.Rules {
			if r.Kind == kind && (r.Access == fsm.AccessRead || r.Access == fsm.AccessWrite) {
				return true
			}
		}
	}
	return false
}

// listHTTP resolves ctx's caller for a listing of kind: refused (403,
// logged) if no rule of the caller's grants read on any name of kind.
func (s *Server) listHTTP(ctx context.Context, what string, kind fsm.Kind) (httpAccess, error) {
	a, err := s.accessHTTP(ctx, what)
	if err != nil {
		return a, err
	}
	if !a.anyOf(kind) {
		return a, s.httpRefused(what, s.deny(a.c, what, fmt.Sprintf("%s read on some name", kind)))
	}
	return a, nil
}

// contains reports whether list holds s.
func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// callHTTP serves req, a request of the API's method, for an HTTP
// request whose context is ctx (HTTPContext), exactly as the gRPC API
// serves it (wire.go): the caller must be known (ErrUnauthenticated),
// then authorize checks req's rights, then h (the API's own method) runs;
// the call is counted in the API's metrics under method and a refusal is
// logged as the API's.
func (s *Server) callHTTP(ctx context.Context, method string, req any, h func() error) error {
	start := time.Now()
	if s.AuthEnforced() {
		if _, _, err := s.httpCaller(ctx, method); err != nil {
			return err
		}
	}
	err := toStatus(s.authorize(ctx, method, req))
	if err == nil {
		err = h()
	}
	s.answered(method, err, true, time.Since(start))
	return err
}

// HTTPStatus is the HTTP status an error of AuthorizeHTTP, or of an API
// method called for an HTTP request, is answered with.
func HTTPStatus(err error) int {
	switch {
	case errors.Is(err, ErrUnauthenticated):
		return http.StatusUnauthorized
	case errors.Is(err, fsm.ErrPermissionDenied), errors.Is(err, node.ErrNotLeader):
		// A follower answers what it would deny "not the leader" (deny):
		// to an HTTP caller it is a refusal all the same.
		return http.StatusForbidden
	}
	switch status.Code(err) {
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.InvalidArgument:
		return http.StatusBadRequest
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusConflict
}
