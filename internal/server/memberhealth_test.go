package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/testutil"
)

// startHTTPCluster starts a cluster of three voters on loopback, each with
// its HTTP listener.
func startHTTPCluster(t *testing.T) []*member {
	t.Helper()
	root := t.TempDir()
	peers := make(map[string]string)
	for i := 1; i <= 3; i++ {
		peers[fmt.Sprint("n", i)] = freePort(t)
	}
	ms := make([]*member, 3)
	started := make(chan *member, 3)
	for i := range ms {
		id := fmt.Sprint("n", i+1)
		go func() {
			cfg := daemon.Config{NodeID: id, DataDir: filepath.Join(root, id), Listen: "127.0.0.1:0", HTTPListen: "127.0.0.1:0", PeerListen: peers[id], BootstrapPeers: peers, LogOutput: testutil.LogWriter(t, id)}
			started <- startDaemonMember(t, cfg)
		}()
	}
	for i := range ms {
		ms[i] = <-started
	}
	return ms
}

// startDaemonMember starts a member with cfg and waits until it is ready.
func startDaemonMember(t *testing.T, cfg daemon.Config) *member {
	t.Helper()
	d, err := daemon.Start(cfg)
	if err != nil {
		t.Error(err)
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	m := &member{id: cfg.NodeID, peer: cfg.PeerListen, d: d}
	stopped := false
	m.stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(m.stop)
	select {
	case <-d.Ready():
	case err := <-done:
		t.Errorf("%s stopped: %v", cfg.NodeID, err)
	case <-time.After(30 * time.Second):
		t.Errorf("%s not ready", cfg.NodeID)
	}
	return m
}

// httpGet returns the status and body of GET url.
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestMemberHealthShowsADeadMember: with one of three members stopped,
// the leader's member list shows it unreachable (the others reachable,
// with their lag), its metrics export tenure_member_reachable 0 for it,
// /healthz?verbose and the status say "degraded: n3 unreachable", and
// /readyz still answers 200 (a quorum remains). Before, every view looked
// healthy. Back again, the member is reachable and the cluster no longer
// degraded.
func TestMemberHealthShowsADeadMember(t *testing.T) {
	testutil.Slow(t)
	ms := startHTTPCluster(t)
	if t.Failed() {
		t.FailNow()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusterClient(t, ms)
	wantWrites(t, ctx, c)
	_, leaderID := voterIDs(t, ctx, c)
	var leader, down *member
	for _, m := range ms {
		switch {
		case m.id == leaderID:
			leader = m
		case down == nil:
			down = m
		}
	}
	if leader == nil {
		t.Fatalf("no member is the leader %q", leaderID)
	}
	lc := testutil.Dial(t, leader.d.Addr())
	httpBase := "http://" + leader.d.HTTPAddr()

	// health reads the leader's member list: the members by id, nil if
	// the answer is not the leader's view.
	health := func() map[string]*pb.Member {
		resp, err := lc.Members(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetView() != leaderID {
			t.Logf("member list of the leader %s gives the view of %q", leaderID, resp.GetView())
			return nil
		}
		out := make(map[string]*pb.Member)
		for _, m := range resp.GetMembers() {
			out[m.GetId()] = m
		}
		return out
	}
	testutil.WaitFor(t, "every member reachable", 20*time.Second, func() bool {
		ms := health()
		for _, m := range ms {
			if !m.GetReachable() {
				return false
			}
		}
		return len(ms) == 3
	})
	if st, err := lc.Status(ctx); err != nil || st.GetDegraded() != "" {
		t.Fatalf("status of a healthy cluster: degraded %q, %v", st.GetDegraded(), err)
	}
	if _, body := httpGet(t, httpBase+"/healthz?verbose"); !strings.Contains(body, "[+]members ok") {
		t.Fatalf("healthz?verbose of a healthy cluster: %q", body)
	}

	down.stop()
	want := "degraded: " + down.id + " unreachable"
	var seen map[string]*pb.Member
	testutil.WaitFor(t, down.id+" unreachable in the member list", 20*time.Second, func() bool {
		seen = health()
		return seen != nil && !seen[down.id].GetReachable()
	})
	for id, m := range seen {
		switch {
		case id == down.id && m.GetLastContactMs() < 1000:
			t.Fatalf("%s unreachable with a last contact %dms ago", id, m.GetLastContactMs())
		case id != down.id && !m.GetReachable():
			t.Fatalf("%s unreachable too: %v", id, m)
		case id == leaderID && (m.GetLag() != 0 || m.GetLastContactMs() != 0 || m.GetMatchIndex() == 0):
			t.Fatalf("the leader's own entry: %v", m)
		}
	}
	if st, err := lc.Status(ctx); err != nil || "degraded: "+st.GetDegraded() != want || !st.GetReady() {
		t.Fatalf("status with %s down: degraded %q, ready %v, %v", down.id, st.GetDegraded(), st.GetReady(), err)
	}
	if code, body := httpGet(t, httpBase+"/healthz?verbose"); code != http.StatusOK || !strings.Contains(body, want) {
		t.Fatalf("healthz?verbose with %s down: %d %q", down.id, code, body)
	}
	if code, body := httpGet(t, httpBase+"/readyz"); code != http.StatusOK {
		t.Fatalf("readyz with a quorum: %d %q", code, body)
	}
	_, metrics := httpGet(t, httpBase+"/metrics")
	for _, m := range ms {
		up := "1"
		if m == down {
			up = "0"
		}
		re := regexp.MustCompile(`(?m)^tenure_member_reachable\{member="` + m.id + `"\} ` + up + `$`)
		if !re.MatchString(metrics) {
			t.Fatalf("metrics lack tenure_member_reachable{member=%q} %s:\n%s", m.id, up, grepLines(metrics, "tenure_member_"))
		}
	}
	for _, name := range []string{"tenure_member_replication_lag_entries", "tenure_member_last_contact_seconds"} {
		if !strings.Contains(metrics, name+`{member="`+down.id+`"}`) {
			t.Fatalf("metrics lack %s for %s:\n%s", name, down.id, grepLines(metrics, "tenure_member_"))
		}
	}
	// A follower does not watch its peers: it exports no member series.
	for _, m := range ms {
		if m == leader || m == down {
			continue
		}
		if _, body := httpGet(t, "http://"+m.d.HTTPAddr()+"/metrics"); strings.Contains(body, "tenure_member_reachable{") {
			t.Fatalf("follower %s exports member health:\n%s", m.id, grepLines(body, "tenure_member_"))
		}
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
