package server

// Forwarding. A follower serves the requests that need the leader by
// relaying them to the leader, so that a client connected to any member
// keeps working, and keeps its holds, even when it cannot reach the
// leader's client API (a client given only some endpoints, or a leader
// whose client network is cut while it keeps leading). The follower
// reaches the leader over the peer port (node.DialForward), not over the
// leader's client API; there the leader serves the same API, registered
// with the same strict decoding, ACL checks and limits (RegisterForwarded).
//
// What is forwarded: a unary request the follower answers "not the
// leader" (a write, a linearizable read, a request its copy of the ACLs
// would refuse) is sent to the leader and the leader's answer returned
// in its place, and so is MemberList, whose answer only the leader gives
// with every member's health and the configuration it decides on
// (leaderView; a follower that cannot forward it answers from its own
// view); so is a server stream (Observe, KVWatch, SnapshotSave)
// that ended "not the leader" before sending anything. A stream the
// client sends on (Sessions, which carries keepalives, acquires and
// grants; SnapshotRestore) is relayed, frame by frame, undecoded, from its
// start when the follower is not the serving leader. What a follower
// serves itself (serializable reads, Status, MemberList) it serves. When
// the leader cannot be reached over the peer port within
// forwardConnectWait (half the request's time at most; at once when the
// last dial failed), or is not known, the follower answers "not the
// leader" naming the leader's client address, as before: the client goes
// there itself.
//
// Credentials: the caller's auth token travels as it came; a client
// certificate the follower verified travels as its names
// (forwardedCertKey). The leader checks every request again under its
// own ACLs. It believes forwarded certificate names only on its forward
// door, whose connections proved, in node's handshake, that the dialer
// holds the cluster's signing keys: on the client API such metadata means
// nothing, and the peer port gives a stranger no API at all.
//
// A forwarded request is marked: the forward door never forwards, so a
// node that receives one while not leading answers "not the leader"
// (naming the leader it knows) rather than passing it on; requests do not
// bounce between members in an election.
//
// A forwarded request's answer carries the leader's client address, as
// this member knows it from the replicated member list, in the header
// LeaderHintHeader: a client that can reach the leader itself may go
// there and save the hop (the Go client does, after a check; see
// docs/operations.md). Only a forwarded answer carries it.
//
// A forwarded write whose relay breaks after it was sent is answered
// UNAVAILABLE, as a broken connection to the leader would be: its outcome
// is unknown to the follower as it would be to the client.

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/node"
)

// Metadata keys of a forwarded request.
const (
	// forwardedByKey names the member that forwarded the request.
	forwardedByKey = "tenure-forwarded-by"
	// forwardedCertKey: the names of the client certificate the
	// forwarding member verified (binary metadata: names may be any
	// UTF-8).
	forwardedCertKey = "tenure-forwarded-cert-bin"
)

// LeaderHintHeader is the response header of a request a follower
// forwarded to the leader: the leader's client address (its Member's
// client_addr), so that the client may go there directly. It is set only
// when the request was forwarded and the address is known.
const LeaderHintHeader = "tenure-leader"

// hintForwarded sets LeaderHintHeader with set (a forwarded request's
// header), when this member knows the leader's client address.
func (s *Server) hintForwarded(set func(metadata.MD) error) {
	if addr := s.leaderClientAddr(); addr != "" {
		_ = set(metadata.Pairs(LeaderHintHeader, addr)) // the header may be gone already: the hint is only advice
	}
}

// leaderView are the methods a follower answers from its own copy, which
// the leader answers better: a follower forwards them when it can.
var leaderView = map[string]bool{"MemberList": true}

// forwardConnectWait bounds how long a follower waits for its connection
// to the leader's forward door before it answers "not the leader"
// instead.
const forwardConnectWait = 2 * time.Second

// ForwardMaxConcurrentStreams bounds the calls and streams open at once
// on one forwarded-API connection: a member relays the streams of all its
// clients over one connection (each of those connections holds at most
// MaxConcurrentStreams).
const ForwardMaxConcurrentStreams = 1 << 16

// maxForwardConns bounds the connections a follower keeps to members it
// forwarded to; beyond it, those to members no longer leading are closed.
const maxForwardConns = 8

// forwardedCtxKey marks the context of a request that came in by the
// forward door.
type forwardedCtxKey struct{}

// forwardedFrom is what the forward door knows of a request's caller.
type forwardedFrom struct {
	// by is the member that forwarded it.
	by string
	// certNames are the names of the caller's client certificate, as the
	// forwarding member verified it (nil: none).
	certNames []string
}

// forwardedOf returns the forwarding of a request that came in by the
// forward door; nil for one that came in by a client door.
func forwardedOf(ctx context.Context) *forwardedFrom {
	f, _ := ctx.Value(forwardedCtxKey{}).(*forwardedFrom)
	return f
}

// forwardedContext marks ctx, a request's on the forward door, with what
// the forwarding member says of its caller.
func forwardedContext(ctx context.Context) context.Context {
	f := &forwardedFrom{}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if by := md.Get(forwardedByKey); len(by) > 0 {
			f.by = by[0]
		}
		f.certNames = md.Get(forwardedCertKey)
	}
	return context.WithValue(ctx, forwardedCtxKey{}, f)
}

// callerCertNames are the names of the request's client certificate: on
// the forward door those the forwarding member verified, on a client
// door those the TLS layer verified.
func callerCertNames(ctx context.Context) []string {
	if f := forwardedOf(ctx); f != nil {
		return f.certNames
	}
	return CertNames(ctx)
}

// forwardOutgoing is the outgoing context a follower forwards the request
// of ctx with: the mark and the caller's credential.
func (s *Server) forwardOutgoing(ctx context.Context) context.Context {
	md := metadata.Pairs(forwardedByKey, s.node.ID())
	in, _ := metadata.FromIncomingContext(ctx)
	if vs := in.Get(AuthTokenHeader); len(vs) > 0 {
		md.Set(AuthTokenHeader, vs[0])
	} else if names := CertNames(ctx); len(names) > 0 {
		md.Set(forwardedCertKey, names...)
	}
	return metadata.NewOutgoingContext(ctx, md)
}

// RegisterForwarded registers srv on gs, the gRPC server of the
// forwarded-API connections of srv's node (node.Node.ForwardListener):
// Tenure's API with the strict decoding, ACL checks and metrics of
// Register, requests marked as forwarded (their caller's certificate is
// the one the forwarding member names) and never forwarded again. gs must
// have been made with ForwardOptions.
func RegisterForwarded(gs *grpc.Server, srv *Server) {
	pb.RegisterTenureServer(strictRegistrar{ServiceRegistrar: gs, srv: srv, forwardDoor: true}, srv)
}

// ForwardOptions are the options of the forward door's gRPC server:
// GRPCOptions and ConnectionOptions, with room for the streams of a
// member's every client on one connection (ForwardMaxConcurrentStreams).
func ForwardOptions() []grpc.ServerOption {
	opts := append(GRPCOptions(), ConnectionOptions()...)
	return append(opts, grpc.MaxConcurrentStreams(ForwardMaxConcurrentStreams))
}

// forwarder holds a follower's connections to the members it forwards
// to, one per member.
type forwarder struct {
	// mu guards conns and closed.
	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	closed bool

	// lmu guards leader and moved: moved is cancelled when this node's
	// view of the leader moves off leader (observe), which ends every
	// stream relayed to that leader.
	lmu    sync.Mutex
	leader string
	moved  context.Context
	cancel context.CancelFunc
}

// observe follows this node's published leadership (node.OnLeadership):
// when the leader it names changes, streams relayed to the old one end.
// It is quick and does not call back into the node.
func (f *forwarder) observe(l node.Leadership) {
	f.lmu.Lock()
	defer f.lmu.Unlock()
	if f.moved != nil && l.Leader == f.leader {
		return
	}
	if f.cancel != nil {
		f.cancel()
	}
	f.leader = l.Leader
	f.moved, f.cancel = context.WithCancel(context.Background())
}

// leaderMoved returns a context cancelled once this node's view of the
// leader changes after the call. Read it before the leader a request is
// relayed to: a change in between cancels it, so a relay never outlives
// its leader unseen.
func (f *forwarder) leaderMoved() context.Context {
	f.lmu.Lock()
	defer f.lmu.Unlock()
	if f.moved == nil {
		f.moved, f.cancel = context.WithCancel(context.Background())
	}
	return f.moved
}

// conn returns a ready connection to member id's forward door, dialling
// it if needed and waiting up to forwardConnectWait (within ctx) for it.
func (s *Server) forwardConn(ctx context.Context, id string) (*grpc.ClientConn, error) {
	f := &s.fwd
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil, errors.New("server: closed")
	}
	cc := f.conns[id]
	if cc == nil {
		if len(f.conns) >= maxForwardConns {
			for other, c := range f.conns {
				if other != id {
					c.Close()
					delete(f.conns, other)
				}
			}
		}
		var err error
		cc, err = grpc.NewClient("passthrough:///"+id,
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return s.node.DialForward(ctx, id) }),
			// The connection is the peer port's: mutual TLS where peer
			// TLS is on, below gRPC.
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageSize), grpc.MaxCallSendMsgSize(MaxMessageSize)),
			grpc.WithInitialWindowSize(1<<20), grpc.WithInitialConnWindowSize(1<<24),
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 10 * time.Second}),
		)
		if err != nil {
			f.mu.Unlock()
			return nil, err
		}
		if f.conns == nil {
			f.conns = make(map[string]*grpc.ClientConn)
		}
		f.conns[id] = cc
	}
	f.mu.Unlock()
	// Half the request's time at most, so that the answer given here
	// instead still reaches the client in time.
	wait := forwardConnectWait
	if d, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(d)/2)
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		st := cc.GetState()
		switch st {
		case connectivity.Ready:
			return cc, nil
		case connectivity.Idle:
			cc.Connect()
		case connectivity.TransientFailure:
			// The last dial failed; gRPC dials again after its backoff.
			return nil, errors.New("server: the leader's forward door cannot be reached")
		case connectivity.Shutdown:
			return nil, errors.New("server: the forwarding connection was closed")
		}
		if !cc.WaitForStateChange(wctx, st) {
			return nil, wctx.Err()
		}
	}
}

// closeForward closes the connections of forwarding; it is idempotent.
func (s *Server) closeForward() {
	f := &s.fwd
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	for _, cc := range f.conns {
		cc.Close()
	}
	f.conns = nil
}

// forwardTarget returns a ready connection to the leader's forward door
// for a request of ctx, when this node is a follower that knows a leader
// it can reach; ok false otherwise (the request is answered here).
func (s *Server) forwardTarget(ctx context.Context) (cc *grpc.ClientConn, ok bool) {
	if forwardedOf(ctx) != nil || s.node.ForwardListener() == nil {
		return nil, false
	}
	leader := s.node.Leader()
	if leader == "" || leader == s.node.ID() {
		return nil, false
	}
	cc, err := s.forwardConn(ctx, leader)
	if err != nil {
		s.log.Debug("forwarding to the leader", "leader", leader, "err", err)
		return nil, false
	}
	return cc, true
}

// isNotLeader reports whether err, a handler's answer, is "not the
// leader".
func isNotLeader(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return false
	}
	for _, d := range st.Details() {
		if e, ok := d.(*pb.Error); ok && e.GetReason() == pb.ErrorReason_ERROR_REASON_NOT_LEADER {
			return true
		}
	}
	return false
}

// forwardUnary sends req, a unary request of fullMethod (method) this node
// answered "not the leader", to the leader and returns its answer; ok
// false when it cannot be forwarded.
func (s *Server) forwardUnary(ctx context.Context, fullMethod, method string, req proto.Message, newResp func() proto.Message) (resp any, err error, ok bool) {
	if req == nil || newResp == nil {
		return nil, nil, false
	}
	cc, ok := s.forwardTarget(ctx)
	if !ok {
		return nil, nil, false
	}
	out := newResp()
	err = cc.Invoke(s.forwardOutgoing(ctx), fullMethod, req, out)
	s.hub.metrics.ObserveForwarded(method, codeOf(err).String())
	s.hintForwarded(func(md metadata.MD) error { return grpc.SetHeader(ctx, md) })
	if err != nil {
		return nil, err, true
	}
	return out, nil, true
}

// relay relays stream, a call of fullMethod (method) to this node, to the
// leader's: first (when not nil, a server stream's request already read
// here) and then every message the client sends, undecoded, and every
// message and the status the leader answers; ok false when it cannot be
// forwarded.
//
// A relay ends, Unavailable, when this node's view of the leader changes:
// a leader that stopped (a paused process, a partition) leaves its relays
// silent rather than broken, and a client that reaches the cluster only
// through this node would wait on one until its session expired. Ended,
// the client resumes at once, through this node to the new leader.
func (s *Server) relay(stream grpc.ServerStream, fullMethod, method string, first proto.Message) (err error, ok bool) {
	moved := s.fwd.leaderMoved()
	cc, ok := s.forwardTarget(stream.Context())
	if !ok {
		return nil, false
	}
	defer func() { s.hub.metrics.ObserveForwarded(method, codeOf(err).String()) }()
	ctx, cancel := context.WithCancel(s.forwardOutgoing(stream.Context()))
	defer cancel()
	var cut atomic.Bool
	stop := context.AfterFunc(moved, func() {
		cut.Store(true)
		cancel()
	})
	defer stop()
	defer func() {
		if err != nil && cut.Load() {
			err = status.Error(codes.Unavailable, "server: the leader this stream was relayed to is no longer the leader; resume")
		}
	}()
	up, err := cc.NewStream(ctx, &grpc.StreamDesc{StreamName: method, ServerStreams: true, ClientStreams: true}, fullMethod, grpc.ForceCodecV2(rawCodec{}))
	if err != nil {
		return err, true
	}
	s.hintForwarded(stream.SetHeader)
	if first != nil {
		b, err := proto.Marshal(first)
		if err != nil {
			return err, true
		}
		if err := up.SendMsg(&rawFrame{b: b}); err != nil && !errors.Is(err, io.EOF) {
			return err, true
		}
		_ = up.CloseSend()
	} else if !s.workers.start(func() { s.relayUp(stream, up, cancel) }) {
		return status.Error(codes.Unavailable, "server: closed"), true
	}
	for {
		var f rawFrame
		if err := up.RecvMsg(&f); err != nil {
			if errors.Is(err, io.EOF) {
				return nil, true
			}
			return err, true
		}
		if err := stream.SendMsg(&f); err != nil {
			return err, true
		}
	}
}

// relayUp relays what the client sends on stream to up, until the client
// is done (then it half-closes up) or either side fails (then it cancels
// up).
func (s *Server) relayUp(stream grpc.ServerStream, up grpc.ClientStream, cancel context.CancelFunc) {
	for {
		var w wireMessage
		err := stream.RecvMsg(&w)
		if err != nil {
			if errors.Is(err, io.EOF) {
				_ = up.CloseSend()
			} else {
				cancel()
			}
			return
		}
		f := &rawFrame{b: w.data.Materialize()}
		w.free()
		if err := up.SendMsg(f); err != nil {
			cancel()
			return
		}
	}
}

// rawFrame is a message relayed undecoded.
type rawFrame struct{ b []byte }

// rawCodec is the codec of a relayed stream's upstream: it sends and
// receives rawFrames as their bytes.
type rawCodec struct{}

// Marshal implements encoding.CodecV2.
func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	f, ok := v.(*rawFrame)
	if !ok {
		return nil, errors.New("server: a relayed stream sends raw frames only")
	}
	return mem.BufferSlice{mem.SliceBuffer(f.b)}, nil
}

// Unmarshal implements encoding.CodecV2.
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	f, ok := v.(*rawFrame)
	if !ok {
		return errors.New("server: a relayed stream receives raw frames only")
	}
	f.b = data.Materialize()
	return nil
}

// Name implements encoding.CodecV2.
func (rawCodec) Name() string { return "proto" }

var _ encoding.CodecV2 = rawCodec{}

// responseType returns a constructor of the answer of method of the
// service named service (nil if unknown).
func responseType(service, method string) func() proto.Message {
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(service))
	if err != nil {
		return nil
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil
	}
	md := sd.Methods().ByName(protoreflect.Name(method))
	if md == nil {
		return nil
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName())
	if err != nil {
		return nil
	}
	return func() proto.Message { return mt.New().Interface() }
}

// ctxStream is a server stream with another context.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

// Context implements grpc.ServerStream.
func (s ctxStream) Context() context.Context { return s.ctx }
