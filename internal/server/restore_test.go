package server_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/server"
	"github.com/tenure-io/tenure/internal/testutil"
)

// sendUntilRefused sends chunks of size bytes, up to total, and returns
// how many bytes were sent before the server ended the stream, and the
// status it ended it with.
func sendUntilRefused(t *testing.T, stream pb.Tenure_SnapshotRestoreClient, size, total int) (int, error) {
	t.Helper()
	chunk := make([]byte, size)
	sent := 0
	for sent < total {
		if err := stream.Send(&pb.SnapshotChunk{Data: chunk}); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("send: %v", err)
			}
			break
		}
		sent += size
	}
	_, err := stream.CloseAndRecv()
	return sent, err
}

// TestRestoreStreamsBounded: while one restore stream is open, a second
// is refused at once with RESOURCE_EXHAUSTED naming the limit; a stream
// past the byte limit is refused as soon as it passes it, not after the
// client sent everything; once the first ends, a new one is accepted.
func TestRestoreStreamsBounded(t *testing.T) {
	const limit = 4 << 20
	srv := testutil.StartConfig(t, daemon.Config{Limits: server.Limits{Restore: server.RestoreLimits{MaxBytes: limit}}})
	api := testutil.API(t, srv.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// A first stream holds the node's only restore slot; a second opened
	// after it is refused at once. (Should the server run the second's
	// handler first, the first is the one refused: try again.)
	var first pb.Tenure_SnapshotRestoreClient
	for attempt := 0; first == nil; attempt++ {
		if attempt == 10 {
			t.Fatal("a second concurrent restore stream was never refused")
		}
		a, err := api.SnapshotRestore(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Send(&pb.SnapshotChunk{Data: make([]byte, 1<<20)}); err != nil {
			t.Fatal(err)
		}
		b, err := api.SnapshotRestore(ctx)
		if err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		_, err = sendUntilRefused(t, b, 1<<20, 1<<20)
		if status.Code(err) == codes.ResourceExhausted {
			if !strings.Contains(err.Error(), "--max-restore-streams") {
				t.Fatalf("second stream refused with %v, want the limit named", err)
			}
			if d := time.Since(began); d > 5*time.Second {
				t.Fatalf("the second stream was refused only after %v", d)
			}
			first = a
			continue
		}
		if _, err := sendUntilRefused(t, a, 1<<20, 1<<20); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("of two concurrent restore streams none was refused: %v", err)
		}
	}
	// The first goes on to the byte limit and is refused early.
	sent, err := sendUntilRefused(t, first, 1<<20, 256<<20)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--max-restore-bytes") {
		t.Fatalf("oversize stream: %v, want RESOURCE_EXHAUSTED naming --max-restore-bytes", err)
	}
	t.Logf("the oversize stream was refused after %d bytes sent (limit %d)", sent, limit)
	if sent > 8*limit {
		t.Fatalf("the oversize stream was refused only after %d bytes (limit %d)", sent, limit)
	}

	// Both slots and bytes are free again: a well-formed restore works.
	var saved []byte
	save, err := api.SnapshotSave(ctx, &pb.SnapshotSaveRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		c, err := save.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		saved = append(saved, c.GetData()...)
	}
	again, err := api.SnapshotRestore(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Send(&pb.SnapshotChunk{Data: saved}); err != nil {
		t.Fatal(err)
	}
	if _, err := again.CloseAndRecv(); err != nil {
		t.Fatalf("restore after the refused ones: %v", err)
	}
}
