package etcdapi

// Authorization. Under auth (serve --auth) every etcd request answers to
// Tenure's ACLs (internal/server's tables and rules, etcdauth.go there):
// its caller is the Tenure token whose secret is the etcd auth token of
// the request (etcd's "token" metadata, or "authorization" from the JSON
// gateway, which Authenticate hands out for a token's id and secret,
// users.go), or the client certificate of its connection; etcd keys are
// kv names, checked by prefix (spanRight).
//
// A denial is decided on current ACLs: a node that is not a caught-up
// leader may hold a copy that lags a grant its client has already seen
// acknowledged, so before it denies it waits until its state has caught
// up with the leader's (catchUp) and checks again.
//
// Streams (Watch, LeaseKeepAlive) resolve their caller's credential when
// they open and check it again against the node's current ACLs before
// every event or renewal they deliver and every revokeCheckInterval, so
// that a revoked token or a changed policy ends them within a second.

import (
	"bytes"
	"context"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/server"
)

// LeaseSessionName is the session name whose write right etcd leases
// need (a rule session:etcd:write, or any rule that covers it).
const LeaseSessionName = "etcd"

// credential is what a request presented: an auth token, or the
// certificate names a member forwarded, or neither (the connection's
// own certificate, or anonymous).
type credential struct {
	token     string
	hasToken  bool
	forwarded []string // non-nil: a forwarded request's certificate names
}

// credentialOf reads the credential of the request whose context is ctx.
// Certificate names forwarded in the metadata count only on a connection
// from a member (fromMember); such a connection's own certificate is a
// member's, never a caller's.
func credentialOf(ctx context.Context) credential {
	md, _ := metadata.FromIncomingContext(ctx)
	var c credential
	c.token, c.hasToken = tokenOf(md)
	if fromMember(ctx) {
		c.forwarded = append([]string{}, md.Get(forwardedCertKey)...)
	}
	return c
}

// tokenOf is a request's etcd auth token, as etcd reads it: the metadata
// "token" (etcd's gRPC clients), else "authorization" (the JSON gateway's
// Authorization header, gateway.go).
func tokenOf(md metadata.MD) (string, bool) {
	for _, k := range []string{rpctypes.TokenFieldNameGRPC, rpctypes.TokenFieldNameSwagger} {
		if vs := md.Get(k); len(vs) > 0 {
			return vs[0], true
		}
	}
	return "", false
}

// fromMember reports whether ctx's connection is another member's: made
// with the forwarding server name and a certificate verified against the
// peers' CA (forwardTLS).
func fromMember(ctx context.Context) bool {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return false
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	return ok && info.State.ServerName == forwardServerName && len(info.State.VerifiedChains) > 0
}

// authorize checks that the caller of the request whose context is ctx
// has every right of rights; nil when auth is off.
func (s *Server) authorize(ctx context.Context, method string, rights ...server.Right) error {
	return s.authorizeCred(ctx, credentialOf(ctx), method, rights...)
}

// authorizeCred is authorize for a credential read already. Its errors
// are etcd's: "user name is empty" for no credential, "invalid auth
// token" for a token the ACLs do not know, "permission denied" for a
// missing right (logged with the right and the caller). nil when auth is
// off.
func (s *Server) authorizeCred(ctx context.Context, cred credential, method string, rights ...server.Right) error {
	if !s.srv.AuthEnforced() {
		return nil
	}
	c, missing, ok := s.decide(ctx, cred, rights)
	if ok {
		return nil
	}
	if !c.Anonymous() && !s.front.CaughtUpLeader() {
		if err := s.catchUp(ctx); err != nil {
			return err
		}
		if c, missing, ok = s.decide(ctx, cred, rights); ok {
			return nil
		}
	}
	switch {
	case c.Anonymous():
		return rpctypes.ErrGRPCUserEmpty
	case c.BadToken():
		return rpctypes.ErrGRPCInvalidAuthToken
	}
	_ = s.srv.Denied(c, "etcd."+method, missing)
	return rpctypes.ErrGRPCPermissionDenied
}

// decide checks rights against this node's current ACLs.
func (s *Server) decide(ctx context.Context, cred credential, rights []server.Right) (server.Caller, server.Right, bool) {
	sec := s.front.Security()
	c := s.srv.ResolveCaller(ctx, sec, cred.token, cred.hasToken, cred.forwarded)
	if c.Anonymous() || c.BadToken() {
		return c, server.Right{}, false
	}
	missing, ok := s.srv.Missing(c, sec, rights...)
	return c, missing, ok
}

// catchUpWait bounds how long a follower waits for its state to reach
// the leader's revision before it decides a denial.
const catchUpWait = 5 * time.Second

// catchUp returns once this node's state has caught up with the leader's
// at the time of the call: on the leader, a linearizable read; on a
// follower, the leader's current revision (from its AuthStatus, which
// needs no credential, as etcd's) reached by this node.
func (s *Server) catchUp(ctx context.Context) error {
	fw, err := s.forward(ctx)
	if err != nil {
		return err
	}
	if fw == nil {
		return toGRPC(s.linearizable(ctx))
	}
	st, err := pb.NewAuthClient(fw.conn).AuthStatus(fw.ctx, &pb.AuthStatusRequest{})
	if err != nil {
		return err
	}
	want := uint64(st.GetHeader().GetRevision())
	if s.revision() >= want {
		return nil
	}
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	deadline := time.NewTimer(catchUpWait)
	defer deadline.Stop()
	for s.revision() < want {
		select {
		case <-ctx.Done():
			return toGRPC(ctx.Err())
		case <-deadline.C:
			return status.Errorf(codes.Unavailable, "etcdserver: this member is %d revisions behind the leader", want-s.revision())
		case <-t.C:
		}
	}
	return nil
}

// stillAllowed is a stream's check of its caller against the node's
// current ACLs, without waiting for the leader: the ACLs a node holds
// when it delivers an event at revision R include every change committed
// before R. nil when auth is off.
func (s *Server) stillAllowed(ctx context.Context, cred credential, method string, rights ...server.Right) error {
	if !s.srv.AuthEnforced() {
		return nil
	}
	c, missing, ok := s.decide(ctx, cred, rights)
	if ok {
		return nil
	}
	if !c.Anonymous() && !c.BadToken() {
		_ = s.srv.Denied(c, "etcd."+method, missing)
	}
	return rpctypes.ErrGRPCPermissionDenied
}

// spanRight is the right of need on the keys [key, end) in etcd's
// convention (end empty: key alone; end "\x00": every key from key on):
// a single key needs the right on it; a prefix's span (end is
// PrefixEnd(key)) the right on every key under the prefix; any other
// span the right under the longest prefix its keys share, which is ""
// for a span from a key on.
func spanRight(key, end []byte, need fsm.Access) server.Right {
	one, under := server.ReadRight, server.ReadUnderRight
	if need == fsm.AccessWrite {
		one, under = server.WriteRight, server.WriteUnderRight
	}
	switch {
	case len(end) == 0:
		return one(fsm.KindKV, string(key))
	case len(end) == 1 && end[0] == 0:
		return under(fsm.KindKV, "")
	case bytes.Equal(end, fsm.PrefixEnd(key)):
		return under(fsm.KindKV, string(key))
	}
	n := 0
	for n < len(key) && n < len(end) && key[n] == end[n] {
		n++
	}
	return under(fsm.KindKV, string(key[:n]))
}

// Rights of the lease requests: write on the session name etcd leases
// take (listing them: read).
var (
	leaseWrite = server.WriteRight(fsm.KindSession, LeaseSessionName)
	leaseRead  = server.ReadRight(fsm.KindSession, LeaseSessionName)
)
