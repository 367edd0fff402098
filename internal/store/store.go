// Package store opens the raft log and stable store on local disk. It is the
// one seam between Tenure and its storage engine: raft-wal (the default for
// a new directory) or raft-boltdb. Both fsync every append before raft
// counts it as stored.
package store

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"go.etcd.io/bbolt"
)

// LogCacheSize is how many recent log entries are kept in memory in front of
// the disk store.
const LogCacheSize = 1024

// Engines lists the storage engines Open accepts.
var Engines = []string{"bolt", "wal"}

// Stores is an open log store and stable store.
type Stores struct {
	Log    raft.LogStore
	Stable raft.StableStore
	closer io.Closer
}

// Open opens (creating if needed) the stores under dir with the named
// engine. "" means the engine the directory was created with, or wal for a
// new one; naming an engine other than the directory's is refused. One
// process at a time: while the stores are open, dir is locked (an advisory
// lock on dir/LOCK, released by Close or by the process's end, kill -9
// included), and a second Open fails at once with a "locked by another
// process" error.
func Open(dir, engine string) (*Stores, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("store: creating %s: %w", dir, err)
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	s, err := open(dir, engine)
	if err != nil {
		lock.Close()
		return nil, err
	}
	s.closer = closers{s.closer, lock}
	return s, nil
}

// errLocked says that another process holds path's lock.
func errLocked(path string) error {
	return fmt.Errorf("store: %s is locked by another process (is another tenure serve using this data directory?)", path)
}

func open(dir, engine string) (*Stores, error) {
	boltPath := filepath.Join(dir, "raft.db")
	walDir := filepath.Join(dir, "wal")
	_, boltErr := os.Stat(boltPath)
	_, walErr := os.Stat(walDir)
	if engine == "" {
		engine = "wal"
		if boltErr == nil {
			engine = "bolt"
		}
	}
	switch {
	case engine == "bolt" && walErr == nil:
		return nil, fmt.Errorf("store: %s was created with the wal engine; open it with --log-store wal", dir)
	case engine == "wal" && boltErr == nil:
		return nil, fmt.Errorf("store: %s was created with the bolt engine; open it with --log-store bolt", dir)
	}
	var log raft.LogStore
	var stable raft.StableStore
	var closer io.Closer
	switch engine {
	case "bolt":
		bolt, err := raftboltdb.New(raftboltdb.Options{Path: boltPath, BoltOptions: &bbolt.Options{
			Timeout: time.Second, // another process holding the file: fail, do not hang
		}})
		if errors.Is(err, bbolt.ErrTimeout) {
			return nil, errLocked(boltPath)
		}
		if err != nil {
			return nil, fmt.Errorf("store: opening %s: %w", boltPath, err)
		}
		log, stable, closer = bolt, bolt, bolt
	case "wal":
		if err := os.MkdirAll(walDir, 0o750); err != nil {
			return nil, fmt.Errorf("store: creating %s: %w", walDir, err)
		}
		// raft-wal's Close leaves its metadata database open, so the store
		// owns it and closes it after the log.
		meta := &metadb.BoltMetaDB{}
		w, err := raftwal.Open(walDir, raftwal.WithMetaStore(meta))
		if err != nil {
			meta.Close()
			return nil, fmt.Errorf("store: opening %s: %w", walDir, err)
		}
		log, stable, closer = w, w, closers{w, meta}
	default:
		return nil, fmt.Errorf("store: unknown engine %q (want bolt or wal)", engine)
	}
	cache, err := raft.NewLogCache(LogCacheSize, log)
	if err != nil {
		closer.Close()
		return nil, fmt.Errorf("store: log cache: %w", err)
	}
	return &Stores{Log: cache, Stable: stable, closer: closer}, nil
}

type closers []io.Closer

func (cs closers) Close() error {
	var first error
	for _, c := range cs {
		if err := c.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Close closes the underlying files.
func (s *Stores) Close() error { return s.closer.Close() }
