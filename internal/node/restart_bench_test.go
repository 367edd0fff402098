package node_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/node"
)

// envInt is the integer environment variable name, or def.
func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		b.Fatalf("%s=%q", name, v)
	}
	return n
}

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

// logged returns the attributes of the JSON log records with message msg.
func (s *syncBuffer) logged(msg string) []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(s.buf.Bytes()))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// running is a node with its Run loop.
type running struct {
	n    *node.Node
	stop func()
}

func start(b *testing.B, cfg node.Config) running {
	b.Helper()
	n, err := node.Open(cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(ctx); close(done) }()
	return running{n, func() { cancel(); <-done; n.Close() }}
}

func waitReady(b *testing.B, n *node.Node) {
	b.Helper()
	select {
	case <-n.Ready():
	case <-time.After(10 * time.Minute):
		b.Fatal("not ready after 10 minutes")
	}
}

// enqueueBatches proposes count batch enqueues of per items of 100 bytes
// to queue "q", a few at a time so that the node commits several per
// log entry.
func enqueueBatches(b *testing.B, n *node.Node, count, per int) {
	b.Helper()
	payload := make([]byte, 100)
	c := &fsmpb.QueueEnqueueBatch{Queue: "q"}
	for range per {
		c.Items = fsm.AppendBatchItem(c.Items, payload, "")
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	for range 4 {
		wg.Go(func() {
			for next.Add(1) <= int64(count) {
				cmd := &fsmpb.Command{Op: &fsmpb.Command_QueueEnqueueBatch{QueueEnqueueBatch: c}}
				if _, err := n.Propose(context.Background(), cmd); err != nil {
					failed.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkRestartQueue measures a restart of a single node whose queue
// "q" stores TENURE_BENCH_ITEMS items of 100 bytes (default 1,000,000),
// from opening the data directory to the first answered linearizable read
// of the queue. The layouts:
//
//   - snapshot: every item in the newest snapshot, no log after it;
//   - snapshot+tail: the newest snapshot and, after it, a log tail of
//     TENURE_BENCH_TAIL entries (default 16,384: the snapshot threshold;
//     with 100 items of 100 bytes each they stay below the 256 MiB of
//     Config.SnapshotBytes, so this is the longest tail the defaults
//     leave), each a batch of 100 enqueues, whose items count among the
//     stored ones;
//   - log: no snapshot, every item in the log (batches of 1,000): what
//     the defaults allowed before snapshots by log size (a log the
//     defaults no longer leave behind).
//
// Metrics: open-s (node.Open: the data directory's checks and the
// snapshot's restore, split in snapshot-check-s, log-check-s and
// snapshot-restore-s from the node's log), ready-s (until Ready: the
// log's replay and the election), first-read-s (until the read answered),
// all from the start. TENURE_BENCH_PROFILE=PATH writes a CPU profile of
// each restart to PATH.LAYOUT.
//
//	go test -run '^$' -bench BenchmarkRestartQueue -benchtime 1x -timeout 60m ./internal/node/
//	TENURE_BENCH_ITEMS=10000000 go test -run '^$' -bench BenchmarkRestartQueue -benchtime 1x -timeout 60m ./internal/node/
func BenchmarkRestartQueue(b *testing.B) {
	items := envInt(b, "TENURE_BENCH_ITEMS", 1_000_000)
	tail := envInt(b, "TENURE_BENCH_TAIL", 16_384)
	for _, layout := range []string{"snapshot", "snapshot+tail", "log"} {
		b.Run(layout, func(b *testing.B) {
			dir := b.TempDir()
			// Built with no snapshot but the one asked for below; restarted
			// with the defaults.
			cfg := node.Config{DataDir: dir, LogOutput: io.Discard, SnapshotThreshold: 1 << 40, SnapshotBytes: -1, Limits: fsm.Limits{MaxQueueLength: uint64(items) + 1}}
			r := start(b, cfg)
			waitReady(b, r.n)
			inTail := 0
			if layout == "snapshot+tail" {
				inTail = min(tail*100, items)
			}
			before := items - inTail
			enqueueBatches(b, r.n, before/1000, 1000)
			enqueueBatches(b, r.n, before%1000, 1)
			if layout != "log" {
				if err := r.n.Snapshot(); err != nil {
					b.Fatal(err)
				}
			}
			enqueueBatches(b, r.n, inTail/100, 100)
			enqueueBatches(b, r.n, inTail%100, 1)
			r.stop()
			cfg.SnapshotThreshold, cfg.SnapshotBytes = 0, 0
			var open, ready, read, snapCheck, logCheck, restore time.Duration
			b.ResetTimer()
			for range b.N {
				logs := &syncBuffer{}
				cfg.Logger = slog.New(slog.NewJSONHandler(logs, nil))
				if path := os.Getenv("TENURE_BENCH_PROFILE"); path != "" {
					f, err := os.Create(path + "." + strings.ReplaceAll(layout, "+", "-"))
					if err != nil {
						b.Fatal(err)
					}
					if err := pprof.StartCPUProfile(f); err != nil {
						b.Fatal(err)
					}
				}
				t0 := time.Now()
				r := start(b, cfg)
				t1 := time.Now()
				waitReady(b, r.n)
				t2 := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				if err := r.n.LinearizableRead(ctx); err != nil {
					b.Fatal(err)
				}
				cancel()
				var got int
				r.n.Read(func(s *fsm.State) { got = s.QueueLen("q") })
				t3 := time.Now()
				if got != items {
					b.Fatalf("%d items after the restart, want %d", got, items)
				}
				b.StopTimer()
				pprof.StopCPUProfile()
				r.stop()
				open, ready, read = open+t1.Sub(t0), ready+t2.Sub(t0), read+t3.Sub(t0)
				for _, m := range logs.logged("data directory opened") {
					ms := func(k string) time.Duration { f, _ := m[k].(float64); return time.Duration(f) * time.Millisecond }
					snapCheck, logCheck, restore = snapCheck+ms("snapshot_check_ms"), logCheck+ms("log_check_ms"), restore+ms("snapshot_restore_ms")
				}
				b.StartTimer()
			}
			per := func(d time.Duration) float64 { return d.Seconds() / float64(b.N) }
			b.ReportMetric(per(open), "open-s")
			b.ReportMetric(per(snapCheck), "snapshot-check-s")
			b.ReportMetric(per(logCheck), "log-check-s")
			b.ReportMetric(per(restore), "snapshot-restore-s")
			b.ReportMetric(per(ready), "ready-s")
			b.ReportMetric(per(read), "first-read-s")
		})
	}
}
