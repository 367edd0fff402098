package server

import (
	"sync"
	"time"

	"github.com/google/btree"
)

// revisionClock remembers when this node applied revisions, so that a
// revision (a queue item's id, a grant's token, a waiter's queued
// revision) can be given an age. The state keeps no time; this is this
// node's own, on its monotonic clock.
//
// Each applied batch of revisions (first, last] is sampled as (first, the
// time it was applied), at most one sample per gap (sampleEvery at first).
// A revision dates from the latest sample at or below it, so its age is
// over-estimated by less than gap. Past maxSamples the samples are
// thinned: gap doubles and a sample is kept only if it comes at least gap
// after the one kept before it (a sample after a pause always stays).
// Revisions applied before this process started date from its start (an
// under-estimate). Safe for concurrent use.
type revisionClock struct {
	// mu guards the fields below.
	mu      sync.Mutex
	start   time.Time
	prev    uint64 // the last revision applied
	gap     time.Duration
	last    time.Time
	samples *btree.BTreeG[revSample]
}

type revSample struct {
	rev uint64
	at  time.Time
}

const (
	sampleEvery = 10 * time.Millisecond
	maxSamples  = 1 << 16
)

func newRevisionClock(now time.Time) *revisionClock {
	return &revisionClock{start: now, gap: sampleEvery, samples: btree.NewG(32, func(a, b revSample) bool { return a.rev < b.rev })}
}

// applied records that the state reached revision rev at now.
func (c *revisionClock) applied(rev uint64, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	first := c.prev + 1
	if rev < first {
		c.prev = rev
		return
	}
	c.prev = rev
	if c.samples.Len() > 0 && now.Sub(c.last) < c.gap {
		return
	}
	c.last = now
	c.samples.ReplaceOrInsert(revSample{rev: first, at: now})
	for c.samples.Len() > maxSamples*3/4 && c.samples.Len() > 1 {
		c.gap *= 2
		var drop []revSample
		var kept time.Time
		i := 0
		c.samples.Ascend(func(s revSample) bool {
			if i > 0 && s.at.Sub(kept) < c.gap {
				drop = append(drop, s)
			} else {
				kept = s.at
			}
			i++
			return true
		})
		for _, s := range drop {
			c.samples.Delete(s)
		}
	}
}

// restored tells the clock the state was replaced at revision rev: the
// revisions it holds date from before.
func (c *revisionClock) restored(rev uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.prev = rev
}

// when is the time revision rev was applied (no later than it was).
func (c *revisionClock) when(rev uint64) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	at := c.start
	c.samples.DescendLessOrEqual(revSample{rev: rev}, func(s revSample) bool {
		at = s.at
		return false
	})
	return at
}
