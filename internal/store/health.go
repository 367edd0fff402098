package store

import (
	"errors"
	"fmt"
	"sync"
	"syscall"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	raftwal "github.com/hashicorp/raft-wal"
)

// ErrFull: the file system holding the stores has no space (or quota)
// left, so a write failed. Nothing of that write was stored. Failures
// that wrap it are *WriteError.
var ErrFull = errors.New("store: no space left")

// WriteError is a failed write to the stores: what was being written and
// why it failed. It matches ErrFull (errors.Is) when Full.
type WriteError struct {
	Op   string // "appending to the log", ...
	Err  error
	Full bool
}

func (e *WriteError) Error() string { return e.Op + ": " + e.Err.Error() }

// Unwrap returns the engine's error.
func (e *WriteError) Unwrap() error { return e.Err }

// Is reports whether target is ErrFull and the file system was full.
func (e *WriteError) Is(target error) bool { return e.Full && target == ErrFull }

// The kinds of write, each with its own health: during a full disk a small
// write (a term) may still fit where an append does not, and must not make
// the appends look healthy.
const (
	opAppend = iota
	opStable
	opDelete
	numOps
)

var opNames = [numOps]string{"appending to the log", "writing raft's stable store", "deleting from the log"}

// health remembers, per kind of write, whether the last one failed.
type health struct {
	mu sync.Mutex
	// failed holds each kind's last error, nil after a successful write.
	failed [numOps]error
}

// failure returns the first standing failure, appends first.
func (h *health) failure() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, err := range h.failed {
		if err != nil {
			return err
		}
	}
	return nil
}

// wrote records a write's outcome and returns the error to give raft.
func (h *health) wrote(op int, err error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil {
		h.failed[op] = nil
		return nil
	}
	werr := &WriteError{Op: opNames[op], Err: err, Full: isFull(err)}
	h.failed[op] = werr
	return werr
}

// isFull reports whether err says that the file system is full.
func isFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// checked is the engine's log and stable store with every write's outcome
// recorded in health.
//
// For raft-wal it keeps the engine appending through a full disk, working
// around two behaviours of raft-wal v0.4.1 (no upstream issue tracks them;
// TestWALRotationFailureSealsUntilReopened pins both on the real engine, so
// an upgrade that changes them fails that test):
//
//   - A failed rotation is only logged. raft-wal starts each segment file
//     (preallocated, 64 MiB) in the background once the current one is
//     full (wal.go, runRotate: "The only possible errors indicate bugs ...
//     just attempt to log them"). When that fails, for instance on a full
//     disk, its tail stays the sealed segment and every later append is
//     refused with ErrSealed, the only path that returns it: so ErrSealed
//     from StoreLogs is the explicit signal, and the store reads no log
//     line. The reason (a full disk) comes from the store's own room check.
//   - Nothing short of a new Open recovers from it: Open, finding the
//     segment the metadata names missing, creates it. So the store closes
//     the engine and opens it again on the same files, under the running
//     raft (writes wait on mu meanwhile; reads of the cache go on), as a
//     restart of the process would.
//
// So an append is refused as "storage full" while the file system has less
// room than a segment and a margin, before raft-wal sees it: the engine
// never starts a segment it has no room for, and a failed metadata write
// (which a restart would not repair) is avoided too. Should the disk fill
// up anyway between that check and the segment's start (another process
// writing), raft-wal seals its log; the next append then finds room (or is
// refused), closes the engine, opens it again and retries. Nothing is lost:
// the refused appends were never written, and an open recovers every
// committed entry.
type checked struct {
	health *health
	// reopen closes the engine and opens it again (nil: never needed).
	reopen func() (raft.LogStore, raft.StableStore, error)
	// room returns nil when the file system has room to start a segment,
	// else why not (wrapping ENOSPC); nil room: no check.
	room func() error
	// tailRoom is room for deleting a suffix of the log (see DeleteRange);
	// nil: no check.
	tailRoom func() error

	// mu guards log, stable and closed: reads and writes hold it shared,
	// a restart exclusively.
	mu     sync.RWMutex
	log    raft.LogStore
	stable raft.StableStore
	// closed: a restart closed the engine and failed to open it again.
	closed bool
}

func (c *checked) FirstIndex() (uint64, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.log.FirstIndex()
}

func (c *checked) LastIndex() (uint64, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.log.LastIndex()
}

func (c *checked) GetLog(index uint64, l *raft.Log) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.log.GetLog(index, l)
}

func (c *checked) StoreLog(l *raft.Log) error {
	return c.StoreLogs([]*raft.Log{l})
}

func (c *checked) StoreLogs(logs []*raft.Log) error {
	if c.room != nil {
		// raft-wal must not fill its segment without room for the next.
		if err := c.room(); err != nil {
			return c.health.wrote(opAppend, err)
		}
	}
	c.mu.RLock()
	closed := c.closed
	c.mu.RUnlock()
	if closed {
		// An earlier restart closed the engine and could not open it.
		if err := c.restart(); err != nil {
			return c.health.wrote(opAppend, fmt.Errorf("the log could not be opened again: %w", err))
		}
	}
	c.mu.RLock()
	err := c.log.StoreLogs(logs)
	c.mu.RUnlock()
	if err != nil && c.reopen != nil && errors.Is(err, raftwal.ErrSealed) {
		// raft-wal could not start its next segment (see checked).
		if rerr := c.restart(); rerr != nil {
			err = fmt.Errorf("%w (the next log segment could not be created: %w)", err, rerr)
		} else {
			c.mu.RLock()
			err = c.log.StoreLogs(logs)
			c.mu.RUnlock()
		}
	}
	return c.health.wrote(opAppend, err)
}

// DeleteRange deletes the entries min to max. A deletion of the log's
// suffix (raft replacing entries of an old term with its leader's) happens
// whole or not at all, as raft assumes: raft keeps its own idea of the
// last index, which it moves only once the append that follows the
// deletion succeeds, and a member whose log and raft disagree never
// catches up until it restarts. raft-wal deletes a suffix by recording it
// in its metadata, then starting a new segment (a preallocated file):
// on a full disk the segment fails after the metadata is written, and
// the engine, its memory and its files disagreeing, failed every later
// deletion ("file exists") until it was opened again. So a suffix is
// deleted only with room for that segment and for the append after it
// (tailRoom), and should the segment fail anyway (the disk filled up in
// between), the engine is opened again at once (restart), and the
// deletion reported done if its metadata had recorded it, else tried
// once more.
func (c *checked) DeleteRange(min, max uint64) error {
	suffix := c.isSuffix(min, max)
	if suffix && c.tailRoom != nil {
		if err := c.tailRoom(); err != nil {
			return c.health.wrote(opDelete, err)
		}
	}
	c.mu.RLock()
	err := c.log.DeleteRange(min, max)
	c.mu.RUnlock()
	if err != nil && suffix && c.reopen != nil {
		err = c.settleSuffix(min, max, err)
	}
	return c.health.wrote(opDelete, err)
}

// isSuffix reports whether deleting min to max removes the log's last
// entries and keeps its first.
func (c *checked) isSuffix(min, max uint64) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	first, ferr := c.log.FirstIndex()
	last, lerr := c.log.LastIndex()
	return ferr == nil && lerr == nil && first < min && min <= last && max >= last
}

// settleSuffix follows a failed deletion of the suffix min to max (err):
// it opens the engine again, then reports the deletion done if the log
// now ends before min, else tries it once more. If the engine cannot be
// opened again now (no room), it returns err: the engine still holds the
// whole log in memory, and raft's next attempt, once there is room,
// settles it here.
func (c *checked) settleSuffix(min, max uint64, err error) error {
	if rerr := c.restart(); rerr != nil {
		return fmt.Errorf("%w (and opening the log again failed: %w)", err, rerr)
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	last, lerr := c.log.LastIndex()
	if lerr != nil {
		return fmt.Errorf("%w (and reading the log opened again failed: %w)", err, lerr)
	}
	if last == min-1 {
		return nil // the metadata had recorded the deletion
	}
	return c.log.DeleteRange(min, max)
}

// restart closes the engine and opens it again, if the file system has
// room for its next segment. It returns why not otherwise. The reopen
// function given to checked closes the engine first; if its open fails,
// the engine stays closed and the next append tries again.
func (c *checked) restart() error {
	if err := c.room(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	log, stable, err := c.reopen()
	if err != nil {
		// reopen closes the engine before it opens it again: until an
		// open succeeds, every append tries again.
		c.closed = true
		return err
	}
	c.log, c.stable, c.closed = log, stable, false
	return nil
}

// IsMonotonic implements raft.MonotonicLogStore for an engine that does
// (raft-wal): raft then removes the whole log after installing a snapshot.
func (c *checked) IsMonotonic() bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	m, ok := c.log.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

var _ raft.MonotonicLogStore = (*checked)(nil)

// checkedStable is the stable store side of checked.
type checkedStable struct{ c *checked }

func (s checkedStable) Set(key, val []byte) error {
	return s.c.health.wrote(opStable, s.c.stable.Set(key, val))
}

// Get returns nil for a missing key, whatever the engine (raft accepts
// that as well as raft-boltdb's "not found").
func (s checkedStable) Get(key []byte) ([]byte, error) {
	v, err := s.c.stable.Get(key)
	if errors.Is(err, raftboltdb.ErrKeyNotFound) {
		return nil, nil
	}
	return v, err
}

func (s checkedStable) SetUint64(key []byte, val uint64) error {
	return s.c.health.wrote(opStable, s.c.stable.SetUint64(key, val))
}

// GetUint64 returns 0 for a missing key, whatever the engine.
func (s checkedStable) GetUint64(key []byte) (uint64, error) {
	v, err := s.c.stable.GetUint64(key)
	if errors.Is(err, raftboltdb.ErrKeyNotFound) {
		return 0, nil
	}
	return v, err
}
