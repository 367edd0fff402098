package server

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// waitFor polls cond until it holds, failing the test once d has passed
// (internal/testutil's poller imports this package).
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: still false after %v", what, d)
		}
		time.Sleep(time.Millisecond)
	}
}

// levelMeter counts the work of each level running at once.
type levelMeter struct {
	running, most [numLevels]atomic.Int32
}

func (m *levelMeter) wrap(lv level, fn func()) func() {
	return func() {
		n := m.running[lv].Add(1)
		for {
			old := m.most[lv].Load()
			if n <= old || m.most[lv].CompareAndSwap(old, n) {
				break
			}
		}
		defer m.running[lv].Add(-1)
		fn()
	}
}

// TestWorkersSaturatedDoNotDeadlock: with every pool full, work that
// waits for lower work (a stream's close waits for its keepalives and its
// grants being signed; signing a grant may wait for keepalives) still
// finishes, and no level ever runs more than its bound at once. One
// bound over all the work would deadlock here: the waiting work would
// hold every slot while what it waits for sits in the queue.
func TestWorkersSaturatedDoNotDeadlock(t *testing.T) {
	const bound, streams = 2, 20
	w := newWorkers(bound)
	var m levelMeter
	gate := make(chan struct{}) // leaf work waits here until every pool is full
	opened := false
	defer func() {
		if !opened {
			close(gate)
		}
		if !t.Failed() { // deadlocked workers would never end
			w.close()
		}
	}()
	var done sync.WaitGroup
	for range streams {
		done.Add(1)
		w.Go(streamWork, m.wrap(streamWork, func() {
			defer done.Done()
			var inner sync.WaitGroup
			inner.Add(2)
			w.Go(leafWork, m.wrap(leafWork, func() { defer inner.Done(); <-gate }))
			w.Go(grantWork, m.wrap(grantWork, func() {
				defer inner.Done()
				var leaf sync.WaitGroup
				leaf.Add(1)
				w.Go(leafWork, m.wrap(leafWork, func() { defer leaf.Done(); <-gate }))
				leaf.Wait()
			}))
			inner.Wait()
		}))
	}
	waitFor(t, "every level's pool full", 10*time.Second, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return m.running[streamWork].Load() == bound && m.running[grantWork].Load() == bound &&
			m.running[leafWork].Load() == bound && len(w.pools[leafWork].queue) > 0 && len(w.pools[streamWork].queue) > 0
	})
	close(gate)
	opened = true
	finished := make(chan struct{})
	go func() { done.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(30 * time.Second):
		t.Fatal("saturated workers deadlocked: work waiting for lower work never finished")
	}
	for lv := range numLevels {
		if got := m.most[lv].Load(); got > bound {
			t.Errorf("level %d ran %d at once, bound %d", lv, got, bound)
		}
	}
}

// TestWorkersCloseJoins: close runs the work queued before it, returns
// only once every worker has ended, and refuses later work.
func TestWorkersCloseJoins(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	w := newWorkers(2)
	gate := make(chan struct{})
	var ran atomic.Int32
	for range 5 {
		if !w.Go(leafWork, func() { <-gate; ran.Add(1) }) {
			t.Fatal("Go refused work before close")
		}
	}
	closed := make(chan struct{})
	go func() { w.close(); close(closed) }()
	waitFor(t, "close called", 10*time.Second, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.closed
	})
	if w.Go(leafWork, func() { t.Error("work ran after close") }) {
		t.Error("Go accepted work after close")
	}
	select {
	case <-closed:
		t.Fatal("close returned while work was running")
	default:
	}
	close(gate)
	<-closed
	if got := ran.Load(); got != 5 {
		t.Errorf("%d of the 5 jobs queued before close ran", got)
	}
	w.close() // idempotent
}
