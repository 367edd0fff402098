package store

import (
	"sync"

	"github.com/hashicorp/raft"
)

// LogCacheBytes bounds the bytes of the entries the log cache holds: with
// values up to 1.5 MiB (a key's largest), 1,024 entries could otherwise
// hold 1.5 GiB that no limit of the state counts.
const LogCacheBytes = 64 << 20

// logCache keeps the newest log entries in memory in front of the disk
// store, as raft's LogCache does, bounded by count (LogCacheSize) and by
// bytes (LogCacheBytes): the oldest go first. It is safe for concurrent
// use.
type logCache struct {
	store raft.LogStore
	// mu guards ring, head, n and bytes: ring[head] is the oldest of n
	// entries of consecutive indexes.
	mu             sync.RWMutex
	ring           []*raft.Log
	head, n, bytes int
	maxBytes       int
}

func newLogCache(count, maxBytes int, store raft.LogStore) *logCache {
	return &logCache{store: store, ring: make([]*raft.Log, count), maxBytes: maxBytes}
}

// IsMonotonic implements raft.MonotonicLogStore.
func (c *logCache) IsMonotonic() bool {
	m, ok := c.store.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

// GetLog implements raft.LogStore.
func (c *logCache) GetLog(idx uint64, log *raft.Log) error {
	c.mu.RLock()
	if c.n > 0 {
		first := c.ring[c.head].Index
		if idx >= first && idx-first < uint64(c.n) {
			if l := c.ring[(c.head+int(idx-first))%len(c.ring)]; l.Index == idx {
				*log = *l
				c.mu.RUnlock()
				return nil
			}
		}
	}
	c.mu.RUnlock()
	return c.store.GetLog(idx, log)
}

// StoreLog implements raft.LogStore.
func (c *logCache) StoreLog(log *raft.Log) error { return c.StoreLogs([]*raft.Log{log}) }

// StoreLogs implements raft.LogStore: the entries are cached once the
// store has them.
func (c *logCache) StoreLogs(logs []*raft.Log) error {
	if err := c.store.StoreLogs(logs); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range logs {
		if c.n > 0 && l.Index != c.ring[(c.head+c.n-1)%len(c.ring)].Index+1 {
			c.resetLocked() // not the next entry: start again from it
		}
		if c.n == len(c.ring) {
			c.dropOldestLocked()
		}
		c.ring[(c.head+c.n)%len(c.ring)] = l
		c.n++
		c.bytes += len(l.Data) + len(l.Extensions)
		for c.bytes > c.maxBytes && c.n > 0 {
			c.dropOldestLocked()
		}
	}
	return nil
}

func (c *logCache) dropOldestLocked() {
	l := c.ring[c.head]
	c.bytes -= len(l.Data) + len(l.Extensions)
	c.ring[c.head] = nil
	c.head = (c.head + 1) % len(c.ring)
	c.n--
}

func (c *logCache) resetLocked() {
	clear(c.ring)
	c.head, c.n, c.bytes = 0, 0, 0
}

// FirstIndex implements raft.LogStore.
func (c *logCache) FirstIndex() (uint64, error) { return c.store.FirstIndex() }

// LastIndex implements raft.LogStore.
func (c *logCache) LastIndex() (uint64, error) { return c.store.LastIndex() }

// DeleteRange implements raft.LogStore; the cache starts again empty.
func (c *logCache) DeleteRange(min, max uint64) error {
	c.mu.Lock()
	c.resetLocked()
	c.mu.Unlock()
	return c.store.DeleteRange(min, max)
}
