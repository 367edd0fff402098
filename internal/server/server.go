// Package server implements Tenure's gRPC API on top of a node.
package server

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/proto"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/node"
)

// cleanupTimeout bounds the proposals made after a client went away
// (cancelling a queued acquire).
const cleanupTimeout = 10 * time.Second

// Server serves the Tenure API. It is safe for concurrent use.
type Server struct {
	pb.UnimplementedTenureServer
	node    *node.Node
	hub     *Hub
	log     *slog.Logger
	limits  Limits
	workers *workers
	watches watchSlots // open KVWatch and Observe streams (watchlimit.go)
	// restores admits restore streams within limits.Restore (cluster.go).
	restores restoreGate
	// refusals bounds the refusals logged (observe.go).
	refusals refusalBudget
	// auth: this member enforces the ACLs whatever the cluster's
	// setting (serve --auth; auth.go).
	auth bool
	// acls returns the node's current ACLs (node.Node.Security; a test
	// of the session transport gives its own).
	acls      func() *fsm.Security
	signers   signerCache // proof.go
	verifiers verifierCache
	// clientAddrs publishes this member's Tenure API address
	// (clientaddr.go).
	clientAddrs clientAddrs
	// fwd holds the connections a follower forwards requests to the
	// leader on (forward.go).
	fwd forwarder
}

// New returns a server for n; hub must be the one whose Sink n delivers
// events to.
func New(n *node.Node, hub *Hub, limits Limits, opts ...Option) *Server {
	s := &Server{node: n, hub: hub, log: n.Logger(), limits: limits.withDefaults(), workers: newWorkers(maxWorkers), acls: n.Security}
	n.OnLeadership(s.fwd.observe)
	for _, o := range opts {
		o(s)
	}
	s.configureKV()
	n.OnDemote(s.hub.queues.wakeAll) // blocked dequeues move to the new leader
	source, changed := n.Security, s.aclChanged
	s.hub.acl.onChange.Store(&changed)
	s.hub.acl.source.Store(&source) // revoke.go
	if s.auth {
		n.OnPromote(s.ensureEnforced) // auth.go
		// AclEnable is of format version 2: refused until the cluster
		// version allows it (internal/fsm/version.go).
		n.OnClusterVersionRaised(s.ensureEnforced)
	}
	return s
}

// Connection bounds of ConnectionOptions.
const (
	// MaxConcurrentStreams bounds the calls and streams open at once on
	// one connection; a client that opens more waits for one to end.
	MaxConcurrentStreams = 2048
	// maxConnectionIdle: a connection with no call open for this long is
	// closed (GOAWAY; a client reconnects when it next calls).
	maxConnectionIdle = 5 * time.Minute
	// keepaliveTime and keepaliveTimeout: a connection silent for
	// keepaliveTime is pinged and closed if the ping is not answered
	// within keepaliveTimeout (a peer that vanished).
	keepaliveTime    = time.Minute
	keepaliveTimeout = 20 * time.Second
	// handshakeTimeout bounds a new connection's handshake (TLS and
	// HTTP/2's preface).
	handshakeTimeout = 10 * time.Second
)

// ConnectionOptions bound what one connection may hold and how long it
// may sit idle, on every gRPC listener of a node (the client API and the
// etcd API): streams per connection, the handshake's time, idle
// connections closed, silent ones pinged. Each listener keeps its own
// keepalive enforcement policy (how often a client may ping), which is
// enforced: a client that pings more often is disconnected.
func ConnectionOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(MaxConcurrentStreams),
		grpc.ConnectionTimeout(handshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: maxConnectionIdle, Time: keepaliveTime, Timeout: keepaliveTimeout}),
	}
}

// Serving reports whether this server answers as the leader: its node's
// published leadership serves (node.Leadership.Serving). Only then is its
// state authoritative about which sessions exist and its ACLs at least as
// new as any a client has seen acknowledged; otherwise what needs them is
// answered "not the leader".
func (s *Server) Serving() bool { return s.node.Serving() }

// checkSession verifies that secret is session id's capability; the
// secret never changes and ids are never reused, so a check before a
// proposal stays true when the command is applied (the session may have
// ended by then, which the state machine answers).
func (s *Server) checkSession(id uint64, secret []byte) error {
	// Only a serving leader's state is authoritative about which sessions
	// exist: a follower, or a new leader before its barrier, may not know
	// one yet, and must not answer "expired" (clients give up on that).
	if !s.Serving() {
		return node.ErrNotLeader
	}
	var err error
	s.node.Read(func(st *fsm.State) { err = st.CheckSession(id, secret) })
	return err
}

// Close stops the server's background work: no new work is accepted, and
// it returns once every goroutine the server started has ended (work
// already queued or in progress, such as a proposal, finishes first; it
// is bounded by cleanupTimeout). Call it after the gRPC servers that serve s have
// stopped and before the node closes. It is idempotent and safe for
// concurrent use; s must not serve requests afterwards.
func (s *Server) Close() {
	s.closeForward()
	s.workers.close()
}

// Observe implements pb.TenureServer.
func (s *Server) Observe(req *pb.ObserveRequest, stream pb.Tenure_ObserveServer) error {
	if err := s.checkName("election name", req.GetName()); err != nil {
		return toStatus(err)
	}
	release, err := s.watches.take(stream.Context())
	if err != nil {
		return toStatus(err)
	}
	defer release()
	ob := s.hub.observe(req.GetName())
	defer s.hub.unobserve(req.GetName(), ob)
	ctx := stream.Context()
	if err := s.node.LinearizableRead(ctx); err != nil {
		return toStatus(err)
	}
	// The caller's right is checked again before every event and when
	// the ACLs change (revoke.go).
	rights := s.streamRights(ctx, "Observe", read(fsm.KindLock, req.GetName()))
	acl := s.hub.acl.changed()
	first := &pb.LeaderEvent{}
	s.node.Read(func(st *fsm.State) {
		first.Revision = st.Revision()
		for h := range st.LockHolders(req.GetName(), 0) { // the first: the leader
			first.Owner, first.Session, first.Token, first.Value = h.Owner, h.Session, h.Token, h.Value
			break
		}
	})
	if err := rights.check(); err != nil {
		return toStatus(err)
	}
	if err := stream.Send(first); err != nil {
		return err
	}
	for {
		select {
		case e := <-ob.ch:
			if e.Revision <= first.Revision {
				continue // already reflected in the first answer
			}
			if err := rights.check(); err != nil {
				return toStatus(err)
			}
			if err := stream.Send(&pb.LeaderEvent{Owner: e.Owner, Session: e.Session, Token: e.Token, Value: e.Value, Revision: e.Revision}); err != nil {
				return err
			}
		case <-acl:
			acl = s.hub.acl.changed()
			if err := rights.check(); err != nil {
				return toStatus(err)
			}
		case <-ob.lost:
			return toStatus(fmt.Errorf("%w: observer fell more than %d changes behind; observe again", ErrLimit, observerBuffer))
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// read runs fn on the state: after a linearizable barrier (the default),
// or on this node's local, possibly stale, state when serializable.
func (s *Server) read(ctx context.Context, serializable bool, fn func(*fsm.State)) error {
	if !serializable {
		if err := s.node.LinearizableRead(ctx); err != nil {
			return toStatus(err)
		}
	}
	s.node.Read(fn)
	return nil
}

// LockHistory implements pb.TenureServer.
func (s *Server) LockHistory(ctx context.Context, req *pb.LockHistoryRequest) (*pb.LockHistoryResponse, error) {
	if err := fsm.ValidateName("lock name", req.GetName()); err != nil {
		return nil, toStatus(err)
	}
	out := &pb.LockHistoryResponse{Name: req.GetName()}
	size, over := proto.Size(out), false
	err := s.read(ctx, req.GetSerializable(), func(st *fsm.State) {
		for _, g := range st.History(req.GetName()) {
			rec := &pb.GrantRecord{Owner: g.Owner, Session: g.Session, Token: g.Token, GrantedRevision: g.GrantedRevision, Ended: g.Ended, EndedRevision: g.EndedRevision}
			if size += proto.Size(rec) + 8; size > s.limits.MaxResponseBytes {
				over = true
				return
			}
			out.Grants = append(out.Grants, rec)
		}
	})
	if err == nil && over {
		return nil, toStatus(errResponseTooLarge(s.limits.MaxResponseBytes))
	}
	return out, err
}

// FencedPut implements pb.TenureServer. A stale token is a normal answer
// (PUT_RESULT_STALE), not an error; a token that was never issued is
// INVALID_ARGUMENT with an UnissuedToken detail.
func (s *Server) FencedPut(ctx context.Context, req *pb.FencedPutRequest) (*pb.FencedPutResponse, error) {
	if err := s.checkFenced(req.GetKey(), req.GetLock()); err != nil {
		return nil, toStatus(err)
	}
	if err := s.checkProof(req.GetKey(), req.GetLock(), req.GetProof(), req.GetToken()); err != nil {
		return nil, toStatus(err)
	}
	if n := len(req.GetValue()); n > s.limits.MaxRegisterValueBytes {
		return nil, toStatus(fmt.Errorf("%w: value is %d bytes, the limit is %d (--max-register-value-len)", fsm.ErrInvalid, n, s.limits.MaxRegisterValueBytes))
	}
	res, err := s.proposeOp(ctx, (&fsmpb.FencedPut{Key: req.GetKey(), Value: req.GetValue(), Token: req.GetToken(), OperationId: req.GetOperationId(), Lock: req.GetLock()}))
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.FencedPutResponse{Result: pb.PutResult(res.Put), Duplicate: res.Duplicate, Token: res.AcceptedToken, Revision: res.Revision}, nil
}

// FencedDelete implements pb.TenureServer, with the answers of FencedPut.
func (s *Server) FencedDelete(ctx context.Context, req *pb.FencedDeleteRequest) (*pb.FencedDeleteResponse, error) {
	if err := s.checkFenced(req.GetKey(), req.GetLock()); err != nil {
		return nil, toStatus(err)
	}
	if err := s.checkProof(req.GetKey(), req.GetLock(), req.GetProof(), req.GetToken()); err != nil {
		return nil, toStatus(err)
	}
	res, err := s.proposeOp(ctx, (&fsmpb.FencedDelete{Key: req.GetKey(), Token: req.GetToken(), Lock: req.GetLock(), OperationId: req.GetOperationId()}))
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.FencedDeleteResponse{Result: pb.PutResult(res.Put), Duplicate: res.Duplicate, Token: res.AcceptedToken, Revision: res.Revision}, nil
}

// checkFenced checks the names of a fenced write: its register key and,
// if it names one, its lock.
func (s *Server) checkFenced(key, lock string) error {
	if err := s.checkName("register key", key); err != nil {
		return err
	}
	if lock != "" {
		return s.checkName("lock name", lock)
	}
	return nil
}

// FencedGet implements pb.TenureServer.
func (s *Server) FencedGet(ctx context.Context, req *pb.FencedGetRequest) (*pb.FencedGetResponse, error) {
	if err := fsm.ValidateName("register key", req.GetKey()); err != nil {
		return nil, toStatus(err)
	}
	out := &pb.FencedGetResponse{Key: req.GetKey()}
	err := s.read(ctx, req.GetSerializable(), func(st *fsm.State) {
		r := st.Register(req.GetKey())
		out.Value, out.Token, out.Found, out.ModRevision, out.Lock = r.Value, r.Token, r.Found, r.ModRevision, r.Lock
	})
	return out, err
}

// Status implements pb.TenureServer.
func (s *Server) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	st := s.node.Status()
	out := &pb.StatusResponse{Node: st.Node, Leader: st.Leader, Term: st.Term, Revision: st.Revision, Voters: st.Voters, AppliedIndex: st.AppliedIndex, StorageError: st.StorageError}
	s.watchStatus(out)
	s.healthStatus(out)
	return out, nil
}
