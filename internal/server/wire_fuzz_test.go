package server

// Fuzz target of the strict request decoder (wire.go): the bytes every RPC
// and every session stream frame arrives as. Its seed corpus is under
// testdata/fuzz/FuzzDecodeStrict; TENURE_WRITE_FUZZ_SEEDS=1 rewrites it
// (TestWriteFuzzSeeds).

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/tenure-io/tenure/api/tenurepb"
)

// fuzzRequests are the request types FuzzDecodeStrict decodes into,
// chosen by its first argument: the session stream's frames first, then
// requests whose fields are the most nested or the largest.
var fuzzRequests = []func() proto.Message{
	func() proto.Message { return &pb.SessionFrames{} },
	func() proto.Message { return &pb.KVTxnRequest{} },
	func() proto.Message { return &pb.KVRangeRequest{} },
	func() proto.Message { return &pb.FencedPutRequest{} },
	func() proto.Message { return &pb.QueueEnqueueBatchRequest{} },
	func() proto.Message { return &pb.QueueSettleBatchRequest{} },
	func() proto.Message { return &pb.SnapshotChunk{} },
	func() proto.Message { return &pb.AclPolicyCreateRequest{} },
	func() proto.Message { return &pb.KVWatchRequest{} },
	func() proto.Message { return &pb.SetLimitsRequest{} },
}

// decodeBytes decodes data into m as a handler receives a request.
func decodeBytes(data []byte, m proto.Message) error {
	return decodeStrict(func(v any) error {
		v.(*wireMessage).data = mem.BufferSlice{mem.SliceBuffer(data)}
		return nil
	}, m)
}

// FuzzDecodeStrict decodes bytes as a request: nothing panics; bytes that
// are refused are INVALID_ARGUMENT naming the request's type (and the
// field, when a string is not UTF-8); a request that is accepted holds no
// string that is not UTF-8, and encodes to bytes that decode to the same
// request.
func FuzzDecodeStrict(f *testing.F) {
	f.Fuzz(func(t *testing.T, kind uint8, data []byte) {
		m := fuzzRequests[int(kind)%len(fuzzRequests)]()
		name := string(m.ProtoReflect().Descriptor().FullName())
		err := decodeBytes(data, m)
		if err != nil {
			st := status.Convert(err)
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), name) {
				t.Fatalf("refused as %s: %v, want INVALID_ARGUMENT naming %s", name, err, name)
			}
			if strings.Contains(st.Message(), "not valid UTF-8") && !strings.Contains(st.Message(), "field ") {
				t.Fatalf("a string that is not UTF-8, with no field named: %v", err)
			}
			return
		}
		if path := badString(m.ProtoReflect().Descriptor(), data, ""); path != "" {
			t.Fatalf("accepted a %s whose field %s is not UTF-8", name, path)
		}
		enc, err := proto.Marshal(m)
		if err != nil {
			t.Fatalf("an accepted %s does not encode: %v", name, err)
		}
		again := m.ProtoReflect().New().Interface()
		if err := decodeBytes(enc, again); err != nil || !proto.Equal(m, again) {
			t.Fatalf("an accepted %s, encoded and decoded again: %v, equal %v", name, err, proto.Equal(m, again))
		}
	})
}

// fuzzSeeds are FuzzDecodeStrict's seeds: valid requests, and one of them
// with a string that is not UTF-8.
func fuzzSeeds(t *testing.T) [][]any {
	frames := &pb.SessionFrames{Frames: []*pb.SessionFrame{
		{Stream: 1, Request: &pb.SessionRequest{Id: 1, Op: &pb.SessionRequest_Open{Open: &pb.OpenSession{TtlMs: 10_000, Owner: "w1"}}}},
		{Stream: 1, Request: &pb.SessionRequest{Id: 2, Op: &pb.SessionRequest_Acquire{Acquire: &pb.AcquireLock{Name: "jobs/1", Wait: true}}}},
		{Stream: 1, Request: &pb.SessionRequest{Id: 3, Op: &pb.SessionRequest_KeepAlive{KeepAlive: &pb.KeepAlive{}}}},
		{Stream: 2, End: true},
	}}
	txn := &pb.KVTxnRequest{
		Compare: []*pb.KVCompare{{Key: "k/a", Target: pb.KVCompareTarget(1), Result: pb.KVCompareResult(1), Value: []byte("1")}},
		Success: []*pb.KVRequestOp{{Op: &pb.KVRequestOp_Range{Range: &pb.KVRangeRequest{Key: "k/", Prefix: true, StartKey: "k/b"}}}},
		Failure: []*pb.KVRequestOp{{Op: &pb.KVRequestOp_Put{Put: &pb.KVPutRequest{Key: "k/a", Value: []byte("1")}}}},
	}
	seeds := []struct {
		kind int
		m    proto.Message
	}{
		{0, frames},
		{1, txn},
		{2, &pb.KVRangeRequest{Key: "k/", Prefix: true, Limit: 10}},
		{3, &pb.FencedPutRequest{Key: "reg", Value: []byte("v"), Token: 7, Lock: "jobs/1", OperationId: "op"}},
		{4, &pb.QueueEnqueueBatchRequest{Queue: "q", Items: []*pb.QueueEnqueueItem{{Payload: []byte("p"), OperationId: "a"}, {Payload: []byte("q")}}}},
		{7, &pb.AclPolicyCreateRequest{Policy: &pb.AclPolicy{Name: "worker", Rules: []*pb.AclRule{{Kind: "lock", Prefix: "jobs/", Access: "write"}}}}},
	}
	var out [][]any
	for _, s := range seeds {
		b, err := proto.Marshal(s.m)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, []any{uint8(s.kind), b})
	}
	bad, _ := proto.Marshal(&pb.KVRangeRequest{Key: "k"})
	out = append(out, []any{uint8(2), append(bad[:len(bad)-1:len(bad)-1], 0xff)})
	return out
}

// TestWriteFuzzSeeds rewrites testdata/fuzz when TENURE_WRITE_FUZZ_SEEDS
// is set.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("TENURE_WRITE_FUZZ_SEEDS") == "" {
		t.Skip("set TENURE_WRITE_FUZZ_SEEDS=1 to rewrite testdata/fuzz")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzDecodeStrict")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, args := range fuzzSeeds(t) {
		body := fmt.Sprintf("go test fuzz v1\nuint8(%d)\n[]byte(%q)\n", args[0], args[1])
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed%02d", i)), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
