// Package store opens the raft log and stable store on local disk. It is the
// one seam between Tenure and its storage engine: raft-wal (the default
// for a new directory, DefaultEngine) or raft-boltdb. Both fsync every append before raft
// counts it as stored.
//
// The stores keep track of their writes' health (Failure): a write that
// fails, most often because the file system is full, is remembered until a
// later write succeeds.
package store

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// LogCacheSize is how many recent log entries are kept in memory in front of
// the disk store (at most LogCacheBytes of them).
const LogCacheSize = 1024

// Engines lists the storage engines Open accepts.
var Engines = []string{"bolt", "wal"}

// DefaultEngine is the engine of a new data directory: raft-wal, which
// takes one fsync per append where raft-boltdb takes two. (raft-wal seals
// its log when it cannot start its next segment, on a full disk; the store
// refuses appends before that, and opens it again once there is room if it
// happens anyway, see checked.)
const DefaultEngine = "wal"

// Stores is an open log store and stable store.
type Stores struct {
	// Log is the raft log, behind a cache of the newest entries.
	Log raft.LogStore
	// Stable is raft's stable store (terms and votes).
	Stable raft.StableStore
	// Engine is the engine in use, "bolt" or "wal".
	Engine string
	// Dir is the directory Open was given.
	Dir string

	health *health
	closer io.Closer
	room   func() error
}

// Open opens (creating if needed) the stores under dir with the named
// engine. "" means the engine the directory was created with, or
// DefaultEngine for a new one; naming an engine other than the directory's
// is refused. One process at a time: while the stores are open, dir is
// locked (an advisory lock on dir/LOCK, released by Close or by the
// process's end, kill -9 included), and a second Open fails at once with a
// "locked by another process" error. The engine's own messages go to
// logOutput (nil: stderr). Missing or damaged metadata is an error that
// names the file, never a panic.
func Open(dir, engine string, logOutput io.Writer) (*Stores, error) {
	if logOutput == nil {
		logOutput = os.Stderr
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("store: creating %s: %w", dir, err)
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	s, err := open(dir, engine, logOutput)
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

// Remedy is what to do about a damaged data directory, for the end of an
// error message.
const Remedy = "restore from a backup onto an empty data directory (tenure snapshot restore --above-revision R FILE, R the revision in raft/applied) or rebuild this member from its peers (wipe its data directory, start it with serve --join, then run tenure member rebuild ID PEER_ADDR)"

func open(dir, engine string, logOutput io.Writer) (s *Stores, err error) {
	boltPath := filepath.Join(dir, "raft.db")
	walDir := filepath.Join(dir, "wal")
	_, boltErr := os.Stat(boltPath)
	_, walErr := os.Stat(walDir)
	if engine == "" {
		engine = DefaultEngine
		switch {
		case boltErr == nil:
			engine = "bolt"
		case walErr == nil:
			engine = "wal"
		}
	}
	switch {
	case engine == "bolt" && walErr == nil:
		return nil, fmt.Errorf("store: %s was created with the wal engine; open it with --log-store wal", dir)
	case engine == "wal" && boltErr == nil:
		return nil, fmt.Errorf("store: %s was created with the bolt engine; open it with --log-store bolt", dir)
	}
	// A damaged bolt file can make bbolt panic rather than fail; a panic
	// while opening is a damaged file too.
	defer func() {
		if p := recover(); p != nil {
			s, err = nil, fmt.Errorf("store: opening %s: %v: the file is damaged; %s", dir, p, Remedy)
		}
	}()
	h := &health{}
	var reopen func() (raft.LogStore, raft.StableStore, error)
	var room, tailRoom func() error
	var log raft.LogStore
	var stable raft.StableStore
	var closer io.Closer
	switch engine {
	case "bolt":
		bolt, err := raftboltdb.New(raftboltdb.Options{Path: boltPath, BoltOptions: &bbolt.Options{
			Timeout: time.Second, // another process holding the file: fail, do not hang
		}})
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, errLocked(boltPath)
		}
		if errors.Is(err, bolterrors.ErrInvalid) || errors.Is(err, bolterrors.ErrChecksum) || errors.Is(err, bolterrors.ErrVersionMismatch) {
			return nil, fmt.Errorf("store: %s is damaged (%v); %s", boltPath, err, Remedy)
		}
		if err != nil {
			return nil, fmt.Errorf("store: opening %s: %w", boltPath, err)
		}
		log, stable, closer = bolt, bolt, bolt
	case "wal":
		if err := os.MkdirAll(walDir, 0o750); err != nil {
			return nil, fmt.Errorf("store: creating %s: %w", walDir, err)
		}
		if err := checkWALMeta(walDir); err != nil {
			return nil, err
		}
		room = func() error { return roomFor(walDir, int64(raftwal.DefaultSegmentSize)+walRoomMargin) }
		// Deleting a suffix starts a segment, and raft appends right after
		// it (checked.DeleteRange).
		tailRoom = func() error { return roomFor(walDir, 2*int64(raftwal.DefaultSegmentSize)+walRoomMargin) }
		if newWAL(walDir) {
			// raft-wal's first segment must fit, and the first append
			// after it: on a full disk a first start stops here, having
			// written nothing, and starts afresh once there is room.
			if err := room(); err != nil {
				return nil, diskFull(walDir, err)
			}
		}
		// raft-wal's Open leaves its metadata database open when it fails
		// (v0.4.1), and the engine is opened again on the same database
		// (checked), so the store owns it: it closes it after a failed open
		// and after the log (WAL.Close closes it too; a second Close does
		// nothing).
		meta := &metadb.BoltMetaDB{}
		openWAL := func() (*raftwal.WAL, error) {
			return raftwal.Open(walDir, raftwal.WithMetaStore(meta), raftwal.WithLogger(walLogger(logOutput)))
		}
		w, err := openWAL()
		if err != nil {
			meta.Close()
			if isFull(err) {
				return nil, diskFull(walDir, err)
			}
			return nil, fmt.Errorf("store: opening %s: %v: the log or its metadata is damaged; %s", walDir, err, Remedy)
		}
		cur := &walCloser{w: w}
		log, stable, closer = w, w, closers{cur, meta}
		reopen = func() (raft.LogStore, raft.StableStore, error) {
			cur.mu.Lock()
			defer cur.mu.Unlock()
			if err := cur.w.Close(); err != nil {
				return nil, nil, err
			}
			w, err := openWAL()
			if err != nil {
				// Not opened: no process can append to this log
				// any more. The next attempt opens it again.
				return nil, nil, fmt.Errorf("opening %s again: %w", walDir, err)
			}
			cur.w = w
			return w, w, nil
		}
	default:
		return nil, fmt.Errorf("store: unknown engine %q (want bolt or wal)", engine)
	}
	c := &checked{log: log, stable: stable, health: h, reopen: reopen, room: room, tailRoom: tailRoom}
	if room == nil {
		room = func() error { return nil }
	}
	cache := newLogCache(LogCacheSize, LogCacheBytes, c)
	return &Stores{Log: cache, Stable: checkedStable{c}, Engine: engine, Dir: dir, health: h, closer: closer, room: room}, nil
}

// newWAL reports whether walDir holds no log yet (no metadata, no
// segment).
func newWAL(walDir string) bool {
	if _, err := os.Stat(filepath.Join(walDir, metadb.FileName)); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return false
	}
	segs, _ := filepath.Glob(filepath.Join(walDir, "*.wal"))
	return len(segs) == 0
}

// diskFull is the error for a log that cannot be opened for want of
// space: nothing is damaged, and the same start succeeds once there is
// room.
func diskFull(dir string, err error) error {
	return &WriteError{Op: fmt.Sprintf("store: disk full: opening the log in %s (free space on its file system, then start again; nothing was written)", dir), Err: err, Full: true}
}

// Room returns nil if the stores have room for the next append, else an
// error that wraps ErrFull and says how much there is (the wal engine
// keeps room for its next segment; the bolt engine cannot tell).
func (s *Stores) Room() error {
	if err := s.room(); err != nil {
		return &WriteError{Op: "disk full: " + opNames[opAppend], Err: err, Full: true}
	}
	return nil
}

// checkWALMeta refuses a wal directory whose segment files lost their
// metadata database: raft-wal would start a new, empty log over them.
func checkWALMeta(walDir string) error {
	metaPath := filepath.Join(walDir, metadb.FileName)
	if _, err := os.Stat(metaPath); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return nil // present (or unreadable: raft-wal says why)
	}
	segs, _ := filepath.Glob(filepath.Join(walDir, "*.wal"))
	if len(segs) == 0 {
		return nil // a new log
	}
	return fmt.Errorf("store: %s is missing, but %s holds %d log segment files: the log's metadata is lost; %s", metaPath, walDir, len(segs), Remedy)
}

// FileOf names the file that holds log entry index: the bolt database, or
// the raft-wal segment whose first index is the highest at or below it.
func (s *Stores) FileOf(index uint64) string {
	if s.Engine == "bolt" {
		return filepath.Join(s.Dir, "raft.db")
	}
	walDir := filepath.Join(s.Dir, "wal")
	segs, _ := filepath.Glob(filepath.Join(walDir, "*.wal"))
	sort.Strings(segs) // names start with the first index, zero-padded
	file := walDir
	for _, seg := range segs {
		var base, id uint64
		if _, err := fmt.Sscanf(filepath.Base(seg), "%020d-%016x.wal", &base, &id); err == nil && base <= index {
			file = seg
		}
	}
	return file
}

// Failure returns the error of the last write to the stores (an append,
// a deletion, a term or vote) if it failed, or nil if it succeeded. A
// failure wraps ErrFull when the file system has no space (or quota) left.
// It is safe for concurrent use.
func (s *Stores) Failure() error { return s.health.failure() }

// walRoomMargin is the room kept beyond raft-wal's next segment, for its
// metadata database and the files beside the log.
const walRoomMargin = 4 << 20

// walCloser closes the raft-wal engine open now (checked may have opened
// it again since the stores were opened).
type walCloser struct {
	// mu guards w.
	mu sync.Mutex
	w  *raftwal.WAL
}

func (c *walCloser) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.w.Close()
}

type closers []io.Closer

func (cs closers) Close() error {
	var errs []error
	for _, c := range cs {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// Close closes the underlying files.
func (s *Stores) Close() error { return s.closer.Close() }

// walLogger is raft-wal's logger: its warnings and errors go to out. The
// store decides nothing from them (see checked).
func walLogger(out io.Writer) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "wal", Level: hclog.Warn, Output: out})
}
