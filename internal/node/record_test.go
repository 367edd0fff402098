package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/fsm"
)

func recordPath(dir string) string { return filepath.Join(dir, "raft", recordFile) }

// fill proposes n fenced puts and returns the state's revision after them.
func fill(t *testing.T, n *Node, count int) uint64 {
	t.Helper()
	for i := 0; i < count; i++ {
		if _, err := n.Propose(context.Background(), put(fmt.Sprint("k", i))); err != nil {
			t.Fatal(err)
		}
	}
	var rev uint64
	n.Read(func(s *fsm.State) { rev = s.Revision() })
	return rev
}

func mustRecord(t *testing.T, dir string) appliedRecord {
	t.Helper()
	rec, found, err := readRecord(recordPath(dir))
	if err != nil || !found {
		t.Fatalf("record: found %v, %v", found, err)
	}
	return rec
}

// TestRecordCreatedFlushedAndKept: a new data directory gets a record at
// once; a clean Close leaves it at the applied index and revision; a
// restart keeps it (and never lowers it while it replays the log).
func TestRecordCreatedFlushedAndKept(t *testing.T) {
	if testing.Short() {
		t.Skip("slow; skipped with -short")
	}
	for _, engine := range []string{"bolt", "wal"} {
		t.Run(engine, func(t *testing.T) {
			dir := t.TempDir()
			n := openRunning(t, Config{DataDir: dir, LogStore: engine})
			mustRecord(t, dir) // created on open
			rev := fill(t, n, 50)
			n.Close()
			applied := n.raft.AppliedIndex()
			rec := mustRecord(t, dir)
			if rec.Revision != rev || rec.Index == 0 || rec.Index > applied {
				t.Fatalf("record after Close %+v; state at revision %d, applied index %d", rec, rev, applied)
			}

			n = openRunning(t, Config{DataDir: dir, LogStore: engine})
			if got := mustRecord(t, dir); got.Index < rec.Index || got.Revision < rec.Revision {
				t.Fatalf("record after restart %+v, before %+v", got, rec)
			}
			rev = fill(t, n, 10)
			n.Close()
			if got := mustRecord(t, dir); got.Revision != rev || got.Index <= rec.Index {
				t.Fatalf("record after the second run %+v, state at revision %d, first run's %+v", got, rev, rec)
			}
		})
	}
}

// TestRecordWrittenWhileServing: the record follows the applies without a
// Close, within a few recordIntervals.
func TestRecordWrittenWhileServing(t *testing.T) {
	dir := t.TempDir()
	n := openRunning(t, Config{DataDir: dir})
	rev := fill(t, n, 20)
	deadline := time.Now().Add(10 * time.Second)
	for mustRecord(t, dir).Revision < rev {
		if time.Now().After(deadline) {
			t.Fatalf("record %+v, state at revision %d", mustRecord(t, dir), rev)
		}
		time.Sleep(recordInterval / 4) // polling the file; nothing to wait on
	}
}

func openErr(dir, engine string) error {
	n, err := Open(Config{DataDir: dir, LogStore: engine, LogOutput: io.Discard}, nil)
	if err == nil {
		n.Close()
	}
	return err
}

// TestStartRefusedWhenRecordAheadOfLog: a record naming an index past the
// end of the log and snapshots stops the start with one line naming the
// file, both indexes and what to do; the record is left as it was.
func TestStartRefusedWhenRecordAheadOfLog(t *testing.T) {
	for _, engine := range []string{"bolt", "wal"} {
		t.Run(engine, func(t *testing.T) {
			dir := t.TempDir()
			n := openRunning(t, Config{DataDir: dir, LogStore: engine, SnapshotThreshold: 20})
			fill(t, n, 30)
			if err := n.Snapshot(); err != nil {
				t.Fatal(err)
			}
			fill(t, n, 5)
			n.Close()
			rec := mustRecord(t, dir)
			ahead := appliedRecord{Index: rec.Index + 1000, Revision: rec.Revision + 1000}
			if err := writeRecord(recordPath(dir), ahead); err != nil {
				t.Fatal(err)
			}
			err := openErr(dir, engine)
			if err == nil {
				t.Fatal("a node whose log ends before its record started")
			}
			msg := err.Error()
			for _, want := range []string{recordPath(dir), fmt.Sprint("index ", ahead.Index), fmt.Sprint("end at index ", rec.Index), "restore from a backup", "rebuild this member"} {
				if !strings.Contains(msg, want) {
					t.Errorf("refusal %q does not say %q", msg, want)
				}
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("refusal is more than one line: %q", msg)
			}
			if got := mustRecord(t, dir); got != ahead {
				t.Fatalf("record after a refused start %+v, want %+v", got, ahead)
			}
		})
	}
}

// TestStartRefusedWhenWALTruncated: the raft-wal segment cut short (so its
// last entries are gone) is caught by the record.
func TestStartRefusedWhenWALTruncated(t *testing.T) {
	dir := t.TempDir()
	n := openRunning(t, Config{DataDir: dir, LogStore: "wal"})
	fill(t, n, 200)
	n.Close()
	segs, err := filepath.Glob(filepath.Join(dir, "raft", "wal", "*.wal"))
	if err != nil || len(segs) != 1 {
		t.Fatalf("segments %v %v", segs, err)
	}
	b, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	end := len(b)
	for end > 0 && b[end-1] == 0 { // segments are preallocated with zeros
		end--
	}
	if err := os.Truncate(segs[0], int64(end/2)); err != nil {
		t.Fatal(err)
	}
	err = openErr(dir, "wal")
	if err == nil || !strings.Contains(err.Error(), recordPath(dir)) || !strings.Contains(err.Error(), "acknowledged entries are lost") {
		t.Fatalf("start on a truncated segment: %v", err)
	}
}

// TestLeaderStopsBelowRecordedRevision: a record whose index the log
// covers but whose revision the replayed state does not reach stops the
// node once it leads, before it serves.
func TestLeaderStopsBelowRecordedRevision(t *testing.T) {
	dir := t.TempDir()
	n := openRunning(t, Config{DataDir: dir})
	rev := fill(t, n, 10)
	n.Close()
	rec := mustRecord(t, dir)
	if err := writeRecord(recordPath(dir), appliedRecord{Index: rec.Index, Revision: rev + 5}); err != nil {
		t.Fatal(err)
	}
	n, err := Open(Config{DataDir: dir, LogOutput: io.Discard}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = n.Run(ctx)
	if err == nil || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), fmt.Sprint("revision ", rev+5)) || !strings.Contains(err.Error(), recordPath(dir)) {
		t.Fatalf("Run on a state below the record: %v", err)
	}
	select {
	case <-n.Ready():
		t.Fatal("the node became ready")
	default:
	}
}

// TestDamagedRecordRefused: bad bytes in the record stop the start with a
// line naming the file.
func TestDamagedRecordRefused(t *testing.T) {
	dir := t.TempDir()
	n := openRunning(t, Config{DataDir: dir})
	fill(t, n, 3)
	n.Close()
	b, err := os.ReadFile(recordPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	b[len(recordMagic)+8] ^= 1 // a digit of the index
	if err := os.WriteFile(recordPath(dir), b, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := openErr(dir, ""); err == nil || !strings.Contains(err.Error(), recordPath(dir)+" is damaged") {
		t.Fatalf("start with a damaged record: %v", err)
	}
}

func TestRecordEncoding(t *testing.T) {
	r := appliedRecord{Index: 1234, Revision: 99}
	got, err := decodeRecord(r.encode())
	if err != nil || got != r {
		t.Fatalf("round trip %+v %v", got, err)
	}
	for _, bad := range []string{"", "tenure-applied-v1 index 1 revision 2 crc32c 00000000\n", string(r.encode()) + "x", strings.Replace(string(r.encode()), "99", "98", 1)} {
		if _, err := decodeRecord([]byte(bad)); err == nil {
			t.Errorf("decoded %q", bad)
		}
	}
}
