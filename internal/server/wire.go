package server

// Requests are decoded here, not by gRPC: a request that is not a valid
// message of its type (malformed wire data, a string field that is not
// valid UTF-8) is answered INVALID_ARGUMENT with a message saying what is
// wrong, on every RPC, unary and streaming, and reaches no handler. gRPC
// itself answers INTERNAL for every error of its codec.
//
// How: the server's codec (GRPCOptions) hands a request to a *wireMessage
// as its bytes, undecoded, and Register wraps each handler of the service
// so that it receives its requests through such a wireMessage and decodes
// them itself. A message gRPC is asked to decode into any other type is
// decoded by the codec as usual (and a failure stays INTERNAL): nothing
// partly decoded is ever handed to a handler.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/node"
)

// Register registers srv on gs with the strict decoding of requests, each
// request authorized (auth.go) as soon as it is decoded, and counts every
// RPC in srv's metrics (method, code; the time of a unary one). gs must
// have been made with GRPCOptions.
func Register(gs *grpc.Server, srv *Server) {
	pb.RegisterTenureServer(strictRegistrar{ServiceRegistrar: gs, srv: srv}, srv)
	srv.registerMembers(gs) // clientaddr.go
}

// strictRegistrar registers services whose handlers decode their requests
// with decodeStrict and then authorize them, and are counted in srv's
// metrics (and refusals logged). On a client door (forwardDoor false) a
// request this node answers "not the leader" is forwarded to the leader
// when it can be (forward.go); on the forward door requests are marked as
// forwarded and never forwarded again.
type strictRegistrar struct {
	grpc.ServiceRegistrar
	srv         *Server
	forwardDoor bool
}

// RegisterService implements grpc.ServiceRegistrar.
func (r strictRegistrar) RegisterService(desc *grpc.ServiceDesc, impl any) {
	d := *desc
	d.Methods = make([]grpc.MethodDesc, len(desc.Methods))
	for i, m := range desc.Methods {
		handler, name := m.Handler, m.MethodName
		full, newResp := "/"+desc.ServiceName+"/"+name, responseType(desc.ServiceName, name)
		m.Handler = func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			start := time.Now()
			if r.forwardDoor {
				ctx = forwardedContext(ctx)
			}
			var req proto.Message
			resp, err := handler(srv, ctx, func(v any) error {
				if err := decodeStrict(dec, v); err != nil {
					return err
				}
				req, _ = v.(proto.Message)
				return toStatus(r.srv.authorize(ctx, name, v))
			}, interceptor)
			if err == nil && !boundedByPayloads[name] {
				resp, err = r.srv.boundAnswer(resp)
			}
			switch {
			case r.forwardDoor:
			case err != nil && isNotLeader(err):
				if fresp, ferr, ok := r.srv.forwardUnary(ctx, full, name, req, newResp); ok {
					resp, err = fresp, ferr
				}
			case err == nil && leaderView[name] && !r.srv.Serving():
				if fresp, ferr, ok := r.srv.forwardUnary(ctx, full, name, req, newResp); ok && ferr == nil {
					resp = fresp
				}
			}
			if err != nil {
				err = r.srv.hintLeader(err) // clientaddr.go
			}
			r.srv.answered(name, err, true, time.Since(start))
			return resp, err
		}
		d.Methods[i] = m
	}
	d.Streams = make([]grpc.StreamDesc, len(desc.Streams))
	for i, s := range desc.Streams {
		handler, name, clientStreams := s.Handler, s.StreamName, s.ClientStreams
		full := "/" + desc.ServiceName + "/" + name
		s.Handler = func(srv any, stream grpc.ServerStream) error {
			if r.forwardDoor {
				stream = ctxStream{stream, forwardedContext(stream.Context())}
			} else if clientStreams && !r.srv.Serving() {
				// A stream the client sends on is relayed from its start
				// (forward.go).
				if err, ok := r.srv.relay(stream, full, name, nil); ok {
					r.srv.answered(name, err, false, 0)
					return err
				}
				// Not relayed: no leader this member can reach. The
				// call is refused "not the leader" rather than served
				// here: a Sessions call carries many sessions' streams,
				// and one served by a follower would answer each of them
				// "not the leader" for as long as it lasts, even once a
				// leader is known. Refused, the client calls again, and a
				// later call is relayed.
				err := r.srv.hintLeader(toStatus(fmt.Errorf("%w: no leader this member can relay to", node.ErrNotLeader)))
				r.srv.answered(name, err, false, 0)
				return err
			}
			ss := &strictStream{ServerStream: stream, authorize: func(v any) error { return r.srv.authorize(stream.Context(), name, v) }}
			err := handler(srv, ss)
			if err != nil && !r.forwardDoor && !clientStreams && ss.req != nil && !ss.sent && isNotLeader(err) {
				// A server stream that needs the leader, answered here
				// before it sent anything: forwarded with its request.
				if ferr, ok := r.srv.relay(stream, full, name, ss.req); ok {
					err = ferr
				}
			}
			r.srv.answered(name, err, false, 0)
			return err
		}
		d.Streams[i] = s
	}
	r.ServiceRegistrar.RegisterService(&d, impl)
}

// boundedByPayloads are the methods whose answers carry queue items: they
// are bounded by the payload limits (--max-queue-payload, a batch's 4 MiB)
// rather than by --max-response-bytes, because a page of dead letters
// holds at least one item whatever its size, and a delivery, once made,
// cannot be taken back by refusing its answer.
var boundedByPayloads = map[string]bool{"QueueDequeue": true, "QueueDequeueBatch": true, "QueueDeadList": true}

// boundAnswer refuses an answer past --max-response-bytes before it is
// sent: the last line for an answer whose size its handler does not bound
// while building it (those that grow with the data do: pages, a
// transaction's ranges, a lock's history).
func (s *Server) boundAnswer(resp any) (any, error) {
	if m, ok := resp.(proto.Message); ok && proto.Size(m) > s.limits.MaxResponseBytes {
		return nil, toStatus(errResponseTooLarge(s.limits.MaxResponseBytes))
	}
	return resp, nil
}

// Answered counts an RPC served beside Tenure's own API on this node (the
// etcd API) exactly as Tenure's own are: in tenure_rpc_requests_total and,
// if unary, tenure_rpc_duration_seconds under method (a label from a fixed
// set), with the code err is answered with; a refusal is logged as
// Tenure's are.
func (s *Server) Answered(method string, err error, unary bool, d time.Duration) {
	s.answered(method, err, unary, d)
}

// answered counts an RPC of method that ended with err (the time of a
// unary one) and logs a refusal.
func (s *Server) answered(method string, err error, unary bool, d time.Duration) {
	code := codeOf(err)
	s.hub.metrics.ObserveRPC(method, code.String(), unary, d)
	if err != nil {
		s.refused(method, code, status.Convert(err).Message())
	}
}

// codeOf is the gRPC code a handler's error is answered with: a context's
// error counts as gRPC turns it into a status.
func codeOf(err error) codes.Code {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return status.FromContextError(err).Code()
	}
	return status.Code(err)
}

// strictStream decodes every message it receives with decodeStrict and
// authorizes it. It records the first request and whether anything was
// sent (a server stream that needs the leader is forwarded only when it
// sent nothing).
type strictStream struct {
	grpc.ServerStream
	authorize func(req any) error
	req       proto.Message // the first request received
	sent      bool
}

// RecvMsg implements grpc.ServerStream.
func (s *strictStream) RecvMsg(v any) error {
	if err := decodeStrict(s.ServerStream.RecvMsg, v); err != nil {
		return err
	}
	if s.req == nil {
		s.req, _ = v.(proto.Message)
	}
	return toStatus(s.authorize(v))
}

// SendMsg implements grpc.ServerStream.
func (s *strictStream) SendMsg(v any) error {
	s.sent = true
	return s.ServerStream.SendMsg(v)
}

// wireMessage holds a received message's bytes (see codec).
type wireMessage struct{ data mem.BufferSlice }

func (w *wireMessage) free() {
	w.data.Free()
	w.data = nil
}

// decodeStrict receives one message with recv and decodes it into v.
func decodeStrict(recv func(any) error, v any) error {
	var w wireMessage
	defer w.free()
	if err := recv(&w); err != nil {
		return err
	}
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("server: cannot decode a request into %T", v) // a programming error: INTERNAL
	}
	buf := w.data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	if err := proto.Unmarshal(buf.ReadOnlyData(), m); err != nil {
		proto.Reset(m)
		return toStatus(fmt.Errorf("%w: the request is not a valid %s message: %s", fsm.ErrInvalid, m.ProtoReflect().Descriptor().FullName(), explain(m.ProtoReflect().Descriptor(), buf.ReadOnlyData(), err)))
	}
	return nil
}

// explain says what is wrong with b, which failed to decode as md with
// err: which string field is not valid UTF-8, or else err's own words.
func explain(md protoreflect.MessageDescriptor, b []byte, err error) string {
	if path := badString(md, b, ""); path != "" {
		return "field " + path + " is not valid UTF-8"
	}
	return strings.TrimPrefix(err.Error(), "proto: ")
}

// badString returns the path (as "frames[0].request.acquire.name") of the
// first string field of b, a message md on the wire, that is not valid
// UTF-8; "" if there is none or b is not well formed.
func badString(md protoreflect.MessageDescriptor, b []byte, prefix string) string {
	seen := make(map[protowire.Number]int)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		fd := md.Fields().ByNumber(num)
		if fd == nil || typ != protowire.BytesType || (fd.Kind() != protoreflect.StringKind && fd.Kind() != protoreflect.MessageKind) {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return ""
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		path := prefix + string(fd.Name())
		if fd.IsList() || fd.IsMap() {
			path = fmt.Sprintf("%s[%d]", path, seen[num])
			seen[num]++
		}
		if fd.Kind() == protoreflect.StringKind {
			if !utf8.Valid(v) {
				return path
			}
			continue
		}
		if p := badString(fd.Message(), v, path+"."); p != "" {
			return p
		}
	}
	return ""
}

// codec is the server's codec: protobuf, except that a *wireMessage
// receives the message's bytes undecoded.
type codec struct{ proto encoding.CodecV2 }

func newCodec() codec { return codec{proto: encoding.GetCodecV2(grpcproto.Name)} }

// Marshal implements encoding.CodecV2; a relayed frame (forward.go) is
// sent as its bytes.
func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(*rawFrame); ok {
		return mem.BufferSlice{mem.SliceBuffer(f.b)}, nil
	}
	return c.proto.Marshal(v)
}

// Unmarshal implements encoding.CodecV2.
func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	if w, ok := v.(*wireMessage); ok {
		w.free() // a second message for a unary request: gRPC refuses it
		data.Ref()
		w.data = data
		return nil
	}
	return c.proto.Unmarshal(data, v)
}

// Name implements encoding.CodecV2.
func (codec) Name() string { return grpcproto.Name }
