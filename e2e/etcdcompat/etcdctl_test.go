package etcdcompat

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestEtcdctlKV(t *testing.T) {
	ep := startTenure(t).Etcd
	for _, kv := range [][2]string{{"fruit/apple", "3"}, {"fruit/pear", "1"}, {"fruit/fig", "2"}, {"veg/leek", "9"}} {
		if out := etcdctl(t, ep, "", "put", kv[0], kv[1]); strings.TrimSpace(out) != "OK" {
			t.Fatalf("put: %q", out)
		}
	}
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"get", "fruit/pear"}, []string{"fruit/pear", "1"}},
		{[]string{"get", "fruit/", "--prefix"}, []string{"fruit/apple", "3", "fruit/fig", "2", "fruit/pear", "1"}},
		{[]string{"get", "fruit/", "--prefix", "--keys-only"}, []string{"fruit/apple", "fruit/fig", "fruit/pear"}},
		{[]string{"get", "fruit/", "--prefix", "--limit", "2"}, []string{"fruit/apple", "3", "fruit/fig", "2"}},
		{[]string{"get", "fruit/", "--prefix", "--sort-by", "VALUE", "--order", "DESCEND", "--print-value-only"}, []string{"3", "2", "1"}},
		{[]string{"get", "fruit/", "--prefix", "--sort-by", "CREATE", "--order", "ASCEND", "--keys-only"}, []string{"fruit/apple", "fruit/pear", "fruit/fig"}},
		{[]string{"get", "fruit/pear", "--from-key", "--keys-only"}, []string{"fruit/pear", "veg/leek"}},
		{[]string{"get", "fruit/", "--prefix", "--count-only", "-w", "fields"}, nil},
		{[]string{"del", "fruit/", "--prefix"}, []string{"3"}},
		{[]string{"get", "", "--prefix", "--keys-only"}, []string{"veg/leek"}},
	}
	for _, c := range cases {
		out := etcdctl(t, ep, "", c.args...)
		if c.want == nil {
			if !strings.Contains(out, `"Count" : 3`) {
				t.Fatalf("%v: %s", c.args, out)
			}
			continue
		}
		if got := lines(out); strings.Join(got, "|") != strings.Join(c.want, "|") {
			t.Fatalf("etcdctl %v:\n got %q\nwant %q", c.args, got, c.want)
		}
	}
	// get -w json: etcd's header and key fields.
	var js struct {
		Header struct {
			ClusterID json.Number `json:"cluster_id"`
			MemberID  json.Number `json:"member_id"`
			Revision  json.Number `json:"revision"`
			RaftTerm  json.Number `json:"raft_term"`
		} `json:"header"`
		Kvs []struct {
			Key            string
			CreateRevision json.Number `json:"create_revision"`
			Version        json.Number `json:"version"`
		} `json:"kvs"`
		Count int `json:"count"`
	}
	if err := json.Unmarshal([]byte(etcdctl(t, ep, "", "get", "veg/leek", "-w", "json")), &js); err != nil {
		t.Fatal(err)
	}
	if js.Header.ClusterID == "" || js.Header.MemberID == "" || js.Header.RaftTerm == "" || js.Count != 1 || js.Kvs[0].Version != "1" || js.Kvs[0].CreateRevision == "" {
		t.Fatalf("json %+v", js)
	}
	// txn from stdin (etcdctl's interactive format): compares, a blank
	// line, the success ops, a blank line, the failure ops.
	txn := "create(\"lock\") = \"0\"\n\nput lock me\nget veg/leek\n\nget lock\n\n"
	if got := lines(etcdctl(t, ep, txn, "txn")); strings.Join(got, "|") != "SUCCESS|OK|veg/leek|9" {
		t.Fatalf("txn success: %q", got)
	}
	if got := lines(etcdctl(t, ep, txn, "txn")); strings.Join(got, "|") != "FAILURE|lock|me" {
		t.Fatalf("txn failure: %q", got)
	}
	txn = "value(\"lock\") = \"me\"\nversion(\"lock\") = \"1\"\n\nput lock you\n\n\n"
	if got := lines(etcdctl(t, ep, txn, "txn")); strings.Join(got, "|") != "SUCCESS|OK" {
		t.Fatalf("txn of two compares: %q", got)
	}
}

func TestEtcdctlWatch(t *testing.T) {
	ep := startTenure(t).Etcd
	w := etcdctlProc(t, ep, "", "watch", "w/", "--prefix", "--prev-kv")
	// The watch is created before the first put: the second put is seen
	// once the first one is.
	waitFor(t, 10*time.Second, "watch ready", func() bool {
		etcdctl(t, ep, "", "put", "w/probe", "x")
		return strings.Contains(w.stdout(), "w/probe")
	})
	etcdctl(t, ep, "", "put", "w/a", "1")
	etcdctl(t, ep, "", "put", "w/a", "2")
	etcdctl(t, ep, "", "del", "w/a")
	waitFor(t, 10*time.Second, "the watch's events", func() bool { return strings.Count(w.stdout(), "w/a") >= 5 })
	got := lines(w.stdout())
	want := "PUT|w/a|1|PUT|w/a|1|w/a|2|DELETE|w/a|2|w/a"
	if j := strings.Join(got, "|"); !strings.HasSuffix(j, want) {
		t.Fatalf("watch --prefix --prev-kv:\n%s\nwant the end %s", j, want)
	}
	// --rev replays from a revision.
	var g struct {
		Header struct{ Revision int64 } `json:"header"`
	}
	_ = json.Unmarshal([]byte(etcdctl(t, ep, "", "get", "w/a", "-w", "json")), &g)
	r := etcdctlProc(t, ep, "", "watch", "w/a", "--rev", strconv.FormatInt(g.Header.Revision-2, 10))
	waitFor(t, 10*time.Second, "the replay", func() bool { return strings.Count(r.stdout(), "w/a") >= 3 })
	if j := strings.Join(lines(r.stdout()), "|"); j != "PUT|w/a|1|PUT|w/a|2|DELETE|w/a" {
		t.Fatalf("watch --rev: %s", j)
	}
	// -i: commands on stdin (kept open: etcdctl ends at its end),
	// progress answered with the revision.
	out, errOut := "", ""
	i := startProc(t, "", "sh", "-c", fmt.Sprintf(`(echo "watch p"; sleep 0.5; echo progress; sleep 60) | %s --endpoints %s watch -i`, filepath.Join(bin, "etcdctl"), ep))
	waitFor(t, 10*time.Second, "progress", func() bool {
		out, errOut = i.stdout(), i.stderr()
		return strings.Contains(out, "progress notify:")
	})
	if !regexp.MustCompile(`progress notify: [0-9]+`).MatchString(out) {
		t.Fatalf("watch -i progress: %q %q", out, errOut)
	}
}

func TestEtcdctlLease(t *testing.T) {
	ep := startTenure(t).Etcd
	out := etcdctl(t, ep, "", "lease", "grant", "30")
	m := regexp.MustCompile(`lease ([0-9a-f]+) granted with TTL\(30s\)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("lease grant: %q", out)
	}
	id := m[1]
	etcdctl(t, ep, "", "put", "leased", "x", "--lease", id)
	if out := etcdctl(t, ep, "", "lease", "timetolive", id, "--keys"); !regexp.MustCompile(`granted with TTL\(30s\), remaining\((2[89]|30)s\), attached keys\(\[leased\]\)`).MatchString(out) {
		t.Fatalf("timetolive --keys: %q", out)
	}
	if out := etcdctl(t, ep, "", "lease", "keep-alive", "--once", id); !strings.Contains(out, "keepalived with TTL(30)") {
		t.Fatalf("keep-alive --once: %q", out)
	}
	ka := etcdctlProc(t, ep, "", "lease", "keep-alive", id)
	waitFor(t, 10*time.Second, "keep-alive stream", func() bool { return strings.Contains(ka.stdout(), "keepalived with TTL(30)") })
	if out := etcdctl(t, ep, "", "lease", "list"); !strings.Contains(out, "found 1 leases") || !strings.Contains(out, id) {
		t.Fatalf("lease list: %q", out)
	}
	if out := etcdctl(t, ep, "", "lease", "revoke", id); !strings.Contains(out, "revoked") {
		t.Fatalf("revoke: %q", out)
	}
	if out := etcdctl(t, ep, "", "get", "leased"); out != "" {
		t.Fatalf("the revoked lease's key: %q", out)
	}
	// The keep-alive stream learns the lease is gone (TTL 0) at its next
	// keepalive, a third of the TTL (10 s) after the last one, and ends.
	if st := ka.wait(t, 30*time.Second); st == 0 && !strings.Contains(ka.stdout(), "expired or revoked") {
		t.Fatalf("keep-alive of a revoked lease: %d %q", st, ka.stdout())
	}
	if out := etcdctl(t, ep, "", "lease", "timetolive", id); !strings.Contains(out, "already expired") {
		t.Fatalf("timetolive of a revoked lease: %q", out)
	}
}

func TestEtcdctlEndpointAndMembers(t *testing.T) {
	ep := startTenure(t).Etcd
	out := etcdctl(t, ep, "", "endpoint", "status", "-w", "table")
	if !strings.Contains(out, ep) || !regexp.MustCompile(`\| +3\.[0-9]+\.[0-9]+ \|`).MatchString(strings.ReplaceAll(out, "│", "|")) || !strings.Contains(out, "true") {
		t.Fatalf("endpoint status:\n%s", out)
	}
	var st []struct {
		Status struct {
			DbSize int64 `json:"dbSize"`
			Leader uint64
			Header struct {
				MemberID uint64 `json:"member_id"`
			} `json:"header"`
		}
	}
	if err := json.Unmarshal([]byte(etcdctl(t, ep, "", "endpoint", "status", "-w", "json")), &st); err != nil || len(st) != 1 {
		t.Fatalf("status json: %v", err)
	}
	if st[0].Status.DbSize <= 0 || st[0].Status.Leader == 0 || st[0].Status.Leader != st[0].Status.Header.MemberID {
		t.Fatalf("status %+v", st[0])
	}
	if out := etcdctl(t, ep, "", "endpoint", "health"); !strings.Contains(out, "is healthy") {
		t.Fatalf("endpoint health: %q", out)
	}
	out = etcdctl(t, ep, "", "member", "list")
	if !strings.Contains(out, "started, n1,") || !strings.Contains(out, "http://"+ep) {
		t.Fatalf("member list: %q", out)
	}
}

// TestEtcdctlLock: eight etcdctl lock processes queue on one lock; each
// holds it in turn, never two at once, in the order they queued (etcd's
// Mutex is FIFO by create revision). Then a holder killed with SIGKILL
// loses the lock once its lease's TTL has run out.
func TestEtcdctlLock(t *testing.T) {
	ep := startTenure(t).Etcd
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	// The first holder keeps the lock until a file appears, so that all
	// eight queue behind it.
	gate := filepath.Join(dir, "gate")
	script := func(i int) string {
		return fmt.Sprintf(`echo "start %d $ETCD_LOCK_REV" >> %s; while [ ! -e %s ]; do sleep 0.05; done; sleep 0.05; echo "end %d" >> %s`, i, log, gate, i, log)
	}
	var procs []*proc
	for i := range 8 {
		procs = append(procs, etcdctlProc(t, ep, "", "lock", "--ttl", "10", "jobs", "--", "sh", "-c", script(i)))
		// Queued (its key exists) before the next starts: FIFO order is
		// the order of the keys' create revisions.
		waitFor(t, 10*time.Second, fmt.Sprintf("waiter %d queued", i), func() bool {
			return len(lines(etcdctl(t, ep, "", "get", "jobs/", "--prefix", "--keys-only"))) == i+1
		})
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		if st := p.wait(t, 60*time.Second); st != 0 {
			t.Fatalf("etcdctl lock exited %d: %s", st, p.stderr())
		}
	}
	b, _ := os.ReadFile(log)
	got := lines(string(b))
	if len(got) != 16 {
		t.Fatalf("log %q", got)
	}
	lastRev := 0
	for i := range 8 {
		start, end := strings.Fields(got[2*i]), got[2*i+1]
		if start[0] != "start" || start[1] != strconv.Itoa(i) || end != fmt.Sprintf("end %d", i) {
			t.Fatalf("holders overlapped or out of order at %d: %q", i, got)
		}
		rev, _ := strconv.Atoi(start[2])
		if rev <= lastRev {
			t.Fatalf("ETCD_LOCK_REV %d after %d: fences must grow", rev, lastRev)
		}
		lastRev = rev
	}

	// SIGKILL the holder: its lease (TTL 3s) is no longer kept alive, so
	// the waiter holds within about the TTL.
	holder := etcdctlProc(t, ep, "", "lock", "--ttl", "3", "crash", "--", "sh", "-c", "echo held; sleep 1000")
	waitFor(t, 10*time.Second, "the holder holds", func() bool { return strings.Contains(holder.stdout(), "held") })
	waiter := etcdctlProc(t, ep, "", "lock", "--ttl", "3", "crash", "--", "echo", "next")
	waitFor(t, 10*time.Second, "the waiter queued", func() bool {
		return len(lines(etcdctl(t, ep, "", "get", "crash/", "--prefix", "--keys-only"))) == 2
	})
	killed := time.Now()
	if err := syscall.Kill(-holder.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if st := waiter.wait(t, 15*time.Second); st != 0 || !strings.Contains(waiter.stdout(), "next") {
		t.Fatalf("waiter: %d %q %q", st, waiter.stdout(), waiter.stderr())
	}
	// The lease is 3 s; the server adds nothing but its own check
	// interval, and the client may have kept it alive just before.
	if took := time.Since(killed); took > 3*time.Second+2*time.Second {
		t.Fatalf("the waiter held %v after the holder was killed (TTL 3s)", took)
	}
}

// TestEtcdctlElect: an observer (elect -l) sees the first candidate win,
// and the second once the first is gone.
func TestEtcdctlElect(t *testing.T) {
	ep := startTenure(t).Etcd
	obs := etcdctlProc(t, ep, "", "elect", "-l", "office")
	first := etcdctlProc(t, ep, "", "elect", "office", "alice")
	waitFor(t, 10*time.Second, "alice leads", func() bool { return strings.Contains(first.stdout(), "alice") })
	second := etcdctlProc(t, ep, "", "elect", "office", "bob")
	waitFor(t, 10*time.Second, "bob campaigns", func() bool {
		return len(lines(etcdctl(t, ep, "", "get", "office/", "--prefix", "--keys-only"))) == 2
	})
	waitFor(t, 10*time.Second, "the observer sees alice", func() bool { return strings.Contains(obs.stdout(), "alice") })
	// SIGINT: etcdctl resigns and revokes its lease.
	if err := syscall.Kill(first.cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "bob leads", func() bool { return strings.Contains(second.stdout(), "bob") })
	waitFor(t, 10*time.Second, "the observer sees bob", func() bool { return strings.Contains(obs.stdout(), "bob") })
	o := lines(obs.stdout())
	if o[len(o)-1] != "bob" {
		t.Fatalf("observer: %q", o)
	}
}
