//go:build linux || darwin

package nemesis

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/testutil"
)

// TestNemesis runs the fenced-register and queue workloads on a 3-node
// cluster while the nemesis pauses lock holders, kills and restarts nodes,
// restarts the whole cluster and partitions the network; then it checks
// the histories.
// -duration sets how long (default 30s).
func TestNemesis(t *testing.T) {
	res := runSuite(t, suiteConfig{
		keys: 3, goPerKey: 2, readersPerKey: 1, procPerKey: 1,
		queue:       true,
		hostile:     true,
		duration:    *flagDuration,
		schedule:    fullSchedule,
		maxFaults:   max(1, int(*flagDuration/time.Second)),
		historyPath: *flagHistory,
		seed:        *flagSeed,
	})
	for _, a := range res.report.anomalies {
		t.Errorf("anomaly [%s] %s", a.Check, a.Msg)
	}
	if res.accepted == 0 {
		t.Errorf("no write was accepted: the workload did not run")
	}
	if len(res.faults) == 0 {
		t.Errorf("no fault was injected")
	}
}

// TestNemesisRealFaults runs the same workloads through the faults a
// server meets outside the network, each at least once: its process
// frozen (leader and follower, shorter than the election timeout and
// longer), its clients' connections gone silent, its disk full, its log
// corrupted (it must refuse to start, and is rebuilt from its peers).
func TestNemesisRealFaults(t *testing.T) {
	schedule := realSchedule
	if *flagFaults != "" {
		schedule = strings.Split(*flagFaults, ",")
		for _, k := range schedule {
			if !slices.Contains(realSchedule, k) {
				t.Fatalf("-faults: %q is not one of TestNemesisRealFaults's faults %v", k, realSchedule)
			}
		}
	}
	res := runSuite(t, suiteConfig{
		keys: 3, goPerKey: 2, readersPerKey: 1, procPerKey: 1,
		queue:     true,
		hostile:   true,
		duration:  realDuration,
		schedule:  schedule,
		maxFaults: len(schedule),
		stopEarly: true,
		seed:      *flagSeed,
	})
	for _, a := range res.report.anomalies {
		t.Errorf("anomaly [%s] %s", a.Check, a.Msg)
	}
	if res.accepted == 0 {
		t.Errorf("no write was accepted: the workload did not run")
	}
	injected := make(map[string]bool)
	for _, f := range res.faults {
		injected[f.Kind] = true
	}
	for _, kind := range schedule {
		if !injected[kind] && (kind != faultDiskFull || res.disks) {
			t.Errorf("no %s fault was injected", kind)
		}
	}
}

// realDuration is how long TestNemesisRealFaults may run its faults.
const realDuration = 40 * time.Second

// TestNemesisCatchesBrokenFencing proves the checker can fail: against a
// cluster whose registers accept every token, a holder frozen past its TTL
// writes late with its old token after a newer holder wrote, the write is
// accepted, and the checker must report it.
func TestNemesisCatchesBrokenFencing(t *testing.T) {
	res := runSuite(t, suiteConfig{
		keys: 1, goPerKey: 2, readersPerKey: 1, procPerKey: 1,
		duration:  12 * time.Second,
		schedule:  []string{faultPause},
		maxFaults: 3,
		broken:    true,
		stopEarly: true,
	})
	got := res.report.byCheck()
	if got[checkRegisterOrder] == 0 || got[checkLinearizable] == 0 {
		t.Errorf("with the fence check disabled the checker reported %v; want stale writes accepted (%s) and a non-linearizable history (%s)",
			got, checkRegisterOrder, checkLinearizable)
	}
	for _, a := range res.report.anomalies {
		t.Logf("caught as expected: [%s] %s", a.Check, a.Msg)
	}
}

// suiteConfig describes one run.
type suiteConfig struct {
	keys     int // registers, each guarded by its own lock
	goPerKey int // in-process clients per register
	// readersPerKey: in-process clients per register that only read,
	// without the lock.
	readersPerKey int
	procPerKey    int // `tenure lock` process clients per register
	// queue adds the queue workload (2 producers, 2 consumers, 1 hostile
	// client).
	queue bool
	// hostile adds the hostile client (hostile_test.go).
	hostile   bool
	duration  time.Duration
	schedule  []string
	maxFaults int
	broken    bool // --unsafe-skip-fence-check
	// stopEarly ends the workload shortly after the nemesis is done
	// instead of at the end of duration.
	stopEarly   bool
	historyPath string // "" for history.jsonl in a new temp dir
	seed        uint64 // 0 for one from the clock
}

// suiteResult is what a run found.
type suiteResult struct {
	report   report
	ops      []Op
	faults   []Fault
	accepted int
	disks    bool // the nodes had file systems of their own (disk-full could run)
}

// Workload parameters.
const (
	goTTL            = 2 * time.Second
	porcupineTimeout = 30 * time.Second
)

func runSuite(t *testing.T, cfg suiteConfig) suiteResult {
	began := time.Now()
	seed := cfg.seed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	histPath := cfg.historyPath
	if histPath == "" {
		dir, err := os.MkdirTemp("", "tenure-nemesis-")
		if err != nil {
			t.Fatal(err)
		}
		histPath = filepath.Join(dir, "history.jsonl")
	}

	c := startCluster(t, clusterConfig{n: 3, broken: cfg.broken, disks: slices.Contains(cfg.schedule, faultDiskFull)})
	if !c.disks {
		cfg.schedule = slices.DeleteFunc(slices.Clone(cfg.schedule), func(k string) bool { return k == faultDiskFull })
	}
	startup := time.Since(began)
	rec := newRecorder()
	workDir := t.TempDir()

	var keys []string
	var procs []*procWorker
	var wg sync.WaitGroup
	wctx, stopWork := context.WithCancel(context.Background())
	defer stopWork()
	t.Cleanup(func() {
		// Only after a failure are `tenure lock` processes still running.
		for _, w := range procs {
			if p := w.running(); p != nil {
				p.stop(5 * time.Second)
			}
		}
	})
	for k := 0; k < cfg.keys; k++ {
		lock, key := fmt.Sprintf("nemesis-lock-%d", k), fmt.Sprintf("nemesis-reg-%d", k)
		keys = append(keys, key)
		for g := 0; g < cfg.goPerKey; g++ {
			w := &goWorker{id: fmt.Sprintf("g%d.%d", k, g), lock: lock, key: key, eps: c.eps, ttl: goTTL, rec: rec,
				rnd: rand.New(rand.NewPCG(seed, uint64(100*k+g)))}
			wg.Go(func() { w.run(wctx) })
		}
		for r := 0; r < cfg.readersPerKey; r++ {
			rd := &reader{id: fmt.Sprintf("r%d.%d", k, r), key: key, eps: c.eps, rec: rec, rnd: rand.New(rand.NewPCG(seed, uint64(100*k+50+r)))}
			wg.Go(func() { rd.run(wctx) })
		}
		for p := 0; p < cfg.procPerKey; p++ {
			id := fmt.Sprintf("p%d.%d", k, p)
			w := newProcWorker(id, lock, key, c.eps, filepath.Join(workDir, id), rec)
			if err := os.MkdirAll(w.dir, 0o755); err != nil {
				t.Fatal(err)
			}
			procs = append(procs, w)
			wg.Go(func() { w.run(wctx) })
		}
	}
	var qw *queueWorkload
	if cfg.queue {
		qw = newQueueWorkload(c.eps)
		for i := 0; i < 2; i++ {
			prnd, crnd := rand.New(rand.NewPCG(seed, uint64(900+i))), rand.New(rand.NewPCG(seed, uint64(950+i)))
			wg.Go(func() { qw.produce(wctx, fmt.Sprintf("q%d", i), prnd) })
			wg.Go(func() { qw.consume(wctx, crnd) })
		}
		hrnd := rand.New(rand.NewPCG(seed, 990))
		wg.Go(func() { qw.steal(wctx, hrnd) })
	}
	var hc *hostileClient
	if cfg.hostile {
		hc = newHostileClient(c.eps, keys, "nemesis-lock-0")
		hrnd := rand.New(rand.NewPCG(seed, 995))
		wg.Go(func() { hc.run(wctx, hrnd) })
	}
	workStart := time.Now()
	workEnd := workStart.Add(cfg.duration)

	// Warm up: wait until every register has taken a write.
	if err := testutil.PollUntil(30*time.Second, func() (bool, error) {
		ops, _ := rec.snapshot()
		seen := make(map[string]bool)
		for _, o := range ops {
			if o.Kind == kindPut && o.Outcome == outAccepted {
				seen[o.Key] = true
			}
		}
		return len(seen) == len(keys), nil
	}); err != nil {
		t.Errorf("workload did not start: no accepted write on every register: %v", err)
	}

	// Faults, until 3s before the end (a fault in progress then finishes).
	nm := &nemesis{c: c, rec: rec, procs: procs, rnd: rand.New(rand.NewPCG(seed, 1<<32)), logf: t.Logf}
	nctx, cancel := context.WithDeadline(context.Background(), workEnd.Add(-3*time.Second))
	if err := nm.run(nctx, cfg.schedule, cfg.maxFaults); err != nil {
		t.Errorf("nemesis: %v", err)
	}
	cancel()

	// The rest of the run is fault-free: until the end of the duration,
	// and at least until a few locks were requested and granted after
	// the last fault healed, so that the token checks across it have
	// something to check.
	_, faults := rec.snapshot()
	var healed int64
	for _, f := range faults {
		healed = max(healed, f.End)
	}
	if err := testutil.PollUntil(30*time.Second, func() (bool, error) {
		ops, _ := rec.snapshot()
		n := 0
		for _, o := range ops {
			if o.Kind == kindAcquire && o.Outcome == outOK && o.Invoke > healed {
				n++
			}
		}
		return n >= 3, nil
	}); err != nil {
		t.Errorf("no grants after the last fault: %v", err)
	}
	if !cfg.stopEarly {
		pace(context.Background(), time.Until(workEnd))
	}
	stopWork()
	stopped := make(chan struct{})
	go func() { wg.Wait(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(90 * time.Second):
		t.Fatalf("workers did not stop within 90s")
	}
	workTime := time.Since(workStart)

	// Heal everything, then read every register once more.
	c.heal()
	var dead []*node
	for _, nd := range c.nodes {
		if !c.alive(nd) {
			dead = append(dead, nd)
		}
	}
	if err := c.startAll(dead); err != nil {
		t.Error(err)
	}
	if err := c.waitHealthy(recoverLimit); err != nil {
		t.Errorf("cluster not serving after the run: %v", err)
	}
	for _, key := range keys {
		inv := rec.now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		reg, err := c.admin.FencedGet(ctx, key)
		cancel()
		op := Op{Client: "final", Kind: kindFinalGet, Key: key, Invoke: inv, Complete: rec.now(), Outcome: outOK}
		if err != nil {
			op.Outcome, op.Err = outFail, err.Error()
		} else {
			op.Value, op.Token, op.Found, op.Revision = string(reg.Value), reg.Token, reg.Found, reg.ModRevision
		}
		rec.add(op)
	}

	if qw != nil {
		dctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if err := qw.drain(dctx, c.admin); err != nil {
			t.Errorf("draining the queue: %v", err)
		}
		cancel()
	}

	ops, faults := rec.snapshot()
	if err := writeHistory(histPath, ops, faults); err != nil {
		t.Errorf("writing the history: %v", err)
	}
	checkStart := time.Now()
	rep := check(ops, faults, keys, filepath.Dir(histPath), porcupineTimeout)
	if qw != nil {
		qw.check(&rep)
	}
	if hc != nil {
		hc.check(&rep)
	}
	res := suiteResult{report: rep, ops: ops, faults: faults, disks: c.disks}
	for _, o := range ops {
		if o.Kind == kindPut && o.Outcome == outAccepted {
			res.accepted++
		}
	}
	t.Logf("\n%s", summary(cfg, seed, ops, faults, rep, histPath, map[string]time.Duration{
		"startup": startup, "workload": workTime, "check": time.Since(checkStart), "total": time.Since(began),
	}))
	return res
}

// summary renders what a run did and found.
func summary(cfg suiteConfig, seed uint64, ops []Op, faults []Fault, rep report, histPath string, times map[string]time.Duration) string {
	var b strings.Builder
	variant := "fenced registers"
	if cfg.broken {
		variant = "BROKEN registers (--unsafe-skip-fence-check)"
	}
	fmt.Fprintf(&b, "nemesis summary: 3 nodes, %s, %d registers; clients: %d in-process lock holders, %d `tenure lock` processes, %d lock-free readers; seed %d\n",
		variant, cfg.keys, cfg.keys*cfg.goPerKey, cfg.keys*cfg.procPerKey, cfg.keys*cfg.readersPerKey, seed)
	fmt.Fprintf(&b, "time: startup %v, workload %v, checks %v, total %v\n", times["startup"].Round(time.Millisecond),
		times["workload"].Round(time.Millisecond), times["check"].Round(time.Millisecond), times["total"].Round(time.Millisecond))

	counts := make(map[string]map[string]int)
	for _, o := range ops {
		if counts[o.Kind] == nil {
			counts[o.Kind] = make(map[string]int)
		}
		out := o.Outcome
		if o.Duplicate {
			out += "(duplicate)"
		}
		counts[o.Kind][out]++
	}
	fmt.Fprintf(&b, "operations: %d\n", len(ops))
	for _, kind := range []string{kindAcquire, kindGet, kindPut, kindRelease, kindFinalGet} {
		if counts[kind] == nil {
			continue
		}
		var parts []string
		total := 0
		for _, out := range slices.Sorted(maps.Keys(counts[kind])) {
			parts = append(parts, fmt.Sprintf("%s %d", out, counts[kind][out]))
			total += counts[kind][out]
		}
		fmt.Fprintf(&b, "  %-9s %5d: %s\n", kind, total, strings.Join(parts, ", "))
	}

	byKind := make(map[string]int)
	for _, f := range faults {
		byKind[f.Kind]++
	}
	fmt.Fprintf(&b, "faults injected: %d\n", len(faults))
	failovers := make(map[string][]int64)
	for _, f := range faults {
		if f.Failover > 0 {
			failovers[f.Kind] = append(failovers[f.Kind], f.Failover)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(byKind)) {
		fmt.Fprintf(&b, "  %-17s %d", k, byKind[k])
		if fo := failovers[k]; len(fo) > 0 {
			slices.Sort(fo)
			fmt.Fprintf(&b, "  (another node led after %.2fs min, %.2fs median, %.2fs max; %d of %d)", secs(fo[0]), secs(fo[len(fo)/2]), secs(fo[len(fo)-1]), len(fo), byKind[k])
		}
		fmt.Fprintln(&b)
	}
	fmt.Fprintf(&b, "checks:\n")
	for _, l := range rep.lines {
		fmt.Fprintf(&b, "  %s\n", l)
	}
	for _, w := range rep.warnings {
		fmt.Fprintf(&b, "  warning: %s\n", w)
	}
	fmt.Fprintf(&b, "anomalies: %d\n", len(rep.anomalies))
	for i, a := range rep.anomalies {
		if i == 20 {
			fmt.Fprintf(&b, "  ... %d more\n", len(rep.anomalies)-i)
			break
		}
		fmt.Fprintf(&b, "  [%s] %s\n", a.Check, a.Msg)
	}
	fmt.Fprintf(&b, "history: %s\n", histPath)
	return b.String()
}
