package server

// The identity and rights of auth.go, for the other doors of a node
// (internal/etcdapi): they resolve their callers and check their rights
// with the same tables, the same longest-prefix rules and the same
// denial log as Tenure's own API, so that no door answers to other
// rules.

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"

	"github.com/tenure-io/tenure/internal/fsm"
)

// Caller is who sent a request to another door of the node, resolved
// against one copy of the ACLs (ResolveCaller). The zero Caller is
// anonymous.
type Caller struct{ c caller }

// Anonymous reports whether the caller presented no credential: no auth
// token and no verified client certificate with a name.
func (c Caller) Anonymous() bool { return c.c.kind == "" && !c.c.badToken }

// BadToken reports whether the caller presented an auth token the ACLs
// do not know (never created, or revoked).
func (c Caller) BadToken() bool { return c.c.badToken }

// Identity is what a session created by the caller records
// ("token:<id>", "cert:<name>", "" anonymous).
func (c Caller) Identity() string { return c.c.identity() }

func (c Caller) String() string { return c.c.String() }

// Right is one thing a request needs: read or write on a name of a kind,
// or on every name under a prefix.
type Right = right

// ReadRight is read on name of kind.
func ReadRight(kind fsm.Kind, name string) Right { return read(kind, name) }

// WriteRight is write on name of kind.
func WriteRight(kind fsm.Kind, name string) Right { return write(kind, name) }

// ReadUnderRight is read on every name of kind that starts with prefix.
func ReadUnderRight(kind fsm.Kind, prefix string) Right { return readUnder(kind, prefix) }

// WriteUnderRight is write on every name of kind that starts with prefix.
func WriteUnderRight(kind fsm.Kind, prefix string) Right { return writeUnder(kind, prefix) }

// ClusterRead and ClusterWrite are the rights on the cluster itself
// (listing and changing the ACLs, the members, the limits).
var (
	ClusterRead  Right = clusterRead
	ClusterWrite Right = clusterWrite
)

// ResolveCaller resolves a caller against sec: with hasToken, by the
// auth token secret token (BadToken when sec knows none); otherwise, when
// forwardedCert is not nil, by those names of a client certificate another
// member verified (forwardedCert: see internal/etcdapi's forwarding); otherwise by the
// verified client certificate of ctx's connection, or anonymous.
func (s *Server) ResolveCaller(ctx context.Context, sec *fsm.Security, token string, hasToken bool, forwardedCert []string) Caller {
	if hasToken {
		t, ok := sec.TokenBySecret(token)
		if !ok {
			return Caller{caller{badToken: true}}
		}
		return Caller{caller{kind: "token", name: t.ID, policies: t.Policies}}
	}
	if forwardedCert != nil {
		return Caller{certCaller(sec, forwardedCert)}
	}
	cert := clientCert(ctx)
	if cert == nil {
		return Caller{}
	}
	return Caller{certCaller(sec, certNames(cert))}
}

// CertNames are the names of the verified client certificate of ctx's
// connection (common name first), nil without one.
func CertNames(ctx context.Context) []string {
	cert := clientCert(ctx)
	if cert == nil {
		return nil
	}
	return certNames(cert)
}

// certCaller is the caller a certificate with names is: the policies
// bound to any of its names.
func certCaller(sec *fsm.Security, names []string) caller {
	if len(names) == 0 {
		return caller{}
	}
	c := caller{kind: "cert", name: names[0]}
	seen := map[string]bool{}
	for _, n := range names {
		if b, ok := sec.Binding(n); ok {
			for _, p := range b.Policies {
				if !seen[p] {
					seen[p] = true
					c.policies = append(c.policies, p)
				}
			}
		}
	}
	return c
}

// Missing returns the first right of rights that sec does not grant c
// (ok false), or ok true when c has them all. A bad token has none.
func (s *Server) Missing(c Caller, sec *fsm.Security, rights ...Right) (missing Right, ok bool) {
	for _, r := range rights {
		var granted bool
		switch {
		case c.c.badToken:
		case r.under:
			granted = sec.AllowedUnder(c.c.policies, r.kind, r.name, r.need)
		default:
			granted = sec.Allowed(c.c.policies, r.kind, r.name, r.need)
		}
		if !granted {
			return r, false
		}
	}
	return Right{}, true
}

// Denied logs a denial (with the refusals of Tenure's own API, at most
// a few lines a second) and returns it: fsm.ErrPermissionDenied naming
// the method, the right and the caller. The caller decides whether its
// copy of the ACLs is current enough to deny (see deny).
func (s *Server) Denied(c Caller, method string, r Right) error {
	err := fmt.Errorf("%w: %s: %s is not granted to %s", fsm.ErrPermissionDenied, method, r, c.c)
	s.refused(method, codes.PermissionDenied, err.Error())
	return err
}
