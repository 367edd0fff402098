package server_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestClientWaitsForALeader: requests sent to a node that serves but
// does not lead yet (it has just started) wait for the leader within the
// caller's context instead of failing "not the leader".
func TestClientWaitsForALeader(t *testing.T) {
	testutil.Slow(t)
	for round := range 5 { // the window before the election is short: try it a few times
		d, err := daemon.Start(daemon.Config{NodeID: "n1", DataDir: t.TempDir(), Listen: "127.0.0.1:0", HTTPListen: "", LogOutput: testutil.LogWriter(t, "n1")})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		c, err := client.Dial(ctx, d.Addr())
		if err != nil {
			t.Fatal(err)
		}
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		if _, err := c.Put(rctx, "k", []byte("v")); err != nil {
			t.Fatalf("round %d: put right after start: %v", round, err)
		}
		s, err := c.NewSession(rctx)
		if err != nil {
			t.Fatalf("round %d: new session right after start: %v", round, err)
		}
		s.Close(rctx)
		rcancel()
		c.Close()
		cancel()
		<-done
	}
}

// TestNoLeaderSaysSo: with no leader to be had (a member whose peers are
// gone), a request fails when its context ends, saying that no leader
// answered and naming the endpoint: not that the node cannot be reached.
func TestNoLeaderSaysSo(t *testing.T) {
	testutil.Slow(t)
	ms := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := clusterClient(t, ms)
	_, leaderID := voterIDs(t, ctx, c)
	var rest *member
	for _, m := range ms {
		if m.id != leaderID {
			if rest == nil {
				rest = m
				continue
			}
		}
		m.stop()
	}
	one, err := client.Dial(ctx, rest.d.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
	defer rcancel()
	_, err = one.Put(rctx, "k", []byte("v"))
	if !errors.Is(err, client.ErrNoLeader) || !errors.Is(err, client.ErrUnavailable) || !strings.Contains(err.Error(), rest.d.Addr()) {
		t.Fatalf("put without a leader: %v, want ErrNoLeader naming %s", err, rest.d.Addr())
	}
}
