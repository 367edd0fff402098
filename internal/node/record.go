package node

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tenure-io/tenure/internal/fsm"
)

// The applied record
//
// Beside the raft log, in the file raft/applied, each node keeps the
// highest log index it has applied and the highest revision its state has
// reached. It is written off the commit path: after applies, at most once
// per recordInterval, and once more on a clean Close. Each write replaces
// the file atomically (temporary file, fsync, rename, fsync of the
// directory), so the file always holds a complete record, which may lag
// the state by up to recordInterval but never runs ahead of it: everything
// applied is in this node's fsynced log or in a snapshot.
//
// On start, a log and snapshots that end before the recorded index mean
// that acknowledged entries were lost, and the node refuses to start
// rather than serve a lower revision (and reissue tokens). Once leader with
// everything applied, a state revision below the recorded one stops it the
// same way. A restore continues above the recorded revision too.

// recordFile is the record's name inside the raft directory.
const recordFile = "applied"

// recordInterval is the shortest time between two writes of the record.
const recordInterval = 100 * time.Millisecond

// recordMagic starts the record's single line.
const recordMagic = "tenure-applied-v1"

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// appliedRecord is what the record holds.
type appliedRecord struct {
	Index    uint64 // highest log index applied
	Revision uint64 // highest revision the state reached
}

func (r appliedRecord) body() string {
	return fmt.Sprintf("%s index %d revision %d", recordMagic, r.Index, r.Revision)
}

// encode is the record's line: its fields and a CRC-32C of them.
func (r appliedRecord) encode() []byte {
	b := r.body()
	return fmt.Appendf(nil, "%s crc32c %08x\n", b, crc32.Checksum([]byte(b), crcTable))
}

// decodeRecord parses a record written by encode.
func decodeRecord(data []byte) (appliedRecord, error) {
	var r appliedRecord
	var magic string
	var sum uint32
	if _, err := fmt.Sscanf(string(data), "%s index %d revision %d crc32c %x\n", &magic, &r.Index, &r.Revision, &sum); err != nil || magic != recordMagic {
		return appliedRecord{}, errors.New("not an applied record")
	}
	if crc32.Checksum([]byte(r.body()), crcTable) != sum || !bytes.Equal(r.encode(), data) {
		return appliedRecord{}, errors.New("checksum mismatch")
	}
	return r, nil
}

// readRecord reads the record at path; found is false if there is none.
func readRecord(path string) (r appliedRecord, found bool, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return appliedRecord{}, false, nil
	}
	if err != nil {
		return appliedRecord{}, false, fmt.Errorf("node: reading %s: %w", path, err)
	}
	r, err = decodeRecord(data)
	if err != nil {
		return appliedRecord{}, false, fmt.Errorf("node: %s is damaged (%v); if the raft log beside it is intact, remove the file and start again", path, err)
	}
	return r, true, nil
}

// writeRecord replaces the record at path atomically and durably.
func writeRecord(path string, r appliedRecord) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	_, err = f.Write(r.encode())
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	err = dir.Sync()
	if cerr := dir.Close(); err == nil {
		err = cerr
	}
	return err
}

// checkLogCoversRecord refuses a log and snapshots that end before the
// recorded applied index.
func checkLogCoversRecord(path string, rec appliedRecord, logs raft.LogStore, snaps raft.SnapshotStore) error {
	last, err := logs.LastIndex()
	if err != nil {
		return fmt.Errorf("node: reading the raft log's last index: %w", err)
	}
	end := last
	metas, err := snaps.List()
	if err != nil {
		return fmt.Errorf("node: listing snapshots: %w", err)
	}
	if len(metas) > 0 { // newest first
		end = max(end, metas[0].Index)
	}
	if rec.Index > end {
		return fmt.Errorf("node: %s records applied index %d (revision %d), but the raft log and snapshots end at index %d: acknowledged entries are lost; restore from a backup onto an empty data directory (tenure snapshot restore --above-revision %d FILE) or rebuild this member from its peers (wipe its data directory and add it again)", path, rec.Index, rec.Revision, end, rec.Revision)
	}
	return nil
}

// recorder keeps the applied record up to date. observe runs on raft's
// apply goroutine and never blocks; run writes.
type recorder struct {
	path string
	log  io.Writer
	kick chan struct{} // capacity 1: a write is due

	// mu guards seen and errMsg.
	mu     sync.Mutex
	seen   appliedRecord // the highest index and revision observed
	errMsg string        // the last write error reported, to report each once
	// written is the record on disk; only run and flush touch it, never
	// at the same time.
	written appliedRecord
}

func newRecorder(path string, rec appliedRecord, log io.Writer) *recorder {
	return &recorder{path: path, log: log, kick: make(chan struct{}, 1), seen: rec, written: rec}
}

// observe notes that index was applied and the state is at revision.
// Either may be 0 (unknown); neither lowers the record.
func (r *recorder) observe(index, revision uint64) {
	r.mu.Lock()
	grew := index > r.seen.Index || revision > r.seen.Revision
	r.seen.Index = max(r.seen.Index, index)
	r.seen.Revision = max(r.seen.Revision, revision)
	r.mu.Unlock()
	if grew {
		select {
		case r.kick <- struct{}{}:
		default:
		}
	}
}

// record returns the highest index and revision observed.
func (r *recorder) record() appliedRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen
}

// run writes the record after applies until quit is closed, at most once
// per recordInterval.
func (r *recorder) run(quit <-chan struct{}) {
	pause := time.NewTimer(0)
	defer pause.Stop()
	for {
		select {
		case <-r.kick:
		case <-quit:
			return
		}
		_ = r.flush()
		pause.Reset(recordInterval)
		select {
		case <-pause.C:
		case <-quit:
			return
		}
	}
}

// flush writes the record if it has grown since the last write.
func (r *recorder) flush() error {
	rec := r.record()
	if rec == r.written {
		return nil
	}
	err := writeRecord(r.path, rec)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		if msg := err.Error(); msg != r.errMsg {
			r.errMsg = msg
			fmt.Fprintf(r.log, "tenure: writing the applied record %s: %v\n", r.path, err)
		}
		return fmt.Errorf("node: writing %s: %w", r.path, err)
	}
	r.errMsg = ""
	r.written = rec
	return nil
}

// recordingFSM is the state machine as raft sees it: every applied batch
// and restore is also observed by the recorder.
type recordingFSM struct {
	*fsm.FSM
	rec *recorder
}

// Apply implements raft.FSM.
func (f recordingFSM) Apply(l *raft.Log) interface{} {
	return f.ApplyBatch([]*raft.Log{l})[0]
}

// ApplyBatch implements raft.BatchingFSM.
func (f recordingFSM) ApplyBatch(logs []*raft.Log) []interface{} {
	out := f.FSM.ApplyBatch(logs)
	if len(out) > 0 {
		if res, ok := out[len(out)-1].(*fsm.Result); ok {
			f.rec.observe(logs[len(logs)-1].Index, res.Revision)
		}
	}
	return out
}

// Restore implements raft.FSM.
func (f recordingFSM) Restore(rc io.ReadCloser) error {
	if err := f.FSM.Restore(rc); err != nil {
		return err
	}
	var rev uint64
	f.FSM.Read(func(s *fsm.State) { rev = s.Revision() })
	f.rec.observe(0, rev)
	return nil
}

// openRecord reads the record at path and checks it against the log and
// snapshots; a missing record is created.
func openRecord(path string, logs raft.LogStore, snaps raft.SnapshotStore, log io.Writer) (*recorder, error) {
	rec, found, err := readRecord(path)
	if err != nil {
		return nil, err
	}
	if found {
		if err := checkLogCoversRecord(path, rec, logs, snaps); err != nil {
			return nil, err
		}
	} else if err := writeRecord(path, rec); err != nil {
		return nil, fmt.Errorf("node: creating %s: %w", path, err)
	}
	return newRecorder(path, rec, log), nil
}

// checkRevisionCoversRecord refuses a state, fully applied on the leader,
// whose revision is below the recorded one.
func (n *Node) checkRevisionCoversRecord() error {
	var rev uint64
	n.fsm.Read(func(s *fsm.State) { rev = s.Revision() })
	if rec := n.rec.record(); rev < rec.Revision {
		return fmt.Errorf("node: the state is at revision %d after applying the whole log, but %s records revision %d: acknowledged entries are lost and tokens would be issued again; restore from a backup onto an empty data directory (tenure snapshot restore --above-revision %d FILE) or rebuild this member from its peers (wipe its data directory and add it again)", rev, n.rec.path, rec.Revision, rec.Revision)
	}
	return nil
}
