package node

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"hash/crc64"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/hashicorp/raft"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/store"
	"github.com/tenure-io/tenure/internal/version"
)

// Storage integrity
//
// Before raft starts, Open checks the data directory so that damage stops
// the start with one line (naming the file, the index and what to do)
// instead of a panic inside raft, a silent fall-back to an older snapshot,
// or a state that quietly lacks entries:
//
//   - every snapshot directory has its meta.json, and the newest snapshot's
//     state file has the size it records and matches the checksum in it
//     (raft would otherwise skip to an older snapshot, whose log may be
//     gone); the checksum is checked as the state file is restored, in
//     the same pass (startSnapshots);
//   - the log and the newest snapshot leave no gap: the log starts at or
//     before the entry after the snapshot;
//   - every log entry from the first to the last reads back, carries its
//     own index, has a known type, and its command passes its checksum
//     (entries written before the checksum existed must decode).
//
// The state machine checks every entry again as it applies it, and the
// applied record (record.go) catches a log that ends too early. Once
// serving, an entry or snapshot that fails is never applied: the state
// machine stops (fsm.FSM.Err) and Run returns the error. A node also
// refuses to store a command entry that fails its checksum (checkedAppends),
// so that a leader whose disk damaged an old entry cannot hand it to a
// follower that is catching up: the follower stays behind, and says why.

// snapshotsDir is where raft's file snapshot store keeps its snapshots.
func snapshotsDir(dataDir string) string { return filepath.Join(dataDir, "snapshots", "snapshots") }

// checkSnapshots checks the snapshot directories and the newest snapshot's
// state file, and returns the newest snapshot's metadata (nil if none).
// The state file's checksum is checked as raft restores it (see
// startSnapshots).
func checkSnapshots(dataDir string, snaps *raft.FileSnapshotStore) (*raft.SnapshotMeta, error) {
	dir := snapshotsDir(dataDir)
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("node: reading %s: %w", dir, err)
	}
	for _, e := range entries {
		if !e.IsDir() || strings.HasSuffix(e.Name(), ".tmp") { // .tmp: unfinished, raft ignores it
			continue
		}
		// raft skips a snapshot whose meta.json it cannot read, and falls
		// back to an older one (or none) whose log may be gone.
		meta := filepath.Join(dir, e.Name(), "meta.json")
		b, err := os.ReadFile(meta)
		var m raft.SnapshotMeta
		if err == nil {
			err = json.Unmarshal(b, &m)
		}
		if err != nil {
			return nil, fmt.Errorf("node: snapshot %s has no readable meta.json (%v): the snapshot is damaged; %s", filepath.Join(dir, e.Name()), err, store.Remedy)
		}
	}
	metas, err := snaps.List()
	if err != nil {
		return nil, fmt.Errorf("node: listing snapshots in %s: %w", dir, err)
	}
	if len(metas) == 0 {
		return nil, nil
	}
	newest := metas[0]
	state := filepath.Join(dir, newest.ID, "state.bin")
	fi, err := os.Stat(state)
	if err == nil && fi.Size() != newest.Size {
		err = fmt.Errorf("its state file is %d bytes, its meta.json says %d", fi.Size(), newest.Size)
	}
	if err != nil {
		return nil, fmt.Errorf("node: snapshot %s (index %d) is damaged: %v; %s", filepath.Join(dir, newest.ID), newest.Index, err, store.Remedy)
	}
	return newest, nil
}

// startSnapshots is the snapshot store raft is given. raft's file store
// reads a snapshot's whole state file to check its CRC-64 before it hands
// out a reader, and the state machine then reads it again; for a large
// state that is seconds of a start. For the restore of the newest snapshot
// at the start, startSnapshots hands out instead a reader that checks the
// CRC-64 as the state machine reads: one pass. A mismatch ends the stream
// with an error where it would end, so the state machine, which builds its
// state only once it has read everything (fsm.ReadSnapshot), never takes
// a damaged snapshot. Every other Open goes to raft's store.
type startSnapshots struct {
	*raft.FileSnapshotStore
	dir string // snapshotsDir

	// mu guards newest and stream.
	mu     sync.Mutex
	newest *raft.SnapshotMeta // opened once this way, then nil
	stream *checkedState
}

// errSnapshotCRC: the state file of a snapshot does not match its
// checksum (raft's store says "CRC mismatch" too).
var errSnapshotCRC = errors.New("the state file fails its checksum (CRC mismatch)")

// Open implements raft.SnapshotStore.
func (s *startSnapshots) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.newest == nil || id != s.newest.ID {
		return s.FileSnapshotStore.Open(id)
	}
	meta := s.newest
	s.newest = nil
	b, err := os.ReadFile(filepath.Join(s.dir, id, "meta.json"))
	if err != nil {
		return nil, nil, err
	}
	var m struct{ CRC []byte }
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, nil, err
	}
	fh, err := os.Open(filepath.Join(s.dir, id, "state.bin"))
	if err != nil {
		return nil, nil, err
	}
	s.stream = &checkedState{fh: fh, hash: crc64.New(crc64.MakeTable(crc64.ECMA)), want: m.CRC}
	return meta, s.stream, nil
}

// crcMismatch reports whether the state file handed out for the newest
// snapshot fails its checksum (read anew if the restore stopped before
// its end): the damage to report when its restore failed.
func (s *startSnapshots) crcMismatch() bool {
	s.mu.Lock()
	st := s.stream
	s.mu.Unlock()
	if st == nil {
		return false
	}
	if st.err != nil {
		return errors.Is(st.err, errSnapshotCRC)
	}
	fh, err := os.Open(st.fh.Name())
	if err != nil {
		return false
	}
	defer fh.Close()
	h := crc64.New(crc64.MakeTable(crc64.ECMA))
	if _, err := io.Copy(h, fh); err != nil {
		return false
	}
	return !bytes.Equal(h.Sum(nil), st.want)
}

// checkedState reads a state file and checks its CRC-64 at its end. It
// does not buffer: its reader (fsm.ReadSnapshot) does.
type checkedState struct {
	fh   *os.File
	hash hash.Hash64
	want []byte
	err  error // the end: io.EOF or errSnapshotCRC
}

func (c *checkedState) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.fh.Read(p)
	c.hash.Write(p[:n])
	if err == io.EOF {
		c.err = io.EOF
		if !bytes.Equal(c.hash.Sum(nil), c.want) {
			c.err = errSnapshotCRC
		}
		err = c.err
	}
	return n, err
}

func (c *checkedState) Close() error { return c.fh.Close() }

// checkLog reads every entry of the log and checks it (see above); snap is
// the newest snapshot's index (0: none).
func checkLog(stores *store.Stores, snap uint64) (err error) {
	first, err := stores.Log.FirstIndex()
	if err != nil {
		return fmt.Errorf("node: reading the first index of the raft log in %s: %v; %s", stores.Dir, err, store.Remedy)
	}
	last, err := stores.Log.LastIndex()
	if err != nil {
		return fmt.Errorf("node: reading the last index of the raft log in %s: %v; %s", stores.Dir, err, store.Remedy)
	}
	if last == 0 {
		return nil
	}
	if first > snap+1 {
		return fmt.Errorf("node: the raft log in %s starts at index %d, but the newest snapshot ends at index %d: entries %d to %d are missing (a snapshot was lost?); %s", stores.Dir, first, snap, snap+1, first-1, store.Remedy)
	}
	index := first
	// A damaged bolt file can make bbolt panic rather than fail.
	defer func() {
		if p := recover(); p != nil {
			err = entryError(stores, index, fmt.Sprintf("cannot be read (%v)", p))
		}
	}()
	var l raft.Log
	framed := false
	for ; index <= last; index++ {
		l = raft.Log{}
		if err := stores.Log.GetLog(index, &l); err != nil {
			if errors.Is(err, raft.ErrLogNotFound) && index <= snap {
				// raft-boltdb leaves a gap where a restored snapshot sits;
				// entries a snapshot covers are never applied again.
				continue
			}
			return entryError(stores, index, fmt.Sprintf("cannot be read (%v)", err))
		}
		if l.Index != index {
			return entryError(stores, index, fmt.Sprintf("holds entry %d", l.Index))
		}
		switch l.Type {
		case raft.LogCommand:
			if err := fsm.CheckEntry(l.Data); err != nil {
				return entryError(stores, index, err.Error())
			}
			if v := fsm.EntryVersion(l.Data); v > version.Protocol {
				// Written by a newer release: a downgrade below the
				// cluster version, refused before raft reads the log.
				return fmt.Errorf("node: %v (%s)", &fsm.FormatError{What: "raft log entry", Index: index, Version: v}, stores.FileOf(index))
			}
			if fsm.Framed(l.Data) {
				framed = true
				break
			}
			if framed {
				return entryError(stores, index, "is not framed, yet follows framed entries (its first byte is damaged)")
			}
			if err := fsm.DecodeEntry(l.Data, new(fsmpb.Command)); err != nil {
				return entryError(stores, index, err.Error())
			}
		case raft.LogNoop, raft.LogBarrier, raft.LogConfiguration, raft.LogAddPeerDeprecated, raft.LogRemovePeerDeprecated:
			if fsm.Framed(l.Data) && fsm.CheckEntry(l.Data) == nil {
				return entryError(stores, index, fmt.Sprintf("holds a command but says it is a %v (its type is damaged)", l.Type))
			}
		default:
			return entryError(stores, index, fmt.Sprintf("has an unknown type %d (it is damaged)", l.Type))
		}
	}
	return nil
}

// entryError is the one line for a damaged log entry.
func entryError(stores *store.Stores, index uint64, what string) error {
	return fmt.Errorf("node: raft log entry %d in %s %s: the log is damaged; %s", index, stores.FileOf(index), what, store.Remedy)
}

// checkedAppends is the log as raft sees it: an append of a command entry
// that fails its checksum is refused before it is stored. stored, if set,
// is told the bytes of the entries stored (see Node.logStored).
type checkedAppends struct {
	raft.LogStore
	stored func(bytes int)
	// before, if set, is called before each append (a fault switch of
	// the tenurefault build, Faults.BeforeAppend).
	before func()
}

func (c checkedAppends) StoreLog(l *raft.Log) error { return c.StoreLogs([]*raft.Log{l}) }

func (c checkedAppends) StoreLogs(logs []*raft.Log) error {
	if c.before != nil {
		c.before()
	}
	for _, l := range logs {
		if l.Type != raft.LogCommand {
			continue
		}
		if err := fsm.CheckEntry(l.Data); err != nil {
			return fmt.Errorf("node: refusing to store log entry %d, which %s (damaged on the leader's disk or on the way?)", l.Index, err)
		}
	}
	if err := c.LogStore.StoreLogs(logs); err != nil {
		return err
	}
	if c.stored != nil {
		n := 0
		for _, l := range logs {
			n += len(l.Data)
		}
		c.stored(n)
	}
	return nil
}

// IsMonotonic implements raft.MonotonicLogStore as the store does.
func (c checkedAppends) IsMonotonic() bool {
	m, ok := c.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}
