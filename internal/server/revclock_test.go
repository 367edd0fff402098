package server

import (
	"testing"
	"time"
)

// TestRevisionClock: a revision dates from its batch (within the sampling
// gap), also after a pause, before the process's start it dates from the
// start, and thinning keeps the samples bounded without dating a
// revision after a pause from before it.
func TestRevisionClock(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := newRevisionClock(t0)
	c.applied(10, t0.Add(time.Second))                  // (0, 10] at 1s
	c.applied(12, t0.Add(time.Second+time.Millisecond)) // within the gap: not sampled
	c.applied(20, t0.Add(time.Hour))                    // (12, 20] after a pause
	for _, tc := range []struct {
		rev  uint64
		want time.Duration
	}{{5, time.Second}, {11, time.Second}, {13, time.Hour}, {20, time.Hour}} {
		if got := c.when(tc.rev).Sub(t0); got != tc.want {
			t.Errorf("when(%d) = t0+%v, want t0+%v", tc.rev, got, tc.want)
		}
	}
	c.restored(5) // a restore may move the revision anywhere; nothing breaks
	c.applied(6, t0.Add(2*time.Hour))

	d := newRevisionClock(t0)
	at := t0
	for rev := uint64(1); rev <= 2*maxSamples; rev++ {
		at = at.Add(sampleEvery)
		d.applied(rev, at)
	}
	d.applied(2*maxSamples+1, at.Add(24*time.Hour)) // after a pause
	if n := d.samples.Len(); n > maxSamples {
		t.Fatalf("%d samples, the bound is %d", n, maxSamples)
	}
	if got := d.when(2*maxSamples + 1); !got.Equal(at.Add(24 * time.Hour)) {
		t.Fatalf("the revision after the pause dates from %v", got.Sub(t0))
	}
	if got := d.when(maxSamples).Sub(t0); got > time.Duration(maxSamples)*sampleEvery || got < time.Duration(maxSamples)*sampleEvery-d.gap {
		t.Fatalf("when(%d) = t0+%v after thinning (gap %v)", uint64(maxSamples), got, d.gap)
	}
}
