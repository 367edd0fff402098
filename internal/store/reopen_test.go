package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
	walfs "github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/segment"
	"github.com/hashicorp/raft-wal/types"
)

// sealedLog is a log store that refuses appends as raft-wal does once it
// has sealed its log, and takes them otherwise.
type sealedLog struct {
	raft.LogStore
	sealed bool
	stored int
}

func (l *sealedLog) StoreLogs(logs []*raft.Log) error {
	if l.sealed {
		return fmt.Errorf("appending: %w", raftwal.ErrSealed)
	}
	l.stored += len(logs)
	return nil
}

// TestSealedWALOpensAgain: an append refused because raft-wal sealed its log
// after failing to start a segment is refused as "full" while there is no
// room for a segment, and once there is, the engine is opened again in
// place and the append retried on it; the failure clears. The decision
// rests on raft-wal's ErrSealed alone, never on what it logged.
func TestSealedWALOpensAgain(t *testing.T) {
	h := &health{}
	old := &sealedLog{sealed: true}
	fresh := &sealedLog{}
	var roomErr error = fmt.Errorf("3 MiB free: %w", syscall.ENOSPC)
	// roomAfter, when > 0, is how many more room checks pass before
	// roomErr applies again.
	roomAfter := 0
	room := func() error {
		if roomAfter > 0 {
			roomAfter--
			return nil
		}
		return roomErr
	}
	reopened := 0
	var openErr error
	c := &checked{health: h, log: old, room: room,
		reopen: func() (raft.LogStore, raft.StableStore, error) {
			reopened++
			if openErr != nil {
				return nil, nil, openErr
			}
			return fresh, nil, nil
		}}
	logs := []*raft.Log{{Index: 1}}

	// No room: the room check refuses before the engine sees the append.
	if err := c.StoreLogs(logs); !errors.Is(err, ErrFull) || reopened != 0 {
		t.Fatalf("append without room: %v (reopened %d), want ErrFull and no reopen", err, reopened)
	}
	// Room for the append, but gone by the time the engine would be
	// opened again: refused as full and as sealed, not opened.
	roomAfter = 1
	if err := c.StoreLogs(logs); !errors.Is(err, ErrFull) || !errors.Is(err, raftwal.ErrSealed) || reopened != 0 {
		t.Fatalf("append to a sealed log when the room goes: %v (reopened %d), want ErrFull and ErrSealed, no reopen", err, reopened)
	}
	// Room, and the open after closing the engine fails: refused (not as
	// full), and the next append opens it.
	roomErr = nil
	openErr = errors.New("opening: disk gone")
	if err := c.StoreLogs(logs); err == nil || errors.Is(err, ErrFull) || reopened != 1 || !c.closed {
		t.Fatalf("append when the open fails: %v (reopened %d, closed %v)", err, reopened, c.closed)
	}
	openErr = nil
	reopened = 0
	// Opened again, retried.
	if err := c.StoreLogs(logs); err != nil || reopened != 1 || fresh.stored != 1 {
		t.Fatalf("append after a failed rotation with room: %v (reopened %d, stored %d), want it stored on the engine opened again", err, reopened, fresh.stored)
	}
	if err := h.failure(); err != nil {
		t.Fatalf("failure %v after the append succeeded", err)
	}
}

// failingFiler is raft-wal's own segment filer, whose Create fails while
// fail is set (as preallocating a segment on a full disk does).
type failingFiler struct {
	types.SegmentFiler
	fail atomic.Bool
}

func (f *failingFiler) Create(info types.SegmentInfo) (types.SegmentWriter, error) {
	if f.fail.Load() {
		return nil, fmt.Errorf("creating segment %d: %w", info.ID, syscall.ENOSPC)
	}
	return f.SegmentFiler.Create(info)
}

// TestWALRotationFailureSealsUntilReopened pins the two behaviours of
// raft-wal that checked works around, on the real engine: when its
// background rotation cannot start the next segment, the next append
// fails with ErrSealed (and keeps failing), and opening the engine again on
// the same files makes it append again with every entry kept. checked then
// does this by itself under the append that found the log sealed.
func TestWALRotationFailureSealsUntilReopened(t *testing.T) {
	dir := t.TempDir()
	meta := &metadb.BoltMetaDB{}
	t.Cleanup(func() { meta.Close() })
	filer := &failingFiler{SegmentFiler: segment.NewFiler(dir, walfs.New())}
	open := func() (*raftwal.WAL, error) {
		return raftwal.Open(dir, raftwal.WithMetaStore(meta), raftwal.WithSegmentFiler(filer),
			raftwal.WithSegmentSize(8<<10), raftwal.WithLogger(hclog.NewNullLogger()))
	}
	w, err := open()
	if err != nil {
		t.Fatal(err)
	}
	cur := w
	t.Cleanup(func() { cur.Close() })
	entry := func(i uint64) []*raft.Log {
		return []*raft.Log{{Index: i, Term: 1, Type: raft.LogCommand, Data: make([]byte, 1<<10)}}
	}

	// Fill segments until one seals while no segment can be created.
	filer.fail.Store(true)
	var last uint64
	for i := uint64(1); ; i++ {
		if i > 1000 {
			t.Fatal("1,000 appends of 1 KiB to 8 KiB segments never sealed the log")
		}
		if err = cur.StoreLogs(entry(i)); err != nil {
			break
		}
		last = i
	}
	if !errors.Is(err, raftwal.ErrSealed) || last < 2 {
		t.Fatalf("append after a failed rotation (%d stored): %v, want raft-wal's ErrSealed", last, err)
	}
	if err := cur.StoreLogs(entry(last + 1)); !errors.Is(err, raftwal.ErrSealed) {
		t.Fatalf("second append after a failed rotation: %v, want ErrSealed again", err)
	}

	// checked opens the engine again under the append that finds it
	// sealed; while segments still cannot be created, that open fails and
	// the append is refused as full.
	h := &health{}
	c := &checked{health: h, log: cur, stable: cur, room: func() error { return nil },
		reopen: func() (raft.LogStore, raft.StableStore, error) {
			if err := cur.Close(); err != nil {
				return nil, nil, err
			}
			w, err := open()
			if err != nil {
				return nil, nil, err
			}
			cur = w
			return w, w, nil
		}}
	if err := c.StoreLogs(entry(last + 1)); !errors.Is(err, ErrFull) {
		t.Fatalf("append while no segment can be created: %v, want ErrFull", err)
	}
	filer.fail.Store(false)
	if err := c.StoreLogs(entry(last + 1)); err != nil {
		t.Fatalf("append once a segment can be created: %v", err)
	}
	if n, err := c.LastIndex(); err != nil || n != last+1 {
		t.Fatalf("last index %d (%v), want %d", n, err, last+1)
	}
	for i := uint64(1); i <= last+1; i++ {
		var l raft.Log
		if err := c.GetLog(i, &l); err != nil || l.Index != i || len(l.Data) != 1<<10 {
			t.Fatalf("entry %d after the engine opened again: index %d, %d bytes, %v", i, l.Index, len(l.Data), err)
		}
	}
	if err := h.failure(); err != nil {
		t.Fatalf("failure %v after the append succeeded", err)
	}
}

// fullFS is raft-wal's file system as a full disk leaves it while full
// is set: a segment's file is created, then preallocating it fails (the
// file stays, as raft-wal's own Create leaves it).
type fullFS struct {
	types.VFS
	full atomic.Bool
}

func (f *fullFS) Create(dir, name string, size uint64) (types.WritableFile, error) {
	if !f.full.Load() {
		return f.VFS.Create(dir, name, size)
	}
	fh, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	fh.Close()
	return nil, fmt.Errorf("preallocating %s: %w", name, syscall.ENOSPC)
}

// TestWALTailTruncationOnFullDisk: a follower whose log ends with entries
// of an old term (a leader that stepped down when its disk filled keeps
// what it stored and never sent) must replace them with the new leader's:
// raft deletes the suffix, then appends. raft-wal deletes a suffix by
// recording it in its metadata, then starting a new segment; on a full
// disk the segment fails after the metadata was written, its file stays,
// and every later deletion failed ("file exists") until the process
// restarted: the member never caught up by itself once its disk had room
// again. raft keeps its own idea of the last index, so a deletion must
// either happen whole or leave the log as it was (raft counts a failed one
// as not done), and the append that follows it must find room.
func TestWALTailTruncationOnFullDisk(t *testing.T) {
	for _, tc := range []struct {
		name string
		// roomSeen: the room check sees the space the engine lacks (the
		// disk was full before); false: it fills up between the two.
		roomSeen bool
	}{{"full before", true}, {"fills after the room check", false}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			meta := &metadb.BoltMetaDB{}
			t.Cleanup(func() { meta.Close() })
			vfs := &fullFS{VFS: walfs.New()}
			open := func() (*raftwal.WAL, error) {
				return raftwal.Open(dir, raftwal.WithMetaStore(meta), raftwal.WithSegmentFiler(segment.NewFiler(dir, vfs)),
					raftwal.WithSegmentSize(64<<10), raftwal.WithLogger(hclog.NewNullLogger()))
			}
			w, err := open()
			if err != nil {
				t.Fatal(err)
			}
			cur := w
			t.Cleanup(func() { cur.Close() })
			room := func() error {
				if tc.roomSeen && vfs.full.Load() {
					return fmt.Errorf("0 MiB free: %w", syscall.ENOSPC)
				}
				return nil
			}
			reopen := func() (raft.LogStore, raft.StableStore, error) {
				if err := cur.Close(); err != nil {
					return nil, nil, err
				}
				w, err := open()
				if err != nil {
					return nil, nil, err
				}
				cur = w
				return w, w, nil
			}
			c := &checked{health: &health{}, log: cur, stable: cur, room: room, tailRoom: room, reopen: reopen}
			entry := func(i, term uint64) *raft.Log {
				return &raft.Log{Index: i, Term: term, Type: raft.LogCommand, Data: []byte(fmt.Sprintf("%d@%d", i, term))}
			}
			for i := uint64(1); i <= 10; i++ {
				if err := c.StoreLogs([]*raft.Log{entry(i, 1)}); err != nil {
					t.Fatal(err)
				}
			}
			// wantLog checks the log holds 1..last, terms as given from 8 on.
			wantLog := func(when string, last, term uint64) {
				t.Helper()
				if got, err := c.LastIndex(); err != nil || got != last {
					t.Fatalf("%s: last index %d (%v), want %d", when, got, err, last)
				}
				for i := uint64(1); i <= last; i++ {
					want := entry(i, 1)
					if i >= 8 {
						want = entry(i, term)
					}
					var l raft.Log
					if err := c.GetLog(i, &l); err != nil || l.Term != want.Term || string(l.Data) != string(want.Data) {
						t.Fatalf("%s: entry %d is %q term %d (%v), want %q term %d", when, i, l.Data, l.Term, err, want.Data, want.Term)
					}
				}
			}

			vfs.full.Store(true)
			truncated := false
			for range 3 { // raft retries the append that needs the deletion
				err := c.DeleteRange(8, 10)
				if err == nil {
					truncated = true
					wantLog("after a deletion that succeeded on a full disk", 7, 0)
					break
				}
				if tc.roomSeen && !errors.Is(err, ErrFull) {
					t.Fatalf("deleting a suffix on a full disk: %v, want ErrFull", err)
				}
				wantLog("after a deletion refused on a full disk", 10, 1)
			}
			if tc.roomSeen {
				if err := c.StoreLogs([]*raft.Log{entry(8, 2)}); err == nil {
					t.Fatalf("append on a full disk succeeded")
				}
			}
			if !truncated {
				wantLog("after an append refused on a full disk", 10, 1)
				// A restart must find the log as raft thinks it is.
				if _, _, err := reopen(); err != nil {
					t.Fatal(err)
				}
				c.log, c.stable = cur, cur
				wantLog("after opening the engine again, still full", 10, 1)
			}

			vfs.full.Store(false)
			if !truncated {
				if err := c.DeleteRange(8, 10); err != nil {
					t.Fatalf("deleting a suffix once the disk has room: %v", err)
				}
			}
			if err := c.StoreLogs([]*raft.Log{entry(8, 2), entry(9, 2)}); err != nil {
				t.Fatalf("append after the deletion, with room: %v", err)
			}
			wantLog("after the new leader's entries", 9, 2)
			if err := c.health.failure(); err != nil {
				t.Fatalf("failure %v after the append succeeded", err)
			}
			if _, _, err := reopen(); err != nil {
				t.Fatal(err)
			}
			c.log, c.stable = cur, cur
			wantLog("after opening the engine again", 9, 2)
		})
	}
}
