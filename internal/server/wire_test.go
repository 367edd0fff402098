package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/testutil"
)

// rawCodec sends and receives messages as the bytes in a *[]byte, so a
// test can put anything on the wire.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// Wire encodings for the tests: a string field holding invalid UTF-8, a
// message field, a varint field.
func strField(num protowire.Number, s []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), s)
}

func msgField(num protowire.Number, parts ...[]byte) []byte {
	var body []byte
	for _, p := range parts {
		body = append(body, p...)
	}
	return strField(num, body)
}

func varintField(num protowire.Number, v uint64) []byte {
	return protowire.AppendVarint(protowire.AppendTag(nil, num, protowire.VarintType), v)
}

var badUTF8 = []byte("lock-\xff\xfe")

// truncated is a length-delimited field whose length runs past the end.
var truncated = []byte{0x0a, 0x20, 'a', 'b'}

func rawConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// wantInvalid checks that err is INVALID_ARGUMENT with a message holding
// every one of parts.
func wantInvalid(t *testing.T, what string, err error, parts ...string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument {
		t.Fatalf("%s: %v, want INVALID_ARGUMENT", what, err)
	}
	for _, p := range parts {
		if !strings.Contains(st.Message(), p) {
			t.Fatalf("%s: message %q does not say %q", what, st.Message(), p)
		}
	}
}

// TestMalformedRequestsAreInvalidArgument sends requests that are not
// valid messages of their type, on every kind of RPC: each is answered
// INVALID_ARGUMENT saying what is wrong, nothing changes, and the server
// goes on serving.
func TestMalformedRequestsAreInvalidArgument(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := rawConn(t, srv.Addr())

	unary := []struct {
		method string
		req    []byte
		want   []string
	}{
		{"LockStatus", strField(1, badUTF8), []string{"tenure: invalid argument: the request is not a valid tenure.v1.LockStatusRequest message", "field name is not valid UTF-8"}},
		{"LockStatus", truncated, []string{"tenure.v1.LockStatusRequest", "cannot parse invalid wire-format data"}},
		{"KVPut", append(strField(1, badUTF8), strField(2, []byte("v"))...), []string{"tenure.v1.KVPutRequest", "field key is not valid UTF-8"}},
		{"KVTxn", msgField(2, msgField(2, strField(1, badUTF8))), []string{"tenure.v1.KVTxnRequest", "field success[0].put.key is not valid UTF-8"}},
		{"QueueEnqueue", strField(1, badUTF8), []string{"tenure.v1.QueueEnqueueRequest", "field queue is not valid UTF-8"}},
		{"FencedPut", strField(1, badUTF8), []string{"tenure.v1.FencedPutRequest", "field key"}},
	}
	for _, tc := range unary {
		var resp []byte
		err := conn.Invoke(ctx, "/tenure.v1.Tenure/"+tc.method, &tc.req, &resp)
		wantInvalid(t, tc.method, err, tc.want...)
	}

	// Streams: a server stream, a client stream, and the first message of
	// a Sessions stream.
	streams := []struct {
		method string
		desc   grpc.StreamDesc
		req    []byte
		want   []string
	}{
		{"KVWatch", grpc.StreamDesc{ServerStreams: true}, strField(1, badUTF8), []string{"tenure.v1.KVWatchRequest", "field key is not valid UTF-8"}},
		{"Observe", grpc.StreamDesc{ServerStreams: true}, truncated, []string{"tenure.v1.ObserveRequest", "cannot parse"}},
		{"SnapshotRestore", grpc.StreamDesc{ClientStreams: true}, truncated, []string{"tenure.v1.SnapshotChunk", "cannot parse"}},
		{"Sessions", grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, msgField(1, varintField(1, 7), msgField(2, varintField(1, 1), msgField(2, strField(3, badUTF8)))), []string{"tenure.v1.SessionFrames", "field frames[0].request.open.owner is not valid UTF-8"}},
	}
	for _, tc := range streams {
		st, err := conn.NewStream(ctx, &tc.desc, "/tenure.v1.Tenure/"+tc.method)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.SendMsg(&tc.req); err != nil {
			t.Fatalf("%s: send: %v", tc.method, err)
		}
		if err := st.CloseSend(); err != nil {
			t.Fatal(err)
		}
		var resp []byte
		for err == nil {
			err = st.RecvMsg(&resp)
		}
		wantInvalid(t, tc.method, err, tc.want...)
	}

	// Nothing was created by any of it, and normal requests are served.
	c := testutil.Dial(t, srv.Addr())
	if got, err := c.Sessions(ctx); err != nil || len(got.GetSessions()) != 0 {
		t.Fatalf("sessions after the malformed requests: %v, %v", got, err)
	}
	if got, err := c.Range(ctx, "", 0); err != nil || len(got.KVs) != 0 {
		t.Fatalf("keys after the malformed requests: %+v, %v", got, err)
	}
	s := testutil.Session(t, ctx, c)
	m, err := s.Mutex("lock")
	if err != nil {
		t.Fatal(err)
	}
	h, err := m.Lock(ctx)
	if err != nil {
		t.Fatalf("lock after the malformed requests: %v", err)
	}
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestMalformedRequestOnAnOpenSession: a bad message after a good open
// ends the Sessions stream with INVALID_ARGUMENT; the session lives on
// (breaking a stream does not end it) and acquired nothing.
func TestMalformedRequestOnAnOpenSession(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := rawConn(t, srv.Addr())
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/tenure.v1.Tenure/Sessions")
	if err != nil {
		t.Fatal(err)
	}
	open, _ := proto.Marshal(&pb.SessionFrames{Frames: []*pb.SessionFrame{{Stream: 1, Request: &pb.SessionRequest{Id: 1, Op: &pb.SessionRequest_Open{Open: &pb.OpenSession{TtlMs: 60_000, Owner: "o"}}}}}})
	if err := st.SendMsg(&open); err != nil {
		t.Fatal(err)
	}
	var raw []byte
	if err := st.RecvMsg(&raw); err != nil {
		t.Fatal(err)
	}
	var replies pb.SessionReplies
	if err := proto.Unmarshal(raw, &replies); err != nil || len(replies.GetReplies()) != 1 || replies.GetReplies()[0].GetResponse().GetOpened() == nil {
		t.Fatalf("open answered %v (%v)", &replies, err)
	}
	opened := replies.GetReplies()[0].GetResponse()
	bad := msgField(1, varintField(1, 1), msgField(2, varintField(1, 2), msgField(4, strField(1, badUTF8))))
	if err := st.SendMsg(&bad); err != nil {
		t.Fatal(err)
	}
	for err == nil {
		err = st.RecvMsg(&raw)
	}
	wantInvalid(t, "acquire on an open session", err, "tenure.v1.SessionFrames", "field frames[0].request.acquire.name is not valid UTF-8")

	c := testutil.Dial(t, srv.Addr())
	got, err := c.Sessions(ctx)
	if err != nil || len(got.GetSessions()) != 1 || got.GetSessions()[0].GetId() != opened.GetOpened().GetSessionId() {
		t.Fatalf("sessions: %v, %v; want only session %d", got, err, opened.GetOpened().GetSessionId())
	}
	if s := got.GetSessions()[0]; len(s.GetHeld()) != 0 || len(s.GetWaiting()) != 0 {
		t.Fatalf("session %v holds or waits for something", s)
	}
}
