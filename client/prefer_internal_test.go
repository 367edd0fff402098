package client

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
)

// TestLeaderHintStaysWhenTheLeaderCannotBeReached: a hint naming an
// endpoint that does not answer leaves the client where it is, with the
// next check after a pause that doubles from preferMinWait; a hint naming
// an address the client was not given is ignored without discovery; and
// Close ends the background check.
func TestLeaderHintStaysWhenTheLeaderCannotBeReached(t *testing.T) {
	// An address nothing listens on: the check fails at once.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	c, err := Dial(context.Background(), "127.0.0.1:7,"+dead)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	wait := func() (time.Duration, bool) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.pref.wait, c.pref.running
	}

	c.hinted(0, metadata.Pairs(leaderHintHeader, "127.0.0.1:9")) // not given
	if _, running := wait(); running {
		t.Fatal("a hint naming an address not given started a check without discovery")
	}
	c.hinted(1, metadata.Pairs(leaderHintHeader, dead)) // not the endpoint in use
	if _, running := wait(); running {
		t.Fatal("a hint from an endpoint not in use started a check")
	}

	c.hinted(0, metadata.Pairs(leaderHintHeader, dead))
	deadline := time.Now().Add(10 * time.Second)
	for {
		if w, _ := wait(); w >= 2*preferMinWait {
			break
		}
		if time.Now().After(deadline) {
			w, running := wait()
			t.Fatalf("no second failed check within 10 s: wait %v, running %v", w, running)
		}
		time.Sleep(10 * time.Millisecond) // polling, bounded by the deadline
	}
	if c.Endpoint() != "127.0.0.1:7" {
		t.Fatalf("the client moved to %s, which never answered", c.Endpoint())
	}
	done := make(chan struct{})
	go func() { c.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end the background check")
	}
}
