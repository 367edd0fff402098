package node

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/store"
)

// The applied record
//
// Beside the raft log, in the file raft/applied, each node keeps the
// highest log index it has applied and the highest revision its state has
// reached. It is written off the commit path: after applies, at most once
// per recordInterval, and once more on a clean Close, which also records
// where the log ended (Last). Each write replaces the file atomically
// (temporary file, fsync, rename, fsync of the directory), so the file
// always holds a complete record, which may lag the state by up to
// recordInterval but never runs ahead of it: everything applied is in this
// node's fsynced log or in a snapshot.
//
// On start, a log and snapshots that end before the recorded index, or
// before where they ended at the last clean Close, mean that entries were
// lost, and the node refuses to start rather than serve a lower revision
// (and reissue tokens). The end recorded at Close is cleared once the
// start's checks pass, since a running follower's log may legitimately
// lose entries that were never committed. Once leader with everything
// applied, a state revision below the recorded one stops it the same way.
// A restore continues above the recorded revision too.
//
// A data directory whose record was created once notes that in raft's
// stable store, so a record that goes missing later is refused too; a
// directory from a version without the record gets one. An operator who
// knows the log and snapshots are intact can have the record written anew
// by creating the file raft/applied.reset.

// recordFile is the record's name inside the raft directory.
const recordFile = "applied"

// recordInterval is the shortest time between two writes of the record.
const recordInterval = 100 * time.Millisecond

// recordMagic starts the record's single line; recordMagicV1 started it
// before the record held Last.
const (
	recordMagic   = "tenure-applied-v2"
	recordMagicV1 = "tenure-applied-v1"
)

// resetFile, beside the record, asks for a new record (see above).
const resetFile = "applied.reset"

// recordKey, in raft's stable store, says that this data directory has had
// a record.
var recordKey = []byte("TenureAppliedRecord")

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// appliedRecord is what the record holds.
type appliedRecord struct {
	Index    uint64 // highest log index applied
	Revision uint64 // highest revision the state reached
	// Last is where the log and snapshots ended at a clean Close; 0 while
	// the node runs (or after a crash).
	Last uint64
}

func (r appliedRecord) body() string {
	return fmt.Sprintf("%s index %d revision %d last %d", recordMagic, r.Index, r.Revision, r.Last)
}

// encode is the record's line: its fields and a CRC-32C of them.
func (r appliedRecord) encode() []byte {
	b := r.body()
	return fmt.Appendf(nil, "%s crc32c %08x\n", b, crc32.Checksum([]byte(b), crcTable))
}

// decodeRecord parses a record written by encode (or by the version
// before Last).
func decodeRecord(data []byte) (appliedRecord, error) {
	var r appliedRecord
	var magic string
	var sum uint32
	if _, err := fmt.Sscanf(string(data), "%s index %d revision %d last %d crc32c %x\n", &magic, &r.Index, &r.Revision, &r.Last, &sum); err == nil && magic == recordMagic {
		if crc32.Checksum([]byte(r.body()), crcTable) != sum || !bytes.Equal(r.encode(), data) {
			return appliedRecord{}, errors.New("checksum mismatch")
		}
		return r, nil
	}
	r = appliedRecord{}
	if _, err := fmt.Sscanf(string(data), "%s index %d revision %d crc32c %x\n", &magic, &r.Index, &r.Revision, &sum); err != nil || magic != recordMagicV1 {
		return appliedRecord{}, errors.New("not an applied record")
	}
	body := fmt.Sprintf("%s index %d revision %d", recordMagicV1, r.Index, r.Revision)
	if crc32.Checksum([]byte(body), crcTable) != sum || !bytes.Equal(fmt.Appendf(nil, "%s crc32c %08x\n", body, sum), data) {
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
		return appliedRecord{}, false, fmt.Errorf("node: %s is damaged (%v); %s", path, err, recordRemedy(path))
	}
	return r, true, nil
}

// writeRecord replaces the record at path atomically and durably.
func writeRecord(path string, r appliedRecord) error { return writeFileAtomic(path, r.encode()) }

// recordRemedy is what to do about a damaged or missing record.
func recordRemedy(path string) string {
	return fmt.Sprintf("if the raft log and snapshots beside it are intact, create the empty file %s and start again to write a new record; otherwise %s", filepath.Join(filepath.Dir(path), resetFile), store.Remedy)
}

// logEnd is the last index the log and snapshots hold.
func logEnd(logs raft.LogStore, snaps raft.SnapshotStore) (uint64, error) {
	last, err := logs.LastIndex()
	if err != nil {
		return 0, fmt.Errorf("node: reading the raft log's last index: %w", err)
	}
	metas, err := snaps.List()
	if err != nil {
		return 0, fmt.Errorf("node: listing snapshots: %w", err)
	}
	if len(metas) > 0 { // newest first
		last = max(last, metas[0].Index)
	}
	return last, nil
}

// checkLogCoversRecord refuses a log and snapshots that end before the
// recorded applied index, or before they ended at the last clean Close.
func checkLogCoversRecord(path string, rec appliedRecord, logs raft.LogStore, snaps raft.SnapshotStore) error {
	end, err := logEnd(logs, snaps)
	if err != nil {
		return err
	}
	remedy := fmt.Sprintf("restore from a backup onto an empty data directory (tenure snapshot restore --above-revision %d --from-cluster ID --replace-keys FILE, ID being the cluster id the restore names) or rebuild this member from its peers (wipe its data directory, start it with serve --join, then run tenure member rebuild ID PEER_ADDR)", rec.Revision)
	if rec.Index > end {
		return fmt.Errorf("node: %s records applied index %d (revision %d), but the raft log and snapshots end at index %d: acknowledged entries are lost; %s", path, rec.Index, rec.Revision, end, remedy)
	}
	if rec.Last > end {
		return fmt.Errorf("node: %s records that the raft log ended at index %d when the node last stopped, but it now ends at index %d: acknowledged entries are lost (the log's tail was cut or damaged); %s", path, rec.Last, end, remedy)
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
	// written is the record on disk; only startRecord, run and flush
	// touch it, never at the same time.
	written appliedRecord
	// create: there is no record on disk yet (or a new one was asked for).
	create bool
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
	rec   *recorder
	ident *identity
	// applied is the index of the last entry the state machine applied
	// (appliedUnknown after a restore at run time, until the next entry:
	// see Node.caughtUp).
	applied *atomic.Uint64
	logger  *slog.Logger
	// logBytes counts the bytes of log stored since the last snapshot
	// (see Node.logStored); a snapshot resets it.
	logBytes *atomic.Int64
}

// Snapshot implements raft.FSM.
func (f recordingFSM) Snapshot() (raft.FSMSnapshot, error) {
	f.logBytes.Store(0)
	return f.FSM.Snapshot()
}

// Apply implements raft.FSM.
func (f recordingFSM) Apply(l *raft.Log) interface{} {
	return f.ApplyBatch([]*raft.Log{l})[0]
}

// ApplyBatch implements raft.BatchingFSM.
func (f recordingFSM) ApplyBatch(logs []*raft.Log) []interface{} {
	out := f.FSM.ApplyBatch(logs)
	if len(logs) > 0 {
		f.applied.Store(logs[len(logs)-1].Index)
	}
	f.ident.observe(f.FSM.Security())
	// The last entry applied: none from a corrupt one on (see fsm.FSM.Err).
	for i := len(out) - 1; i >= 0; i-- {
		if res, ok := out[i].(*fsm.Result); ok && !errors.Is(res.Err, fsm.ErrCorrupt) {
			f.rec.observe(logs[i].Index, res.Revision)
			break
		}
	}
	return out
}

// Restore implements raft.FSM.
func (f recordingFSM) Restore(rc io.ReadCloser) error {
	start := time.Now()
	if err := f.FSM.Restore(rc); err != nil {
		return err
	}
	f.applied.Store(appliedUnknown) // the snapshot's index is raft's to know
	var items int
	f.FSM.Read(func(s *fsm.State) { items = s.QueueItems() })
	f.logger.Info("snapshot restored", "ms", time.Since(start).Milliseconds(), "queue_items", items)
	var rev uint64
	f.FSM.Read(func(s *fsm.State) { rev = s.Revision() })
	f.rec.observe(0, rev)
	f.ident.observe(f.FSM.Security())
	return nil
}

// openRecord reads the record at path and checks it against the log and
// snapshots; it writes nothing (see startRecord). A missing record is an
// error if the stable store says there was one.
func openRecord(path string, logs raft.LogStore, stable raft.StableStore, snaps raft.SnapshotStore, log io.Writer) (*recorder, error) {
	if _, err := os.Stat(filepath.Join(filepath.Dir(path), resetFile)); err == nil {
		r := newRecorder(path, appliedRecord{}, log)
		r.create = true
		return r, nil
	}
	rec, found, err := readRecord(path)
	if err != nil {
		return nil, err
	}
	if !found {
		had, err := stable.GetUint64(recordKey)
		if err != nil {
			return nil, fmt.Errorf("node: reading raft's stable store: %w", err)
		}
		if had != 0 {
			return nil, fmt.Errorf("node: %s is missing, though this data directory had one: lost entries cannot be detected; %s", path, recordRemedy(path))
		}
	}
	if err := checkLogCoversRecord(path, rec, logs, snaps); err != nil {
		return nil, err
	}
	r := newRecorder(path, rec, log)
	r.create = !found
	return r, nil
}

// startRecord writes the record once the start's checks have passed: it
// creates a missing one (and notes in the stable store that there is one),
// writes a new one if raft/applied.reset asked for it, and clears the end
// of the log recorded at the last Close.
func (r *recorder) startRecord(stable raft.StableStore) error {
	r.mu.Lock()
	clear := r.seen.Last != 0
	r.seen.Last = 0
	rec := r.seen
	r.mu.Unlock()
	switch {
	case r.create:
		if err := writeRecord(r.path, rec); err != nil {
			return fmt.Errorf("node: creating %s: %w", r.path, err)
		}
		if err := stable.SetUint64(recordKey, 1); err != nil {
			return fmt.Errorf("node: writing raft's stable store: %w", err)
		}
		reset := filepath.Join(filepath.Dir(r.path), resetFile)
		if err := os.Remove(reset); err == nil {
			fmt.Fprintf(r.log, "tenure: wrote a new applied record %s, as %s asked\n", r.path, reset)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("node: removing %s: %w", reset, err)
		}
	case clear:
		// Best effort: should this fail (a full disk), the next write
		// after an apply clears it.
		if err := writeRecord(r.path, rec); err != nil {
			fmt.Fprintf(r.log, "tenure: writing the applied record %s: %v\n", r.path, err)
			return nil
		}
	default:
		return nil
	}
	r.written = rec
	return nil
}

// flushClean writes the record at a clean Close, with where the log and
// snapshots end.
func (r *recorder) flushClean(logs raft.LogStore, snaps raft.SnapshotStore) error {
	end, err := logEnd(logs, snaps)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.seen.Last = end
	r.mu.Unlock()
	return r.flush()
}

// checkRevisionCoversRecord refuses a state, fully applied on the leader,
// whose revision is below the recorded one.
func (n *Node) checkRevisionCoversRecord() error {
	var rev uint64
	n.fsm.Read(func(s *fsm.State) { rev = s.Revision() })
	if rec := n.rec.record(); rev < rec.Revision {
		return fmt.Errorf("node: the state is at revision %d after applying the whole log, but %s records revision %d: acknowledged entries are lost and tokens would be issued again; restore from a backup onto an empty data directory (tenure snapshot restore --above-revision %d --from-cluster ID --replace-keys FILE, ID being the cluster id the restore names) or rebuild this member from its peers (wipe its data directory, start it with serve --join, then run tenure member rebuild ID PEER_ADDR)", rev, n.rec.path, rec.Revision, rec.Revision)
	}
	return nil
}
