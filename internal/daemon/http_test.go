package daemon_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	etcdpb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/metrics"
	"github.com/tenure-io/tenure/internal/testutil"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// scrape reads /metrics into metric families by name.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := get(t, "http://"+addr+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return fams
}

// value is the value of name's series with the given labels (name=value
// pairs); -1 if there is none.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
	for _, m := range f.GetMetric() {
		ok := true
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
					found = true
				}
			}
			ok = ok && found
		}
		if !ok {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	return -1
}

// TestMetricsFollowTheWork: after locks of every kind, a hand-off,
// fenced writes of each outcome and a dead-lettered queue item, /metrics
// exposes exactly the documented names (and the Go runtime's and the
// process's), with values that count that work.
func TestMetricsFollowTheWork(t *testing.T) {
	srv := testutil.StartConfig(t, daemon.Config{HTTPListen: "127.0.0.1:0"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	a := testutil.Session(t, ctx, c, client.WithOwner("a"))
	b := testutil.Session(t, ctx, c, client.WithOwner("b"))

	ma, _ := a.Mutex("m")
	ha, err := ma.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := b.Mutex("m")
	queued := make(chan struct{})
	got := make(chan *client.Hold, 1)
	go func() {
		h, err := mb.Lock(ctx, client.OnQueued(func(int) { close(queued) }))
		if err != nil {
			t.Error(err)
		}
		got <- h
	}()
	<-queued
	fams := scrape(t, srv.HTTPAddr())
	if v := value(fams, "tenure_lock_waiters"); v != 1 {
		t.Fatalf("tenure_lock_waiters %v, want 1", v)
	}
	if err := ha.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	hb := <-got
	sem, _ := a.Semaphore("s", 3)
	if _, err := sem.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	rw, _ := a.Mutex("rw")
	if _, err := rw.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	if r, err := c.FencedPut(ctx, "k", []byte("v"), hb.Token(), ""); err != nil || !r.Accepted {
		t.Fatalf("fenced put: %+v %v", r, err)
	}
	if _, err := c.FencedPut(ctx, "k", []byte("v"), ha.Token(), ""); err == nil {
		t.Fatal("a stale put was accepted")
	}
	q := c.Queue("jobs")
	if _, err := q.Enqueue(ctx, []byte("x"), client.WithMaxAttempts(2)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		d, err := q.Dequeue(ctx, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := q.Nack(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := q.Enqueue(ctx, []byte("y")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "key", []byte("v")); err != nil {
		t.Fatal(err)
	}

	fams = scrape(t, srv.HTTPAddr())
	var names []string
	for name := range fams {
		if strings.HasPrefix(name, "tenure_") {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	// Only a follower forwards requests (internal/server's forwarding
	// test counts them): a single node exports no series of it.
	want := slices.DeleteFunc(metrics.Names(), func(n string) bool { return n == "tenure_forwarded_requests_total" })
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("metric names\n got %v\nwant %v", names, want)
	}
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total"} {
		if fams[name] == nil {
			t.Errorf("%s is not exposed", name)
		}
	}
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"tenure_lock_grants_total", nil, 4}, // a, b (hand-off), the semaphore, the reader
		{"tenure_lock_handoffs_total", nil, 1},
		{"tenure_locks_held", nil, 3},
		{"tenure_lock_waiters", nil, 0},
		{"tenure_lock_delays_active", nil, 0},
		{"tenure_lock_acquire_wait_seconds", []string{"kind", "mutex"}, 2},
		{"tenure_lock_acquire_wait_seconds", []string{"kind", "semaphore"}, 1},
		{"tenure_lock_acquire_wait_seconds", []string{"kind", "rwlock"}, 1},
		{"tenure_sessions", nil, 2},
		{"tenure_fence_writes_total", []string{"result", "accepted"}, 1},
		{"tenure_fence_writes_total", []string{"result", "stale"}, 1},
		{"tenure_fence_writes_total", []string{"result", "duplicate"}, 0},
		{"tenure_queue_items", []string{"queue", "jobs", "state", "dead"}, 1},
		{"tenure_queue_items", []string{"queue", "jobs", "state", "ready"}, 1},
		{"tenure_queue_items", []string{"queue", "jobs", "state", "inflight"}, 0},
		{"tenure_queue_redeliveries_total", nil, 1},
		{"tenure_queue_dead_lettered_total", nil, 1},
		{"tenure_kv_keys", nil, 1},
		{"tenure_watchers", nil, 0},
		{"tenure_raft_is_leader", nil, 1},
		{"tenure_leader_changes_total", nil, 1},
		{"tenure_rpc_requests_total", []string{"method", "FencedPut", "code", "OK"}, 2},
		{"tenure_rpc_duration_seconds", []string{"method", "FencedPut"}, 2},
	} {
		if got := value(fams, tc.name, tc.labels...); got != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	for _, name := range []string{"tenure_log_append_seconds", "tenure_apply_batch_commands", "tenure_raft_term", "tenure_raft_commit_index", "tenure_raft_applied_index", "tenure_queue_oldest_ready_age_seconds"} {
		if v := value(fams, name); v <= 0 {
			t.Errorf("%s = %v, want > 0", name, v)
		}
	}
	// The two gauges are read one after the other, and the leader's own
	// proposals (its timers) may commit an entry between them: the applied
	// index reaches the commit index on a later scrape.
	testutil.WaitFor(t, "the applied index to reach the commit index", 10*time.Second, func() bool {
		fams := scrape(t, srv.HTTPAddr())
		return value(fams, "tenure_raft_applied_index") >= value(fams, "tenure_raft_commit_index")
	})
}

// TestHealthAndReadiness: /healthz answers while the process is up;
// /readyz only once the node knows a leader, has applied what is
// committed and can write to its storage; /debug/pprof/ only with Pprof.
func TestHealthAndReadiness(t *testing.T) {
	srv := testutil.StartConfig(t, daemon.Config{HTTPListen: "127.0.0.1:0", Pprof: true})
	for path, want := range map[string]string{"/healthz": "ok\n", "/readyz": "ready\n"} {
		if code, body := get(t, "http://"+srv.HTTPAddr()+path); code != http.StatusOK || body != want {
			t.Errorf("%s: %d %q, want 200 %q", path, code, body, want)
		}
	}
	if code, _ := get(t, "http://"+srv.HTTPAddr()+"/debug/pprof/"); code != http.StatusOK {
		t.Errorf("/debug/pprof/ with Pprof: %d", code)
	}
	plain := testutil.StartConfig(t, daemon.Config{HTTPListen: "127.0.0.1:0"})
	if code, _ := get(t, "http://"+plain.HTTPAddr()+"/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("/debug/pprof/ without Pprof: %d, want 404", code)
	}

	// A member of a two-voter cluster whose peer never comes: up, not ready.
	peer := freeAddr(t)
	d, err := daemon.Start(daemon.Config{NodeID: "n1", DataDir: t.TempDir(), Listen: "127.0.0.1:0", HTTPListen: "127.0.0.1:0",
		PeerListen: peer, BootstrapPeers: map[string]string{"n1": peer, "n2": freeAddr(t)}, LogOutput: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if code, _ := get(t, "http://"+d.HTTPAddr()+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz without a leader: %d", code)
	}
	if code, body := get(t, "http://"+d.HTTPAddr()+"/readyz"); code != http.StatusServiceUnavailable || body != "not ready: no leader\n" {
		t.Errorf("/readyz without a leader: %d %q", code, body)
	}
}

// freeAddr is a loopback address nobody listens on (yet).
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return fmt.Sprint(l.Addr())
}

// TestEtcdRequestsAreCounted: the etcd API's requests are in the same
// metrics as Tenure's own, by method and code.
func TestEtcdRequestsAreCounted(t *testing.T) {
	srv := testutil.StartConfig(t, daemon.Config{HTTPListen: "127.0.0.1:0", EtcdListen: "127.0.0.1:0"})
	conn, err := grpc.NewClient(srv.EtcdAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv := etcdpb.NewKVClient(conn)
	for i := 0; i < 3; i++ {
		if _, err := kv.Put(ctx, &etcdpb.PutRequest{Key: []byte("k"), Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kv.Range(ctx, &etcdpb.RangeRequest{Key: nil}); err == nil {
		t.Fatal("a range without a key was answered")
	}
	fams := scrape(t, srv.HTTPAddr())
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"tenure_rpc_requests_total", []string{"method", "etcd.KV/Put", "code", "OK"}, 3},
		{"tenure_rpc_duration_seconds", []string{"method", "etcd.KV/Put"}, 3},
		{"tenure_rpc_requests_total", []string{"method", "etcd.KV/Range", "code", "InvalidArgument"}, 1},
	} {
		if got := value(fams, tc.name, tc.labels...); got != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
}
