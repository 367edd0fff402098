// Package store opens the raft log and stable store on local disk. It is the
// one seam between Tenure and its storage engine (raft-boltdb today), so that
// another engine such as raft-wal can be measured by changing this file only.
package store

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
)

// LogCacheSize is how many recent log entries are kept in memory in front of
// the disk store.
const LogCacheSize = 1024

// Stores is an open log store and stable store.
type Stores struct {
	Log    raft.LogStore
	Stable raft.StableStore
	bolt   *raftboltdb.BoltStore
}

// Open opens (creating if needed) the stores under dir. Every write is
// fsynced before it returns.
func Open(dir string) (*Stores, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("store: creating %s: %w", dir, err)
	}
	bolt, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, "raft.db")})
	if err != nil {
		return nil, fmt.Errorf("store: opening %s: %w", filepath.Join(dir, "raft.db"), err)
	}
	cache, err := raft.NewLogCache(LogCacheSize, bolt)
	if err != nil {
		bolt.Close()
		return nil, fmt.Errorf("store: log cache: %w", err)
	}
	return &Stores{Log: cache, Stable: bolt, bolt: bolt}, nil
}

// Close closes the underlying database.
func (s *Stores) Close() error { return s.bolt.Close() }
