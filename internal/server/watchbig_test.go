package server_test

import (
	"context"
	"testing"
	"time"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/server"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestWatchOfLargeValues: a watch replaying changes of values at the
// default --max-value-len (1.5 MiB) reaches a client with gRPC's default
// 4 MiB receive limit: the server splits its responses, at revisions.
func TestWatchOfLargeValues(t *testing.T) {
	srv := testutil.StartConfig(t, daemon.Config{})
	api := testutil.API(t, srv.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	value := make([]byte, server.DefaultKVLimits().MaxValueLen)
	var first uint64
	for i := range 3 {
		r, err := api.KVPut(ctx, &pb.KVPutRequest{Key: "big", Value: value})
		if err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		if first == 0 {
			first = r.GetRevision()
		}
	}
	w, err := api.KVWatch(ctx, &pb.KVWatchRequest{Key: "big", StartRevision: first})
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for got < 3 {
		resp, err := w.Recv()
		if err != nil {
			t.Fatalf("after %d events: %v", got, err)
		}
		got += len(resp.GetEvents())
	}
}
