package server

import (
	"sync"
	"time"
)

// level orders the server's background work by what it may wait for:
// work of one level waits only for work of lower levels, never for work
// of its own level or above. Each level has its own bounded pool, so a
// pool full of work that waits never holds back the work it waits for:
// the lowest level waits for nothing and always finishes (its proposals
// and reads are bounded by their contexts), and so, level by level, does
// every other.
type level uint8

const (
	// leafWork waits for no other work: a keepalive served after a
	// leadership check, withdrawing an acquisition, making the cluster
	// enforce its ACLs (serve --auth).
	leafWork level = iota
	// grantWork may wait for leafWork: checking and signing a grant
	// (ending its stream waits for the stream's keepalives).
	grantWork
	// streamWork may wait for leafWork and grantWork: opening, closing
	// and sweeping session streams (a close waits for the stream's
	// keepalives and grants being signed).
	streamWork
	numLevels
)

// maxWorkers bounds the work of one level running at once: as many
// proposals as the node commits in one batch. More work waits in the
// level's queue, oldest first.
const maxWorkers = 1024

// workerIdle is how long an idle worker waits for more work before it ends.
const workerIdle = 10 * time.Second

// workers runs the server's background work on a bounded pool per level,
// on goroutines kept for reuse: a request does not pay for a new
// goroutine and for growing its stack again. Go never blocks: work is
// handed to workers from the goroutine that applies commands, which must
// never wait for a worker; work beyond a level's bound is queued, and the
// queue is bounded by what it serves (the requests gRPC admits,
// MaxConcurrentStreams, and the server's limits). Every goroutine the
// server starts goes through start, which does both the WaitGroup's Add
// and its Done, so that close can wait for all of them.
type workers struct {
	max  int
	quit chan struct{} // closed by close: idle workers end
	wg   sync.WaitGroup

	// mu guards closed and the pools' queues and counts, and orders
	// wg.Add before close's wg.Wait.
	mu     sync.Mutex
	closed bool
	pools  [numLevels]pool
}

// pool is one level's workers; its fields but wake are guarded by
// workers.mu.
type pool struct {
	queue []func() // work no worker has taken yet, oldest first
	live  int      // workers running, busy or idle (at most workers.max)
	// idle counts the workers waiting for work that no token in wake is
	// meant for: a worker that stops waiting takes a token or, with none
	// there, takes itself off idle.
	idle int
	wake chan struct{} // capacity workers.max: never full
}

func newWorkers(max int) *workers {
	w := &workers{max: max, quit: make(chan struct{})}
	for i := range w.pools {
		w.pools[i].wake = make(chan struct{}, max)
	}
	return w
}

// Go runs fn on a worker of level lv: an idle one, a new one within the
// bound, or the first one free. It never blocks. It reports false, and
// does not run fn, once the server is closed; work queued before close
// still runs.
func (w *workers) Go(lv level, fn func()) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return false
	}
	p := &w.pools[lv]
	p.queue = append(p.queue, fn)
	switch {
	case p.idle > 0:
		p.idle--
		p.wake <- struct{}{}
	case p.live < w.max:
		p.live++
		w.startLocked(func() { w.run(p) })
	}
	return true
}

// start runs fn on a new goroutine that close waits for: the one place
// the server starts a goroutine (workers included). It reports false, and
// does not run fn, once the server is closed.
func (w *workers) start(fn func()) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return false
	}
	w.startLocked(fn)
	return true
}

func (w *workers) startLocked(fn func()) {
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		fn()
	}()
}

// run is a worker of p: it runs p's queue, then waits for more for up to
// workerIdle, and ends when it has waited that long or the server is
// closed and the queue is empty.
func (w *workers) run(p *pool) {
	timer := time.NewTimer(workerIdle)
	defer timer.Stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		if len(p.queue) > 0 {
			fn := p.queue[0]
			p.queue[0] = nil // the finished request is not kept alive
			p.queue = p.queue[1:]
			w.mu.Unlock()
			fn()
			w.mu.Lock()
			continue
		}
		if w.closed {
			p.live--
			return
		}
		p.idle++
		w.mu.Unlock()
		timer.Reset(workerIdle)
		woken := false
		select {
		case <-p.wake:
			woken = true
		case <-timer.C:
		case <-w.quit:
		}
		w.mu.Lock()
		if woken {
			continue
		}
		select {
		case <-p.wake: // work came as it stopped waiting
			continue
		default:
			p.idle--
		}
		if !w.closed && len(p.queue) == 0 { // idle for workerIdle
			p.live--
			return
		}
	}
}

// close refuses new work, lets the workers finish what is queued, ends
// them and waits for every goroutine started through start. It is
// idempotent.
func (w *workers) close() {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		close(w.quit)
	}
	w.mu.Unlock()
	w.wg.Wait()
}
