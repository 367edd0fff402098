package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestRestartedFollowerIsReadyWithItsState: a follower that restarts
// replays its log once the leader tells it what is committed; it reports
// ready (Ready, hence the serve line, /readyz and status) only when its
// state holds all of it.
func TestRestartedFollowerIsReadyWithItsState(t *testing.T) {
	ms := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	q := clusterClient(t, ms).Queue("q")
	const batches = 150
	items := make([]client.BatchItem, client.MaxBatch)
	for i := range items {
		items[i].Payload = make([]byte, 100)
	}
	for range batches {
		if _, err := q.EnqueueBatch(ctx, items); err != nil {
			t.Fatal(err)
		}
	}
	var follower *member
	for _, m := range ms {
		if !m.d.Node.Health().IsLeader {
			follower = m
		}
	}
	testutil.WaitFor(t, "the follower to apply everything", time.Minute, func() bool {
		n := 0
		follower.d.Node.Read(func(st *fsm.State) { n = st.QueueLen("q") })
		return n == batches*client.MaxBatch
	})
	follower.stop()
	again := startMember(t, follower.root, follower.id, follower.peer, nil) // returns once Ready
	n := 0
	again.d.Node.Read(func(st *fsm.State) { n = st.QueueLen("q") })
	if n != batches*client.MaxBatch {
		t.Fatalf("the restarted follower was ready with %d of its %d items", n, batches*client.MaxBatch)
	}
	if h := again.d.Node.Health(); !h.Ready() {
		t.Fatalf("Ready closed, yet Health says %q", h.Reason())
	}
}
