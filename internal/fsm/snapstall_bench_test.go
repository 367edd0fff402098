package fsm

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// BenchmarkSnapshotStall measures how long a snapshot stops the apply
// path, with TENURE_BENCH_N sessions (default 1,000,000) each holding a
// lock of its own (as many lock names), built directly in the state.
// Raft calls FSM.Snapshot on its apply goroutine, so no entry is applied
// while it runs: "hold" is how long Snapshot takes. Persist then runs
// while a goroutine applies entries (a session created and closed, in a
// loop, from before Snapshot until Persist returns): "apply-max" is the
// longest of those applies, the time Snapshot held the lock included.
// Each round takes one snapshot as before (SnapshotSorted: the keys of
// the maps sorted and the message built under the lock) and one as now
// (Snapshot: coreCopy), in alternating order; TENURE_BENCH_ROUNDS rounds
// (default 3). Run it with -benchtime=1x:
//
//	TENURE_BENCH_N=1000000 go test -run '^$' -bench SnapshotStall -benchtime=1x -timeout 30m ./internal/fsm/
func BenchmarkSnapshotStall(b *testing.B) {
	n := benchEnv(b, "TENURE_BENCH_N", 1_000_000)
	rounds := benchEnv(b, "TENURE_BENCH_ROUNDS", 3)
	start := time.Now()
	f := stallFSM(b, n)
	b.Logf("built %d sessions and %d locks in %v", n, n, time.Since(start).Round(time.Millisecond))
	kinds := []struct {
		name     string
		snapshot func() (raft.FSMSnapshot, error)
	}{{"sorted", f.SnapshotSorted}, {"indexed", f.Snapshot}}
	results := make(map[string][]stallRound)
	b.ResetTimer()
	for range b.N {
		for r := range rounds {
			for i := range kinds {
				k := kinds[(i+r)%len(kinds)] // alternate which goes first
				res := measureStall(b, f, k.snapshot)
				b.Logf("round %d %-7s hold %8.1f ms, persist %8.1f ms, apply-max %8.1f ms (%d applies during the snapshot), %d MB",
					r+1, k.name, ms(res.hold), ms(res.persist), ms(res.applyMax), res.applies, res.bytes>>20)
				results[k.name] = append(results[k.name], res)
			}
		}
	}
	b.StopTimer()
	for _, k := range kinds {
		rs := results[k.name]
		hold := summary(rs, func(r stallRound) time.Duration { return r.hold })
		applyMax := summary(rs, func(r stallRound) time.Duration { return r.applyMax })
		persist := summary(rs, func(r stallRound) time.Duration { return r.persist })
		b.Logf("%-7s hold %s; apply-max %s; persist %s (median [min-max] ms, %d rounds)", k.name, hold, applyMax, persist, len(rs))
		b.ReportMetric(ms(median(rs, func(r stallRound) time.Duration { return r.hold })), k.name+"-hold-ms")
		b.ReportMetric(ms(median(rs, func(r stallRound) time.Duration { return r.applyMax })), k.name+"-apply-max-ms")
	}
	b.Logf("peak RSS %s", peakRSS())
}

// stallFSM returns an FSM with n sessions, session i holding lock names
// drawn so that their byte order is not the order they were created in.
func stallFSM(b *testing.B, n int) *FSM {
	f := New(nil)
	s := f.state
	s.limits.MaxSessions = uint64(n) + 1_000
	s.limits.MaxLocks = uint64(n) + 1_000
	secret := HashSecret([]byte("bench"))
	for i := range n {
		r := s.Apply(&fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: "bench", TtlMs: 60_000, SecretHash: secret}}}, nil)
		if r.Err != nil || r.Session != uint64(i+1) {
			b.Fatalf("session %d: %+v", i+1, r)
		}
	}
	for i := range n {
		name := fmt.Sprintf("lock/%016x", uint64(i)*0x9E3779B97F4A7C15)
		r := s.Apply(&fsmpb.Command{Op: &fsmpb.Command_Acquire{Acquire: &fsmpb.Acquire{Session: uint64(i + 1), Name: name, Wait: true}}}, nil)
		if r.Err != nil || !r.Granted {
			b.Fatalf("acquire %q: %+v", name, r)
		}
	}
	return f
}

type stallRound struct {
	hold, persist, applyMax time.Duration
	applies                 int
	bytes                   int64
}

// measureStall takes one snapshot with snapshot and persists it, while a
// goroutine applies entries, and reports how long each step took and the
// longest apply.
func measureStall(b *testing.B, f *FSM, snapshot func() (raft.FSMSnapshot, error)) stallRound {
	runtime.GC() // each round starts from the same heap
	stop := make(chan struct{})
	started := make(chan struct{})
	type applied struct {
		max time.Duration
		n   int
		err error
	}
	done := make(chan applied, 1)
	go func() {
		var a applied
		defer func() { done <- a }()
		for index := uint64(1); ; index += 2 {
			if index == 5 {
				close(started)
			}
			select {
			case <-stop:
				return
			default:
			}
			t0 := time.Now()
			r := TakeResult(f.Apply(stallEntry(b, index, &fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: "applier", TtlMs: 60_000}}})))
			a.max = max(a.max, time.Since(t0))
			if r.Err != nil {
				a.err = r.Err
				return
			}
			t0 = time.Now()
			r = TakeResult(f.Apply(stallEntry(b, index+1, &fsmpb.Command{Op: &fsmpb.Command_CloseSession{CloseSession: &fsmpb.CloseSession{Session: r.Session}}})))
			a.max = max(a.max, time.Since(t0))
			if r.Err != nil {
				a.err = r.Err
				return
			}
			a.n += 2
		}
	}()
	<-started
	var res stallRound
	t0 := time.Now()
	snap, err := snapshot()
	res.hold = time.Since(t0)
	if err != nil {
		b.Fatal(err)
	}
	sink := &countSink{}
	t0 = time.Now()
	if err := snap.Persist(sink); err != nil {
		b.Fatal(err)
	}
	res.persist = time.Since(t0)
	snap.Release()
	close(stop)
	a := <-done
	if a.err != nil {
		b.Fatalf("apply during the snapshot: %v", a.err)
	}
	res.applyMax, res.applies, res.bytes = a.max, a.n, sink.n
	return res
}

func stallEntry(b *testing.B, index uint64, cmd *fsmpb.Command) *raft.Log {
	data, err := EncodeEntry(cmd, 0)
	if err != nil {
		b.Fatal(err)
	}
	return &raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: data}
}

// countSink is a raft.SnapshotSink that counts what it is given.
type countSink struct{ n int64 }

func (s *countSink) Write(p []byte) (int, error) { s.n += int64(len(p)); return len(p), nil }
func (s *countSink) Close() error                { return nil }
func (s *countSink) ID() string                  { return "count" }
func (s *countSink) Cancel() error               { return nil }

func benchEnv(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q is not a positive number", name, v)
	}
	return n
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func median(rs []stallRound, of func(stallRound) time.Duration) time.Duration {
	ds := make([]time.Duration, len(rs))
	for i, r := range rs {
		ds[i] = of(r)
	}
	slices.Sort(ds)
	if len(ds)%2 == 1 {
		return ds[len(ds)/2]
	}
	return (ds[len(ds)/2-1] + ds[len(ds)/2]) / 2
}

func summary(rs []stallRound, of func(stallRound) time.Duration) string {
	lo, hi := of(rs[0]), of(rs[0])
	for _, r := range rs {
		lo, hi = min(lo, of(r)), max(hi, of(r))
	}
	return fmt.Sprintf("%.1f [%.1f-%.1f]", ms(median(rs, of)), ms(lo), ms(hi))
}

// peakRSS is the process's peak resident set (Linux), or "unknown".
func peakRSS() string {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}
