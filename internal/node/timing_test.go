package node

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tenure-io/tenure/internal/fsm"
)

// TestConfigTiming: the failure-detection settings are checked against
// each other before anything is opened, each refusal naming the flag;
// zero values take the defaults, which differ for a standalone node; the
// longest timing allowed still leaves the longest session TTL (1 h)
// outliving one election.
func TestConfigTiming(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name                 string
		peer                 string
		hb, election, lease  time.Duration
		want                 string // "" valid
		wantHB, wantElection time.Duration
	}{
		{name: "defaults in a cluster", peer: "127.0.0.1:1", wantHB: DefaultHeartbeatTimeout, wantElection: DefaultElectionTimeout},
		{name: "defaults standalone", wantHB: 200 * ms, wantElection: 200 * ms},
		{name: "a longer heartbeat raises the election default", peer: "127.0.0.1:1", hb: 2 * time.Second, wantHB: 2 * time.Second, wantElection: 2 * time.Second},
		{name: "tuned", peer: "127.0.0.1:1", hb: time.Second, election: 3 * time.Second, lease: 500 * ms, wantHB: time.Second, wantElection: 3 * time.Second},
		{name: "heartbeat too short", peer: "127.0.0.1:1", hb: 5 * ms, want: "--heartbeat-timeout 5ms is outside"},
		{name: "election too long", peer: "127.0.0.1:1", election: 2 * time.Minute, want: "--election-timeout 2m0s is outside"},
		{name: "lease past the heartbeat", peer: "127.0.0.1:1", hb: 300 * ms, lease: 400 * ms, want: "--leader-lease-timeout 400ms must not exceed --heartbeat-timeout 300ms"},
		{name: "election below the heartbeat", peer: "127.0.0.1:1", hb: time.Second, election: 500 * ms, want: "--election-timeout 500ms must not be shorter than --heartbeat-timeout 1s"},
		{name: "the longest timing", peer: "127.0.0.1:1", hb: time.Minute, election: time.Minute, lease: time.Second, wantHB: time.Minute, wantElection: time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{PeerAddr: tc.peer, HeartbeatTimeout: tc.hb, ElectionTimeout: tc.election, LeaderLeaseTimeout: tc.lease}
			err := c.Validate()
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Validate: %v, want %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c.fill()
			if c.HeartbeatTimeout != tc.wantHB || c.ElectionTimeout != tc.wantElection || c.LeaderLeaseTimeout > c.HeartbeatTimeout {
				t.Fatalf("filled: heartbeat %v, election %v, lease %v", c.HeartbeatTimeout, c.ElectionTimeout, c.LeaderLeaseTimeout)
			}
			if got, want := c.ElectionBound(), 2*(c.HeartbeatTimeout+c.ElectionTimeout); got != want {
				t.Fatalf("ElectionBound %v, want %v", got, want)
			}
			if c.MinSurvivingTTL() != 3*c.ElectionBound() || c.MinSurvivingTTL() > time.Duration(fsm.MaxSessionTTLMs)*time.Millisecond {
				t.Fatalf("MinSurvivingTTL %v", c.MinSurvivingTTL())
			}
		})
	}
	// The defaults in a cluster: the clients' default TTL (10 s) outlives
	// one election.
	if ttl := (Config{PeerAddr: "127.0.0.1:1"}).MinSurvivingTTL(); ttl != 6*time.Second {
		t.Fatalf("MinSurvivingTTL with the defaults: %v", ttl)
	}
}

// TestPeerWatchView: the leader's view of its peers starts anew with each
// term (a peer not heard from yet counts from then), a probe answered for
// an older term is dropped, one probe at a time goes to each peer, and a
// peer removed from the configuration is forgotten.
func TestPeerWatchView(t *testing.T) {
	var w peerWatch
	t0 := time.Unix(1000, 0)
	servers := []raft.Server{{ID: "n1"}, {ID: "n2"}, {ID: "n3"}}
	due := w.due(5, t0, servers, "n1")
	if len(due) != 2 || w.since != t0 {
		t.Fatalf("first round: due %v, since %v", due, w.since)
	}
	if p := w.peers["n2"]; p.added != t0 || !p.contact.IsZero() {
		t.Fatalf("n2 before its first answer: %+v", p)
	}
	if again := w.due(5, t0.Add(time.Second), servers, "n1"); len(again) != 0 {
		t.Fatalf("probes in flight were sent again: %v", again)
	}
	w.answered(5, "n2", 42, 45, true, t0.Add(2*time.Second))
	w.answered(5, "n3", 0, 45, false, t0.Add(2*time.Second))
	if p := w.peers["n2"]; p.contact != t0.Add(2*time.Second) || p.lastLog != 42 || p.sentLast != 45 || p.inflight {
		t.Fatalf("n2 after its answer: %+v", p)
	}
	if p := w.peers["n3"]; !p.contact.IsZero() || p.inflight {
		t.Fatalf("n3 after a failed probe: %+v", p)
	}
	// n3 removed: forgotten. A new term: a new view.
	if due := w.due(5, t0.Add(3*time.Second), servers[:2], "n1"); len(due) != 1 || w.peers["n3"] != nil {
		t.Fatalf("after n3's removal: due %v, peers %v", due, w.peers)
	}
	w.due(6, t0.Add(4*time.Second), servers, "n1")
	w.answered(5, "n2", 50, 50, true, t0.Add(5*time.Second)) // a probe of term 5
	if p := w.peers["n2"]; w.since != t0.Add(4*time.Second) || !p.contact.IsZero() {
		t.Fatalf("term 6's view took term 5's answer: since %v, n2 %+v", w.since, p)
	}
}
