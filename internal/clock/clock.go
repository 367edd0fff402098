// Package clock abstracts the monotonic clock so that lease, session and
// client code can be driven by tests instead of sleeping.
package clock

import (
	"sort"
	"sync"
	"time"
)

// Clock tells monotonic time and makes timers. Implementations are safe for
// concurrent use.
type Clock interface {
	// Now returns the current time; only differences between two Now
	// values are meaningful (they use the monotonic reading).
	Now() time.Time
	// NewTimer returns a timer that fires once after d.
	NewTimer(d time.Duration) Timer
}

// Timer is a one-shot timer, like time.Timer.
type Timer interface {
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it did.
	Stop() bool
}

// Real is the system's monotonic clock.
var Real Clock = realClock{}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time { return t.t.C }
func (t realTimer) Stop() bool          { return t.t.Stop() }

// Fake is a clock that moves only when Advance is called. Timers whose
// deadline is reached fire during Advance, in deadline order.
type Fake struct {
	// mu guards now and timers.
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	// waiters are notified whenever a timer is created.
	waiters []chan struct{}
}

// NewFake returns a fake clock starting at an arbitrary fixed instant.
func NewFake() *Fake {
	return &Fake{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

// Now implements Clock.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer implements Clock.
func (f *Fake) NewTimer(d time.Duration) Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := &fakeTimer{f: f, at: f.now.Add(d), c: make(chan time.Time, 1)}
	if d <= 0 {
		t.c <- f.now
		t.fired = true
	} else {
		f.timers = append(f.timers, t)
	}
	for _, w := range f.waiters {
		close(w)
	}
	f.waiters = nil
	return t
}

// TimerCreated returns a channel closed the next time a timer is created:
// tests use it to wait until the code under test has armed its timer.
func (f *Fake) TimerCreated() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := make(chan struct{})
	f.waiters = append(f.waiters, c)
	return c
}

// Pending reports how many timers are armed.
func (f *Fake) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

// Advance moves the clock forward by d, firing every timer that comes due,
// and reports how many fired.
func (f *Fake) Advance(d time.Duration) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	sort.SliceStable(f.timers, func(i, j int) bool { return f.timers[i].at.Before(f.timers[j].at) })
	keep := f.timers[:0]
	fired := 0
	for _, t := range f.timers {
		if !t.at.After(f.now) {
			t.fired = true
			t.c <- t.at
			fired++
			continue
		}
		keep = append(keep, t)
	}
	f.timers = keep
	return fired
}

type fakeTimer struct {
	f     *Fake
	at    time.Time
	c     chan time.Time
	fired bool // guarded by f.mu
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	if t.fired {
		return false
	}
	for i, x := range t.f.timers {
		if x == t {
			t.f.timers = append(t.f.timers[:i], t.f.timers[i+1:]...)
			break
		}
	}
	t.fired = true
	return true
}
