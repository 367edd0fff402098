package server

// Authentication and authorization (serve --auth).
//
// Every request's caller is resolved from the request itself: an auth
// token in the metadata key tenure-auth-token (its hash is looked up in
// the replicated token table), or else a client certificate the TLS layer
// verified against the client CA, whose common name or subject
// alternative names may be bound to policies. A request then needs one
// right per name it touches: (kind, name, read or write), which the
// caller's policies must grant (fsm.Security.Access: the longest prefix
// wins, default deny). The rights of each request are listed in one
// place, authorize below, called for every request by the strict decoding
// of wire.go, before any handler runs; the requests of a session stream
// are checked one by one by the stream (authorizeSession), so that a
// refused acquire answers that request only.
//
// A session belongs to the identity that created it: its identity is in
// the replicated CreateSession, and every later use of the session by id
// (a resume, an ephemeral key, a dequeue tied to it) must come from that
// identity as well as present the session's secret.
//
// Every denial is PERMISSION_DENIED naming the missing right and the
// caller, and is logged (at most deniedLogBurst lines per second, then a
// count of those left out). Only the leader denies (see deny): a follower
// answers what it would deny with "not the leader". Either way a member
// serves a request (a serializable read on a follower included) only when
// its copy of the ACLs allows it.
//
// Whether the ACLs are enforced is the cluster's, not a member's: it is
// replicated state (fsm.Security.Enforced), set by AclBootstrap, by
// AclEnable (tenure acl enable), and by a leader started with --auth (see
// WithAuth), and never cleared. Every member enforces the ACLs once its
// state says so, whether or not it was started with --auth; a member
// started with --auth enforces them even before. Open streams are
// checked again when the ACLs change (revoke.go).

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/node"
)

// AuthTokenHeader is the metadata key of an auth token (the client's
// client.AuthTokenHeader).
const AuthTokenHeader = "tenure-auth-token"

// Option configures New.
type Option func(*Server)

// WithAuth (serve --auth) makes this member enforce the ACLs whatever the
// cluster's replicated setting, and makes it, each time it becomes the
// leader (and after a restore while it leads), commit AclEnable if the
// cluster does not enforce them yet: from then on every member does.
// Without it a member enforces them as soon as its state says the cluster
// does. Denials are logged at warn with the server's other refusals
// (observe.go).
func WithAuth() Option {
	return func(s *Server) { s.auth = true }
}

// AuthEnforced reports whether this member enforces the ACLs now: it was
// started with --auth, or its copy of the cluster's state says the
// cluster enforces them. Every listener of the member (the etcd API, the
// HTTP listener) must ask this, not a flag of its own. Safe for concurrent
// use.
func (s *Server) AuthEnforced() bool { return s.enforcedBy(s.acls()) }

// enforcedBy reports whether the ACLs are enforced under sec, this node's
// ACLs at some moment.
func (s *Server) enforcedBy(sec *fsm.Security) bool { return s.auth || sec.Enforced }

// ensureEnforced commits AclEnable if the cluster does not enforce its
// ACLs yet (a leader started with --auth). A failure is logged: the next
// leader with --auth tries again, and this member enforces them anyway.
func (s *Server) ensureEnforced(ctx context.Context) {
	if s.node.Security().Enforced {
		return
	}
	if _, err := s.proposeOp(ctx, &fsmpb.AclEnable{}); err != nil {
		if errors.Is(err, fsm.ErrVersion) { // proposed again once the version is raised
			s.log.Info("making the cluster enforce its ACLs (serve --auth) waits for the cluster version", "err", err)
			return
		}
		s.log.Error("making the cluster enforce its ACLs (serve --auth)", "err", err)
		return
	}
	s.log.Info("the cluster enforces its ACLs from now on, on every member (serve --auth)")
}

// caller is who sent a request.
type caller struct {
	// kind is "token", "cert" or "" (anonymous); name the token's id or
	// the certificate's first name.
	kind, name string
	policies   []string
	// badToken: a token was presented that the cluster does not know.
	badToken bool
}

// identity is what a session created by c records: "token:<id>",
// "cert:<name>", or "" (anonymous).
func (c caller) identity() string {
	if c.kind == "" {
		return ""
	}
	return c.kind + ":" + c.name
}

func (c caller) String() string {
	switch {
	case c.badToken:
		return "the caller: its auth token is unknown or revoked"
	case c.kind == "":
		return "an anonymous caller (no auth token, no verified client certificate)"
	case c.kind == "cert":
		return fmt.Sprintf("certificate %q", c.name)
	}
	return "token " + c.name
}

// callerOf resolves the caller of the request whose context is ctx.
func callerOf(ctx context.Context, sec *fsm.Security) caller {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if vs := md.Get(AuthTokenHeader); len(vs) > 0 {
			t, ok := sec.TokenBySecret(vs[0])
			if !ok {
				return caller{badToken: true}
			}
			return caller{kind: "token", name: t.ID, policies: t.Policies}
		}
	}
	return certCaller(sec, callerCertNames(ctx)) // forward.go
}

// clientCert is the request's client certificate, if the TLS layer
// verified one.
func clientCert(ctx context.Context) *x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return nil
	}
	return info.State.VerifiedChains[0][0]
}

// certNames are the names a certificate identity may be bound by: its
// common name first, then its DNS, email, URI and IP subject alternative
// names.
func certNames(c *x509.Certificate) []string {
	var out []string
	if c.Subject.CommonName != "" {
		out = append(out, c.Subject.CommonName)
	}
	out = append(out, c.DNSNames...)
	out = append(out, c.EmailAddresses...)
	for _, u := range c.URIs {
		out = append(out, u.String())
	}
	for _, ip := range c.IPAddresses {
		out = append(out, ip.String())
	}
	return out
}

// right is one thing a request needs.
type right struct {
	kind fsm.Kind
	name string
	need fsm.Access
	// under: every name starting with name (a listing, a prefix).
	under bool
}

func (r right) String() string {
	what := fmt.Sprintf("%s %s on %q", r.kind, r.need, r.name)
	if r.under {
		what = fmt.Sprintf("%s %s on every name under %q", r.kind, r.need, r.name)
	}
	if r.kind == fsm.KindCluster {
		what = fmt.Sprintf("cluster %s", r.need)
	}
	return what
}

func read(kind fsm.Kind, name string) right {
	return right{kind: kind, name: name, need: fsm.AccessRead}
}
func write(kind fsm.Kind, name string) right {
	return right{kind: kind, name: name, need: fsm.AccessWrite}
}
func readUnder(kind fsm.Kind, prefix string) right {
	return right{kind: kind, name: prefix, need: fsm.AccessRead, under: true}
}
func writeUnder(kind fsm.Kind, prefix string) right {
	return right{kind: kind, name: prefix, need: fsm.AccessWrite, under: true}
}

var (
	clusterRead  = read(fsm.KindCluster, "")
	clusterWrite = write(fsm.KindCluster, "")
)

// rightsOf lists the rights a request needs, and the sessions it uses by
// id (which must be the caller's own). free: it needs none (bootstrap,
// whoami). Every request type the service accepts has a case here: an
// unknown one needs cluster write.
func rightsOf(req any) (rights []right, sessions []uint64, free bool) {
	switch r := req.(type) {
	case *pb.AclBootstrapRequest, *pb.AclWhoAmIRequest:
		return nil, nil, true
	case *pb.SessionRequest, *pb.SessionFrames:
		// Session streams check their requests one by one
		// (authorizeOpen, authorizeSession), so that a refusal answers
		// that request and not the whole stream.
		return nil, nil, true
	case *pb.ListSessionsRequest:
		return []right{readUnder(fsm.KindSession, "")}, nil, false
	case *pb.LockStatusRequest:
		return []right{read(fsm.KindLock, r.GetName())}, nil, false
	case *pb.ListLocksRequest:
		return []right{readUnder(fsm.KindLock, r.GetPrefix())}, nil, false
	case *pb.LockHistoryRequest:
		return []right{read(fsm.KindLock, r.GetName())}, nil, false
	case *pb.ObserveRequest:
		return []right{read(fsm.KindLock, r.GetName())}, nil, false
	case *pb.FencedPutRequest:
		return []right{write(fsm.KindFence, r.GetKey())}, nil, false
	case *pb.FencedDeleteRequest:
		return []right{write(fsm.KindFence, r.GetKey())}, nil, false
	case *pb.FencedGetRequest:
		return []right{read(fsm.KindFence, r.GetKey())}, nil, false
	case *pb.KVPutRequest:
		return []right{write(fsm.KindKV, r.GetKey())}, sessionOf(r.GetSession()), false
	case *pb.KVRangeRequest:
		return []right{kvRange(r)}, nil, false
	case *pb.KVDeleteRequest:
		return []right{kvDelete(r)}, nil, false
	case *pb.KVWatchRequest:
		if r.GetPrefix() {
			return []right{readUnder(fsm.KindKV, r.GetKey())}, nil, false
		}
		return []right{read(fsm.KindKV, r.GetKey())}, nil, false
	case *pb.KVTxnRequest:
		for _, c := range r.GetCompare() {
			rights = append(rights, read(fsm.KindKV, c.GetKey()))
		}
		for _, ops := range [][]*pb.KVRequestOp{r.GetSuccess(), r.GetFailure()} {
			for _, op := range ops {
				switch o := op.GetOp().(type) {
				case *pb.KVRequestOp_Range:
					rights = append(rights, kvRange(o.Range))
				case *pb.KVRequestOp_Put:
					rights = append(rights, write(fsm.KindKV, o.Put.GetKey()))
					sessions = append(sessions, sessionOf(o.Put.GetSession())...)
				case *pb.KVRequestOp_Delete:
					rights = append(rights, kvDelete(o.Delete))
				}
			}
		}
		return rights, sessions, false
	case *pb.QueueEnqueueRequest:
		return []right{write(fsm.KindQueue, r.GetQueue())}, nil, false
	case *pb.QueueDequeueRequest:
		return []right{write(fsm.KindQueue, r.GetQueue())}, sessionOf(r.GetSession()), false
	case *pb.QueueSettleRequest: // ack, nack, extend
		return []right{write(fsm.KindQueue, r.GetQueue())}, nil, false
	case *pb.QueueEnqueueBatchRequest:
		return []right{write(fsm.KindQueue, r.GetQueue())}, nil, false
	case *pb.QueueDequeueBatchRequest:
		return []right{write(fsm.KindQueue, r.GetQueue())}, sessionOf(r.GetSession()), false
	case *pb.QueueSettleBatchRequest: // ack, nack
		return []right{write(fsm.KindQueue, r.GetQueue())}, nil, false
	case *pb.QueueDeadRequeueRequest:
		return []right{write(fsm.KindQueue, r.GetQueue())}, nil, false
	case *pb.QueueDeleteRequest:
		return []right{write(fsm.KindQueue, r.GetQueue())}, nil, false
	case *pb.QueuePurgeRequest:
		return []right{write(fsm.KindQueue, r.GetQueue())}, nil, false
	case *pb.QueueStatsRequest:
		return []right{read(fsm.KindQueue, r.GetQueue())}, nil, false
	case *pb.QueueDeadListRequest:
		return []right{read(fsm.KindQueue, r.GetQueue())}, nil, false
	case *pb.AclEnableRequest:
		// Checked only where the ACLs are enforced already (authorize):
		// then it changes nothing, and needs what other ACL changes need.
		return []right{clusterWrite}, nil, false
	case *pb.StatusRequest, *pb.MemberListRequest, *pb.GetLimitsRequest,
		*pb.AclPolicyListRequest, *pb.AclTokenListRequest, *pb.AclIdentityListRequest, *pb.ClusterKeysRequest:
		return []right{clusterRead}, nil, false
	}
	// Membership, snapshots, limits, ACL changes, and anything not
	// listed above.
	return []right{clusterWrite}, nil, false
}

func sessionOf(id uint64) []uint64 {
	if id == 0 {
		return nil
	}
	return []uint64{id}
}

func kvRange(r *pb.KVRangeRequest) right {
	if r.GetPrefix() {
		return readUnder(fsm.KindKV, r.GetKey())
	}
	return read(fsm.KindKV, r.GetKey())
}

func kvDelete(r *pb.KVDeleteRequest) right {
	if r.GetPrefix() {
		return writeUnder(fsm.KindKV, r.GetKey())
	}
	return write(fsm.KindKV, r.GetKey())
}

// authorize checks that the caller of a request (method, its decoded
// message req) has every right it needs under this node's copy of the
// ACLs. nil when they are not enforced.
func (s *Server) authorize(ctx context.Context, method string, req any) error {
	sec := s.acls()
	if !s.enforcedBy(sec) {
		return nil
	}
	rights, sessions, free := rightsOf(req)
	if free {
		return nil
	}
	c := callerOf(ctx, sec)
	if err := s.check(c, sec, method, rights...); err != nil {
		return err
	}
	for _, id := range sessions {
		if err := s.ownSession(c, method, id); err != nil {
			return err
		}
	}
	return nil
}

// check returns the denial of the first right of rights c lacks.
func (s *Server) check(c caller, sec *fsm.Security, method string, rights ...right) error {
	for _, r := range rights {
		if !allowed(c, sec, r) {
			return s.deny(c, method, r.String())
		}
	}
	return nil
}

// allowed reports whether sec grants c the right r.
func allowed(c caller, sec *fsm.Security, r right) bool {
	switch {
	case c.badToken:
		return false
	case r.under:
		return sec.AllowedUnder(c.policies, r.kind, r.name, r.need)
	}
	return sec.Allowed(c.policies, r.kind, r.name, r.need)
}

// ownSession checks that session id, if it exists, was created by c.
func (s *Server) ownSession(c caller, method string, id uint64) error {
	var owner string
	var ok bool
	s.node.Read(func(st *fsm.State) { owner, ok = st.SessionIdentity(id) })
	if ok && owner != c.identity() {
		return s.deny(c, method, fmt.Sprintf("the use of session %d, which another identity created", id))
	}
	return nil
}

// deny returns a denial's error (a unary request's refusal is logged when
// it is answered; a session stream's, by logStream). Only a leader that has caught
// up decides: a follower's copy of the ACLs may not have a token or a
// policy change the client has already seen acknowledged, so a follower
// answers "not the leader" instead, and the client asks the leader.
func (s *Server) deny(c caller, method, what string) error {
	if !s.Serving() {
		return fmt.Errorf("%w: %s: %s is not granted to %s by this node's copy of the ACLs, which may be behind the leader's", node.ErrNotLeader, method, what, c)
	}
	return fmt.Errorf("%w: %s: %s is not granted to %s", fsm.ErrPermissionDenied, method, what, c)
}

// sessionCaller is a session stream's view of its caller, resolved again
// for every request (a revoked token stops working at once).
func (s *Server) sessionCaller(ctx context.Context) (caller, *fsm.Security) {
	sec := s.acls()
	return callerOf(ctx, sec), sec
}

// authorizeOpen checks the opening of a session stream: creating a session
// needs session write on its owner; resuming one, session write on its
// owner too, and that the caller created it. It returns the identity a
// new session records.
func (s *Server) authorizeOpen(ctx context.Context, open *pb.OpenSession) (identity string, err error) {
	c, sec := s.sessionCaller(ctx)
	if !s.enforcedBy(sec) {
		// Recorded all the same: the session stays its creator's once
		// the cluster enforces the ACLs.
		return c.identity(), nil
	}
	owner := open.GetOwner()
	if id := open.GetSessionId(); id != 0 {
		var ok bool
		var ident string
		s.node.Read(func(st *fsm.State) {
			ident, ok = st.SessionIdentity(id)
			owner = st.SessionOwner(id)
		})
		if ok && ident != c.identity() {
			return "", s.logStream("resume", s.deny(c, "resume", fmt.Sprintf("the use of session %d, which another identity created", id)))
		}
	}
	what := "session create"
	if open.GetSessionId() != 0 {
		what = "resume"
	}
	if err := s.check(c, sec, what, write(fsm.KindSession, owner)); err != nil {
		return "", s.logStream(what, err)
	}
	return c.identity(), nil
}

// logStream logs the refusal of a session stream's request (unary
// requests are logged as they are answered, wire.go) and returns err.
func (s *Server) logStream(what string, err error) error {
	if errors.Is(err, fsm.ErrPermissionDenied) {
		s.refused(what, codes.PermissionDenied, err.Error())
	}
	return err
}

// authorizeSession checks one request of a session stream: acquires,
// releases and proclamations need lock write on their name.
func (s *Server) authorizeSession(ctx context.Context, req *pb.SessionRequest) error {
	if !s.enforcedBy(s.acls()) {
		return nil
	}
	var name, what string
	switch op := req.GetOp().(type) {
	case *pb.SessionRequest_Acquire:
		name, what = op.Acquire.GetName(), "acquire"
	case *pb.SessionRequest_Release:
		name, what = op.Release.GetName(), "release"
	case *pb.SessionRequest_Proclaim:
		name, what = op.Proclaim.GetName(), "proclaim"
	default:
		return nil // keepalive, cancel, close: the stream's own session
	}
	c, sec := s.sessionCaller(ctx)
	return s.logStream(what, s.check(c, sec, what, write(fsm.KindLock, name)))
}
