package store

import (
	"time"

	"github.com/hashicorp/raft"
)

// TimeAppends returns log with every StoreLog and StoreLogs call timed:
// observe receives how long each append (with its fsync) took. The store
// stays what it was to raft: whether it is monotonic (raft.
// MonotonicLogStore) is log's answer.
func TimeAppends(log raft.LogStore, observe func(time.Duration)) raft.LogStore {
	return timedLog{log, observe}
}

type timedLog struct {
	raft.LogStore
	observe func(time.Duration)
}

// StoreLog implements raft.LogStore.
func (t timedLog) StoreLog(l *raft.Log) error { return t.StoreLogs([]*raft.Log{l}) }

// StoreLogs implements raft.LogStore.
func (t timedLog) StoreLogs(logs []*raft.Log) error {
	start := time.Now()
	err := t.LogStore.StoreLogs(logs)
	t.observe(time.Since(start))
	return err
}

// IsMonotonic implements raft.MonotonicLogStore.
func (t timedLog) IsMonotonic() bool {
	m, ok := t.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}
