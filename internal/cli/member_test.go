package cli

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/testutil"
)

// freeLoopback returns a loopback address nothing listens on now, below
// the ports the system hands out for outgoing connections.
func freeLoopback(t *testing.T) string {
	t.Helper()
	for range 200 {
		addr := fmt.Sprintf("127.0.0.1:%d", 20000+rand.IntN(12000))
		if l, err := net.Listen("tcp", addr); err == nil {
			l.Close()
			return addr
		}
	}
	t.Fatal("no free loopback port")
	return ""
}

// serving is one in-process `tenure serve`.
type serving struct {
	out, errb *syncBuffer
	done      chan struct{} // closed when serve returned
	code      int           // its exit code, once done is closed
	stop      context.CancelFunc
}

// startServe runs `tenure serve args...` in-process until the test ends
// or stop is called.
func startServe(t *testing.T, args ...string) *serving {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &serving{out: &syncBuffer{}, errb: &syncBuffer{}, done: make(chan struct{}), stop: cancel}
	go func() {
		s.code = Run(ctx, append([]string{"serve", "--http-listen", "127.0.0.1:0"}, args...), Streams{Out: s.out, Err: s.errb})
		close(s.done)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.done:
		case <-time.After(20 * time.Second):
			t.Errorf("serve %v did not stop", args)
		}
	})
	return s
}

var readyLine = regexp.MustCompile(`^tenure: serving on (127\.0\.0\.1:\d+) `)

// waitServing waits for the ready line and returns the client address.
func (s *serving) waitServing(t *testing.T) string {
	t.Helper()
	testutil.WaitFor(t, "the ready line", 30*time.Second, func() bool {
		select {
		case <-s.done:
			t.Fatalf("serve exited %d: %s", s.code, s.errb.String())
		default:
		}
		return readyLine.MatchString(s.out.String())
	})
	return readyLine.FindStringSubmatch(s.out.String())[1]
}

// TestMemberRebuild: `tenure member rebuild` run for a member that lost
// its data and is still down waits for its peer up to --timeout and then
// fails with one line saying that nothing was changed: the member is still
// a voter (before, it had already been removed). Run again, it waits for
// the member, started meanwhile on an empty data dir with --join, and
// rebuilds it. A rebuild interrupted after its removal (the member left
// out) is resumed by running it again; run on the healthy member, it
// removes and adds it again. Each time the member ends a voter holding the
// state written before it was lost, and nothing is lost.
func TestMemberRebuild(t *testing.T) {
	testutil.Slow(t)
	root := t.TempDir()
	ids := []string{"n1", "n2", "n3"}
	peers := make(map[string]string)
	var boot []string
	for _, id := range ids {
		peers[id] = freeLoopback(t)
		boot = append(boot, id+"="+peers[id])
	}
	dataDir := func(id string) string { return filepath.Join(root, id) }
	nodes := make(map[string]*serving)
	addrs := make(map[string]string)
	for _, id := range ids {
		nodes[id] = startServe(t, "--node-id", id, "--listen", "127.0.0.1:0", "--peer-listen", peers[id],
			"--data-dir", dataDir(id), "--bootstrap-peers", strings.Join(boot, ","))
	}
	for _, id := range ids {
		addrs[id] = nodes[id].waitServing(t)
	}
	others := addrs["n1"] + "," + addrs["n2"]
	runJSON(t, others+","+addrs["n3"], 0, "kv", "put", "before", "v1")

	// member list gives the leader's view, whichever endpoint comes first
	// (while there is a leader: from followers only, the health is null).
	all := others + "," + addrs["n3"]
	health := func() (reachable map[string]any) {
		m := runJSON(t, all, 0, "member", "list")
		if m["view"] == "" {
			return nil
		}
		reachable = make(map[string]any)
		for _, x := range m["members"].([]any) {
			mem := x.(map[string]any)
			hasKeys(t, mem, map[string]string{"id": "string", "peer_addr": "string", "voter": "bool", "leader": "bool", "reachable": "bool", "last_contact_ms": "number", "match_index": "number", "lag": "number"})
			reachable[mem["id"].(string)] = mem["reachable"]
		}
		return reachable
	}
	testutil.WaitFor(t, "member list to show every member reachable", 20*time.Second, func() bool {
		up := health()
		return up["n1"] == true && up["n2"] == true && up["n3"] == true
	})

	// n3 loses its data.
	nodes["n3"].stop()
	if <-nodes["n3"].done; nodes["n3"].code != 0 {
		t.Fatalf("n3 stopped with %d: %s", nodes["n3"].code, nodes["n3"].errb.String())
	}
	testutil.WaitFor(t, "member list to show n3 unreachable", 20*time.Second, func() bool {
		up := health()
		return up["n3"] == false && up["n1"] == true && up["n2"] == true
	})
	if err := os.RemoveAll(dataDir("n3")); err != nil {
		t.Fatal(err)
	}
	// Run before n3 listens again (the README's order run too early): it
	// waits up to --timeout for n3's peer, then fails with one line saying
	// that nothing was changed: n3 is still a voter.
	r := run(t, others, "member", "rebuild", "n3", peers["n3"], "--timeout", "2s")
	if r.code == 0 || !strings.Contains(r.stderr, "nothing was changed") || !strings.Contains(r.stderr, "--peer-listen "+peers["n3"]+" --join") {
		t.Fatalf("rebuild of a member that is down: exit %d, stderr %q", r.code, r.stderr)
	}
	if voters := memberVoters(t, others); len(voters) != 3 || !voters["n3"] {
		t.Fatalf("after the rebuild that found n3 down: voters %v, want n1, n2, n3 unchanged", voters)
	}
	// Run again, the rebuild waits for n3, which starts meanwhile.
	rebuilt := make(chan result, 1)
	go func() {
		rebuilt <- run(t, others, "member", "rebuild", "n3", peers["n3"], "--timeout", "25s", "-o", "json")
	}()
	testutil.WaitFor(t, "the leader to wait for n3", 20*time.Second, func() bool {
		waits := 0 // the refused rebuild logged one
		for _, id := range []string{"n1", "n2"} {
			waits += strings.Count(nodes[id].errb.String(), "waiting for a new member's peer to listen")
		}
		return waits >= 2
	})
	if voters := memberVoters(t, others); len(voters) != 3 {
		t.Fatalf("while the rebuild waits: voters %v, want n1, n2, n3 unchanged", voters)
	}
	n3addr := freeLoopback(t)
	n3 := startServe(t, "--node-id", "n3", "--listen", n3addr, "--peer-listen", peers["n3"], "--data-dir", dataDir("n3"), "--join")
	if r := <-rebuilt; r.code != 0 {
		t.Fatalf("rebuild that waited for n3: exit %d, stderr %q", r.code, r.stderr)
	}
	if got := n3.waitServing(t); got != n3addr {
		t.Fatalf("n3 serves on %s, want %s", got, n3addr)
	}
	if voters := memberVoters(t, others); len(voters) != 3 || !voters["n3"] {
		t.Fatalf("after the rebuild: voters %v", voters)
	}
	// A rebuild interrupted after it removed the old entry leaves the
	// member out (or a non-voter): run again, it adds the member back.
	runJSON(t, others, 0, "member", "remove", "n3", "--force")
	if voters := memberVoters(t, others); len(voters) != 2 {
		t.Fatalf("after removing n3: voters %v", voters)
	}

	for round := 1; round <= 2; round++ { // resumed, then on a healthy member
		m := runJSON(t, others, 0, "member", "rebuild", "n3", peers["n3"])
		voters := 0
		for _, x := range m["members"].([]any) {
			mem := x.(map[string]any)
			hasKeys(t, mem, map[string]string{"id": "string", "peer_addr": "string", "voter": "bool", "leader": "bool"})
			if mem["voter"] == true {
				voters++
			}
			if mem["id"] == "n3" && (mem["voter"] != true || mem["peer_addr"] != peers["n3"]) {
				t.Fatalf("round %d: n3 after the rebuild: %v", round, mem)
			}
		}
		if voters != 3 {
			t.Fatalf("round %d: %d voters after the rebuild: %v", round, voters, m)
		}
		want := fmt.Sprint("v", round+1)
		runJSON(t, others, 0, "kv", "put", "after", want)
		// n3's own state (a serializable read answers from it) holds what
		// was written before it lost its data and what came after.
		for key, val := range map[string]string{"before": "v1", "after": want} {
			testutil.WaitFor(t, "n3 to hold "+key, 30*time.Second, func() bool {
				r := run(t, n3addr, "kv", "get", key, "--consistency", "serializable", "-o", "json")
				return r.code == 0 && strings.Contains(r.stdout, fmt.Sprintf("%q", val))
			})
		}
	}
}

// TestServeJoinFlags: --join needs --peer-listen and excludes
// --bootstrap-peers, refused with one line before anything is opened.
func TestServeJoinFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--join"},
		{"--join", "--peer-listen", "127.0.0.1:1", "--bootstrap-peers", "n1=127.0.0.1:1"},
	} {
		dir := filepath.Join(t.TempDir(), "data")
		r := run(t, "127.0.0.1:1", append([]string{"serve", "--data-dir", dir, "--listen", "127.0.0.1:0", "--http-listen", ""}, args...)...)
		if r.code != 1 || r.stderr != "tenure: --join needs --peer-listen and no --bootstrap-peers\n" {
			t.Fatalf("serve %v: exit %d, stderr %q", args, r.code, r.stderr)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Fatalf("serve %v created its data dir (%v)", args, err)
		}
	}
}

// TestMemberAddAfterThePeerRestarted: the leader's pooled connection to
// a peer it reached before the peer restarted is stale; the next add must
// still reach the restarted peer. (A member added and removed again
// leaves such a connection behind.)
func TestMemberAddAfterThePeerRestarted(t *testing.T) {
	testutil.Slow(t)
	root := t.TempDir()
	ids := []string{"n1", "n2", "n3"}
	var boot []string
	peers := make(map[string]string)
	for _, id := range append(ids, "n4") {
		peers[id] = freeLoopback(t)
	}
	for _, id := range ids {
		boot = append(boot, id+"="+peers[id])
	}
	nodes := make([]*serving, 0, len(ids))
	for _, id := range ids {
		nodes = append(nodes, startServe(t, "--node-id", id, "--listen", "127.0.0.1:0", "--peer-listen", peers[id],
			"--data-dir", filepath.Join(root, id), "--bootstrap-peers", strings.Join(boot, ",")))
	}
	var eps []string
	for _, s := range nodes {
		eps = append(eps, s.waitServing(t))
	}
	cluster := strings.Join(eps, ",")
	join := func() *serving {
		addr := freeLoopback(t)
		s := startServe(t, "--node-id", "n4", "--listen", addr, "--peer-listen", peers["n4"], "--data-dir", filepath.Join(root, "n4"), "--join")
		testutil.WaitFor(t, "n4's waiting line", 30*time.Second, func() bool { return strings.Contains(s.errb.String(), "waits to be added") })
		// Bootstrapped, it would list itself as the one voter (and lead).
		testutil.WaitFor(t, "n4's client API", 10*time.Second, func() bool { return run(t, addr, "member", "list").code == 0 })
		if m := runJSON(t, addr, 0, "member", "list"); len(m["members"].([]any)) != 0 {
			t.Fatalf("n4 started with --join has a configuration of its own: %v", m)
		}
		if s.out.String() != "" {
			t.Fatalf("n4 says it serves before it was added: %q", s.out.String())
		}
		return s
	}
	n4 := join()
	if r := run(t, cluster, "member", "add", "n4", peers["n4"]); r.code != 1 || !strings.Contains(r.stderr, "--force") {
		t.Fatalf("add to an even count: exit %d, stderr %q", r.code, r.stderr)
	}
	runJSON(t, cluster, 0, "member", "add", "n4", peers["n4"], "--force")
	runJSON(t, cluster, 0, "member", "remove", "n4", "--force")
	n4.stop()
	<-n4.done
	if err := os.RemoveAll(filepath.Join(root, "n4")); err != nil {
		t.Fatal(err)
	}
	join()
	m := runJSON(t, cluster, 0, "member", "add", "n4", peers["n4"], "--force")
	if len(m["members"].([]any)) != 4 {
		t.Fatalf("members after the add: %v", m)
	}
}

// memberVoters lists the voters of `member list` at addr.
func memberVoters(t *testing.T, addr string) map[string]bool {
	t.Helper()
	out := make(map[string]bool)
	for _, x := range runJSON(t, addr, 0, "member", "list")["members"].([]any) {
		if m := x.(map[string]any); m["voter"] == true {
			out[m["id"].(string)] = true
		}
	}
	return out
}

// TestServeTimingFlags: --heartbeat-timeout, --election-timeout and
// --leader-lease-timeout that cannot work together are refused with one
// line naming the flags, before the data dir is created; timings with
// which the clients' default session TTL may not outlive an election
// start, with a warning that names the shortest TTL that does.
func TestServeTimingFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--leader-lease-timeout", "600ms"}, "tenure: --leader-lease-timeout 600ms must not exceed --heartbeat-timeout 500ms"},
		{[]string{"--heartbeat-timeout", "1s", "--election-timeout", "800ms"}, "tenure: --election-timeout 800ms must not be shorter than --heartbeat-timeout 1s\n"},
		{[]string{"--heartbeat-timeout", "1ms"}, "tenure: --heartbeat-timeout 1ms is outside 10ms..1m0s\n"},
	} {
		dir := filepath.Join(t.TempDir(), "data")
		r := run(t, "127.0.0.1:1", append([]string{"serve", "--data-dir", dir, "--listen", "127.0.0.1:0", "--http-listen", "", "--peer-listen", freeLoopback(t)}, tc.args...)...)
		if r.code != 1 || !strings.HasPrefix(r.stderr, tc.want) || strings.Count(r.stderr, "\n") != 1 {
			t.Fatalf("serve %v: exit %d, stderr %q, want %q", tc.args, r.code, r.stderr, tc.want)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Fatalf("serve %v created its data dir (%v)", tc.args, err)
		}
	}
	s := startServe(t, "--data-dir", filepath.Join(t.TempDir(), "data"), "--listen", "127.0.0.1:0", "--peer-listen", freeLoopback(t),
		"--heartbeat-timeout", "1s", "--election-timeout", "1s", "--leader-lease-timeout", "1s")
	s.waitServing(t)
	if log := s.errb.String(); !regexp.MustCompile(`level=WARN msg="sessions with a TTL shorter than min_surviving_ttl, the clients' default included, may be lost to their clients while a leader is elected" min_surviving_ttl=12s`).MatchString(log) {
		t.Fatalf("no warning of the TTLs an election may cost:\n%s", log)
	}
}
