package metrics

import (
	"testing"
	"time"
)

// BenchmarkAcquirePath is what the metrics add to one granted acquire:
// reading the clock twice and one histogram observation.
func BenchmarkAcquirePath(b *testing.B) {
	m := New()
	for b.Loop() {
		start := time.Now()
		m.ObserveLockWait("mutex", time.Since(start))
	}
}

// BenchmarkBatchPath is what they add to one log entry: the append timed
// (two clock reads, one observation) and the batch size observed.
func BenchmarkBatchPath(b *testing.B) {
	m := New()
	for b.Loop() {
		start := time.Now()
		m.LogAppend(time.Since(start))
		m.Batch(64)
	}
}

// BenchmarkScrape is one scrape of the registry without a source (the Go
// runtime's and the process's collectors, the histograms).
func BenchmarkScrape(b *testing.B) {
	m := New()
	for b.Loop() {
		if _, err := m.Registry().Gather(); err != nil {
			b.Fatal(err)
		}
	}
}
