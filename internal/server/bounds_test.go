package server_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/server"
	"github.com/tenure-io/tenure/internal/testutil"
)

// fillBig writes n keys of 60 KiB under prefix.
func fillBig(ctx context.Context, t *testing.T, c *client.Client, prefix string, n int) {
	t.Helper()
	big := make([]byte, 60<<10)
	for i := 0; i < n; i += 8 {
		var ops []client.Op
		for j := i; j < min(i+8, n); j++ {
			ops = append(ops, client.OpPut(fmt.Sprintf("%s%04d", prefix, j), big))
		}
		if _, err := c.Txn(ctx, nil, ops, nil); err != nil {
			t.Fatal(err)
		}
	}
}

func rangeOps(prefix string, n int) []*pb.KVRequestOp {
	ops := make([]*pb.KVRequestOp, n)
	for i := range ops {
		ops[i] = &pb.KVRequestOp{Op: &pb.KVRequestOp_Range{Range: &pb.KVRangeRequest{Key: prefix, Prefix: true}}}
	}
	return ops
}

// refusedForSize checks that err is RESOURCE_EXHAUSTED naming
// --max-response-bytes.
func refusedForSize(t *testing.T, err error, what string) {
	t.Helper()
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "--max-response-bytes") {
		t.Fatalf("%s: %v, want RESOURCE_EXHAUSTED naming --max-response-bytes", what, err)
	}
}

// TestKVTxnRangesArePagedAndBounded: one native KVTxn of many full-prefix
// ranges over a few MiB of keys (the attack: every range answered whole,
// the node's memory grew with ops × data) is refused RESOURCE_EXHAUSTED
// naming --max-response-bytes, without the node building the answer (its
// allocations stay far below what the answer would take) and without
// writing the transaction's puts; a range alone in a transaction answers
// one page with more set, and its continuation (start_key) reads the rest.
func TestKVTxnRangesArePagedAndBounded(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	const keys = 80 // 4.7 MiB
	fillBig(ctx, t, c, "big/", keys)
	api := testutil.API(t, srv.Addr())
	bigRecv := grpc.MaxCallRecvMsgSize(1 << 30) // the attacker accepts any answer

	// 40 full ranges: 190 MiB answered whole before.
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	ops := append([]*pb.KVRequestOp{{Op: &pb.KVRequestOp_Put{Put: &pb.KVPutRequest{Key: "marker", Value: []byte("x")}}}}, rangeOps("big/", 40)...)
	_, err := api.KVTxn(ctx, &pb.KVTxnRequest{Success: ops}, bigRecv)
	runtime.ReadMemStats(&after)
	refusedForSize(t, err, "a txn of 40 full ranges over 4.7 MiB")
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 48<<20 {
		t.Fatalf("the refused txn allocated %d MiB (its answer would be 190 MiB)", grew>>20)
	}
	if r, err := c.Get(ctx, "marker"); err != nil || len(r.KVs) != 0 {
		t.Fatalf("the refused txn's put was written: %+v %v", r, err)
	}

	// One range: one page, more set; the continuation reads the rest.
	var got []string
	start := ""
	for page := 0; ; page++ {
		if page > keys {
			t.Fatal("paging did not end")
		}
		resp, err := api.KVTxn(ctx, &pb.KVTxnRequest{Success: []*pb.KVRequestOp{{Op: &pb.KVRequestOp_Range{Range: &pb.KVRangeRequest{Key: "big/", Prefix: true, StartKey: start}}}}}, bigRecv)
		if err != nil {
			t.Fatalf("page %d: %v", page, err)
		}
		rr := resp.GetResponses()[0].GetRange()
		if proto.Size(rr) > pageBytes || len(rr.GetKvs()) == 0 {
			t.Fatalf("page %d: %d keys, %d bytes (a page is at most %d)", page, len(rr.GetKvs()), proto.Size(rr), pageBytes)
		}
		for _, kv := range rr.GetKvs() {
			got = append(got, kv.GetKey())
		}
		if !rr.GetMore() {
			break
		}
		if page == 0 && len(got) == keys {
			t.Fatal("the first page held every key")
		}
		start = got[len(got)-1] + "\x00"
	}
	if len(got) != keys {
		t.Fatalf("paged %d keys, want %d", len(got), keys)
	}

	// Two small ranges are answered whole.
	fillBig(ctx, t, c, "few/", 3)
	resp, err := api.KVTxn(ctx, &pb.KVTxnRequest{Success: rangeOps("few/", 2)})
	if err != nil || len(resp.GetResponses()) != 2 || len(resp.GetResponses()[1].GetRange().GetKvs()) != 3 || resp.GetResponses()[1].GetRange().GetMore() {
		t.Fatalf("two small ranges: %v %v", resp, err)
	}
}

// TestMaxResponseBytes: --max-response-bytes set to its least refuses a
// transaction whose ranges would answer more (two pages), and serves one
// under it; a value below a page is refused at startup.
func TestMaxResponseBytes(t *testing.T) {
	lim := server.DefaultLimits()
	lim.MaxResponseBytes = server.MinResponseBytes - 1
	if err := lim.Validate(); err == nil || !strings.Contains(err.Error(), "--max-response-bytes") {
		t.Fatalf("--max-response-bytes below a page: %v", err)
	}
	lim.MaxResponseBytes = server.MinResponseBytes
	srv := testutil.StartConfig(t, daemon.Config{Limits: lim})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	fillBig(ctx, t, c, "k/", 40) // 2.3 MiB
	api := testutil.API(t, srv.Addr())
	_, err := api.KVTxn(ctx, &pb.KVTxnRequest{Success: rangeOps("k/", 2)})
	refusedForSize(t, err, "two txn ranges of a page each under a bound of one page")
	limited := &pb.KVRequestOp{Op: &pb.KVRequestOp_Range{Range: &pb.KVRangeRequest{Key: "k/", Prefix: true, Limit: 10}}}
	if resp, err := api.KVTxn(ctx, &pb.KVTxnRequest{Success: []*pb.KVRequestOp{limited, limited}}); err != nil || len(resp.GetResponses()[1].GetRange().GetKvs()) != 10 {
		t.Fatalf("two txn ranges of 10 keys: %v", err)
	}
	if resp, err := api.KVTxn(ctx, &pb.KVTxnRequest{Success: rangeOps("k/", 1)}); err != nil || !resp.GetResponses()[0].GetRange().GetMore() {
		t.Fatalf("one txn range: a page with more set, got %v", err)
	}
}
