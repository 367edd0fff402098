package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc64"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/store"
)

// segments returns the raft-wal segment files under dir, oldest first.
func segments(t *testing.T, dir string) []string {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dir, "raft", "wal", "*.wal"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("segments %v %v", segs, err)
	}
	return segs
}

// written is how many bytes of a preallocated segment hold data.
func written(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	end := len(b)
	for end > 0 && b[end-1] == 0 {
		end--
	}
	return end
}

// rewrite applies fn to the file's bytes.
func rewrite(t *testing.T, path string, fn func([]byte) []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, fn(b), 0o600); err != nil {
		t.Fatal(err)
	}
}

// putValue is a put whose value is size bytes.
func putValue(key string, size int) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: key, Value: bytes.Repeat([]byte{'v'}, size)}}}
}

// filled is a closed data directory with entries of every kind a node
// writes, mostly values, on engine.
func filled(t *testing.T, engine string, cfg Config) string {
	t.Helper()
	dir := t.TempDir()
	cfg.DataDir, cfg.LogStore = dir, engine
	n := openRunning(t, cfg)
	for i := 0; i < 200; i++ {
		if _, err := n.Propose(context.Background(), putValue(fmt.Sprint("k", i), 2000)); err != nil {
			t.Fatal(err)
		}
	}
	n.Close()
	return dir
}

// refused asserts that the start fails with one line that says each of
// wants.
func refused(t *testing.T, dir, engine string, wants ...string) {
	t.Helper()
	err := openErr(dir, engine)
	if err == nil {
		t.Fatal("the node started")
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") {
		t.Errorf("refusal is more than one line: %q", msg)
	}
	for _, want := range wants {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal %q does not say %q", msg, want)
		}
	}
}

// TestStartRefusedOnFlippedBytes: 16 bytes flipped in the middle of the
// log's data (a raft-wal segment, or the bolt file) stop the start with one
// line that names the file and the entry, or the lost entries; the node
// never starts on a log whose entries are damaged.
func TestStartRefusedOnFlippedBytes(t *testing.T) {
	if testing.Short() {
		t.Skip("slow; skipped with -short")
	}
	for _, engine := range []string{"wal", "bolt"} {
		t.Run(engine, func(t *testing.T) {
			dir := filled(t, engine, Config{})
			file := filepath.Join(dir, "raft", "raft.db")
			end := 0
			if engine == "wal" {
				file = segments(t, dir)[0]
				end = written(t, file)
			}
			rewrite(t, file, func(b []byte) []byte {
				if end == 0 {
					end = len(b)
				}
				for i := end / 2; i < end/2+16; i++ {
					b[i] ^= 0xa5
				}
				return b
			})
			err := openErr(dir, engine)
			if err == nil {
				t.Fatal("the node started on flipped bytes")
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") || !(strings.Contains(msg, file) || strings.Contains(msg, recordPath(dir))) || !strings.Contains(msg, "rebuild this member") {
				t.Fatalf("refusal %q: want one line naming %s (or the record) and what to do", msg, file)
			}
		})
	}
}

// TestCorruptEntryNamesFileAndIndex: an entry whose command bytes changed
// (the frame around it intact) is named, with its index and segment, and
// raft-wal's own framing does not notice: only the checksum does.
func TestCorruptEntryNamesFileAndIndex(t *testing.T) {
	dir := filled(t, "wal", Config{})
	seg := segments(t, dir)[0]
	rewrite(t, seg, func(b []byte) []byte {
		// Entry k100's value: a run of 'v' in the middle of the segment.
		i := bytes.Index(b, []byte("k100"))
		if i < 0 {
			t.Fatal("entry k100 not found")
		}
		b[i+100] ^= 0x01
		return b
	})
	refused(t, dir, "wal", seg, "fails its checksum", "raft log entry ", "rebuild this member")
}

// zeroTail zeroes the last 100 bytes written to the wal segment: the last
// entry is gone, and raft-wal takes the damage for a torn write.
func zeroTail(t *testing.T, dir string) {
	t.Helper()
	seg := segments(t, dir)[0]
	end := written(t, seg)
	rewrite(t, seg, func(b []byte) []byte {
		copy(b[end-100:end], make([]byte, 100))
		return b
	})
}

// TestStartRefusedOnZeroedTail: the last 100 bytes of the log zeroed after
// a clean stop are caught: a clean Close records the exact applied index.
func TestStartRefusedOnZeroedTail(t *testing.T) {
	dir := filled(t, "wal", Config{})
	zeroTail(t, dir)
	refused(t, dir, "wal", recordPath(dir), "acknowledged entries are lost")
}

// TestStartRefusedBelowLogEndAtClose: the log's end recorded at Close
// catches a lost tail that the applied index does not cover (entries
// stored but not yet applied, as on a follower, or a record that lagged);
// once the start's checks pass, it is cleared, since a running follower
// may drop entries that were never committed.
func TestStartRefusedBelowLogEndAtClose(t *testing.T) {
	if testing.Short() {
		t.Skip("slow; skipped with -short")
	}
	dir := filled(t, "wal", Config{})
	rec := mustRecord(t, dir)
	if rec.Last < rec.Index || rec.Last == 0 {
		t.Fatalf("record after Close %+v: no log end", rec)
	}
	lagging := appliedRecord{Index: rec.Index - 5, Revision: rec.Revision - 5, Last: rec.Last}
	if err := writeRecord(recordPath(dir), lagging); err != nil {
		t.Fatal(err)
	}
	zeroTail(t, dir)
	refused(t, dir, "wal", recordPath(dir), fmt.Sprint("ended at index ", rec.Last), "acknowledged entries are lost")

	// Without the damage, the start clears it.
	dir = filled(t, "wal", Config{})
	n := openRunning(t, Config{DataDir: dir, LogStore: "wal"})
	if got := mustRecord(t, dir); got.Last != 0 {
		t.Fatalf("record while running %+v, want no log end", got)
	}
	n.Close()
}

// TestStartRefusedOnTruncatedSegment: a segment cut to a fraction keeps
// being caught, whether the loss is older than the record's lag or not.
func TestStartRefusedOnTruncatedSegment(t *testing.T) {
	dir := filled(t, "wal", Config{})
	seg := segments(t, dir)[0]
	if err := os.Truncate(seg, int64(written(t, seg)*3/4)); err != nil {
		t.Fatal(err)
	}
	refused(t, dir, "wal", recordPath(dir), "acknowledged entries are lost")
}

// TestStartRefusedWithoutWALMeta: raft-wal's metadata database deleted
// (raft-wal alone: "file exists").
func TestStartRefusedWithoutWALMeta(t *testing.T) {
	dir := filled(t, "wal", Config{})
	meta := filepath.Join(dir, "raft", "wal", "wal-meta.db")
	if err := os.Remove(meta); err != nil {
		t.Fatal(err)
	}
	refused(t, dir, "wal", meta+" is missing", "rebuild this member")
}

// snapshotted is a closed data directory with a snapshot and entries
// after it, and the snapshot's directory.
func snapshotted(t *testing.T, engine string) (dir, snap string) {
	t.Helper()
	dir = t.TempDir()
	n := openRunning(t, Config{DataDir: dir, LogStore: engine})
	fill(t, n, 30)
	if err := n.Snapshot(); err != nil {
		t.Fatal(err)
	}
	fill(t, n, 5)
	n.Close()
	snaps, err := filepath.Glob(filepath.Join(snapshotsDir(dir), "*"))
	if err != nil || len(snaps) != 1 {
		t.Fatalf("snapshots %v %v", snaps, err)
	}
	return dir, snaps[0]
}

// TestStartRefusedWithoutSnapshotMeta: a snapshot's meta.json deleted
// (raft skips the snapshot; with its log compacted, raft then panics "log
// not found").
func TestStartRefusedWithoutSnapshotMeta(t *testing.T) {
	for _, engine := range []string{"bolt", "wal"} {
		t.Run(engine, func(t *testing.T) {
			dir, snap := snapshotted(t, engine)
			if err := os.Remove(filepath.Join(snap, "meta.json")); err != nil {
				t.Fatal(err)
			}
			refused(t, dir, engine, snap, "meta.json", "rebuild this member")
		})
	}
}

// TestStartRefusedOnLogGap: the newest snapshot gone, with the log before
// it compacted away: the entries in between are missing (raft alone
// panics "log not found").
func TestStartRefusedOnLogGap(t *testing.T) {
	for _, engine := range []string{"bolt", "wal"} {
		t.Run(engine, func(t *testing.T) {
			dir, snap := snapshotted(t, engine)
			var meta raft.SnapshotMeta
			b, err := os.ReadFile(filepath.Join(snap, "meta.json"))
			if err == nil {
				err = json.Unmarshal(b, &meta)
			}
			if err != nil {
				t.Fatal(err)
			}
			// What raft's compaction does once the snapshot is taken, had
			// more than TrailingLogs entries preceded it.
			s, err := store.Open(filepath.Join(dir, "raft"), engine, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			first, _ := s.Log.FirstIndex()
			if err := s.Log.DeleteRange(first, meta.Index-1); err != nil {
				t.Fatal(err)
			}
			s.Close()
			if err := os.RemoveAll(snap); err != nil {
				t.Fatal(err)
			}
			refused(t, dir, engine, fmt.Sprint("starts at index ", meta.Index), "are missing", "rebuild this member")
		})
	}
}

// TestStartRefusedOnDamagedSnapshot: the newest snapshot's state file
// changed (raft would skip to an older snapshot, or none), or rewritten
// with a matching checksum but bytes that do not decode (raft would do the
// same after the state machine refused it).
func TestStartRefusedOnDamagedSnapshot(t *testing.T) {
	t.Run("checksum", func(t *testing.T) {
		dir, snap := snapshotted(t, "bolt")
		rewrite(t, filepath.Join(snap, "state.bin"), func(b []byte) []byte { b[len(b)/2] ^= 1; return b })
		refused(t, dir, "bolt", snap, "CRC mismatch", "rebuild this member")
	})
	t.Run("decode", func(t *testing.T) {
		dir, snap := snapshotted(t, "bolt")
		undecodable(t, snap)
		refused(t, dir, "bolt", snap, "does not decode", "rebuild this member")
	})
}

// undecodable rewrites snapshot snap's state with bytes that do not
// decode, and its checksum to match: only raft's restore at start, after
// the data directory's checks, finds it damaged.
func undecodable(t *testing.T, snap string) {
	t.Helper()
	garbage := []byte{0xff, 0xff, 0xff, 0xff}
	if err := os.WriteFile(filepath.Join(snap, "state.bin"), garbage, 0o600); err != nil {
		t.Fatal(err)
	}
	metaPath := filepath.Join(snap, "meta.json")
	var meta map[string]any
	b, _ := os.ReadFile(metaPath)
	if err := json.Unmarshal(b, &meta); err != nil {
		t.Fatal(err)
	}
	h := crc64.New(crc64.MakeTable(crc64.ECMA))
	h.Write(garbage)
	meta["CRC"], meta["Size"] = h.Sum(nil), len(garbage)
	b, _ = json.Marshal(meta)
	if err := os.WriteFile(metaPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestMissingRecordRefusedAndReset: the applied record deleted from a data
// directory that had one is refused (lost entries could not be detected);
// the file raft/applied.reset has a new record written, once.
func TestMissingRecordRefusedAndReset(t *testing.T) {
	dir := filled(t, "bolt", Config{})
	if err := os.Remove(recordPath(dir)); err != nil {
		t.Fatal(err)
	}
	refused(t, dir, "", recordPath(dir)+" is missing", resetFile)
	reset := filepath.Join(dir, "raft", resetFile)
	if err := os.WriteFile(reset, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := openErr(dir, ""); err != nil {
		t.Fatalf("start with %s: %v", resetFile, err)
	}
	if _, err := os.Stat(reset); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s left behind: %v", resetFile, err)
	}
	mustRecord(t, dir)
}

// TestCorruptEntryWhileServingStopsRun: an entry that reaches the state
// machine corrupt (read back damaged after the start's check) is not
// applied: Run returns one line naming the entry and what to do, the state
// keeps its revision, and proposals are no longer answered as applied.
func TestCorruptEntryWhileServingStopsRun(t *testing.T) {
	dir := t.TempDir()
	n, err := Open(Config{DataDir: dir, LogOutput: io.Discard}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	<-n.Ready()
	rev := fill(t, n, 3)
	bad, _ := fsm.EncodeEntry(put("x"), 0)
	bad[len(bad)-1] ^= 0xff
	// As raft hands the state machine an entry it read back.
	out := recordingFSM{n.fsm, n.rec, n.ident, &n.fsmApplied, n.cfg.Logger, &n.logBytes}.ApplyBatch([]*raft.Log{{Index: n.raft.LastIndex() + 1, Type: raft.LogCommand, Data: bad}})
	if r := fsm.TakeResult(out[0]); !errors.Is(r.Err, fsm.ErrCorrupt) {
		t.Fatalf("the corrupt entry's result: %+v", r)
	}
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "fails its checksum") || !strings.Contains(err.Error(), "raft log entry") || strings.Contains(err.Error(), "\n") {
			t.Fatalf("Run returned %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Run did not stop on a corrupt entry")
	}
	var now uint64
	n.Read(func(s *fsm.State) { now = s.Revision() })
	if now != rev {
		t.Fatalf("revision %d after the corrupt entry, want %d", now, rev)
	}
	if _, err := n.Propose(context.Background(), put("y")); !errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("a proposal after the stop: %v", err)
	}
}

// TestDamagedEntryNotStored: a command entry that fails its checksum is
// refused before it is stored (a follower catching up from a leader whose
// disk damaged it stays behind rather than store it).
func TestDamagedEntryNotStored(t *testing.T) {
	mem := raft.NewInmemStore()
	logs := checkedAppends{LogStore: mem}
	good, _ := fsm.EncodeEntry(put("x"), 0)
	bad := append([]byte(nil), good...)
	bad[len(bad)-1] ^= 1
	err := logs.StoreLogs([]*raft.Log{{Index: 1, Type: raft.LogCommand, Data: good}, {Index: 2, Type: raft.LogCommand, Data: bad}})
	if err == nil || !strings.Contains(err.Error(), "log entry 2") {
		t.Fatalf("storing a damaged entry: %v", err)
	}
	if last, _ := mem.LastIndex(); last != 0 {
		t.Fatalf("entries stored up to %d", last)
	}
	if err := logs.StoreLogs([]*raft.Log{{Index: 1, Type: raft.LogCommand, Data: good}, {Index: 2, Type: raft.LogNoop}}); err != nil {
		t.Fatal(err)
	}
}

// TestOldEntriesStillRead: a data directory whose log holds entries in
// the format before the checksum (bare protobuf, as a version before it
// wrote them) starts, replays them, and takes framed entries after them.
func TestOldEntriesStillRead(t *testing.T) {
	dir := t.TempDir()
	// The directory an older version left: bootstrapped, then three bare
	// commands in its first term.
	stores, err := store.Open(filepath.Join(dir, "raft"), "", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(filepath.Join(dir, "snapshots"), 2, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	_, trans := raft.NewInmemTransport("n1")
	rc := raft.DefaultConfig()
	rc.LocalID = "n1"
	if err := raft.BootstrapCluster(rc, stores.Log, stores.Stable, snaps, trans, raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: "n1", Address: "n1"}}}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		data, err := proto.Marshal(put(fmt.Sprint("old", i)))
		if err != nil {
			t.Fatal(err)
		}
		if err := stores.Log.StoreLog(&raft.Log{Index: uint64(2 + i), Term: 1, Type: raft.LogCommand, Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	stores.Close()

	n := openRunning(t, Config{DataDir: dir})
	for i := range 3 {
		var found bool
		n.Read(func(s *fsm.State) { _, found = s.KVGet(fmt.Sprint("old", i)) })
		if !found {
			t.Fatalf("the bare entry old%d was not applied", i)
		}
	}
	rev := fill(t, n, 3)
	before := exportState(t, n)
	n.Close()
	n = openRunning(t, Config{DataDir: dir})
	if got := exportState(t, n); !bytes.Equal(got, before) {
		t.Fatal("the state after replaying bare and framed entries differs")
	}
	if got := fill(t, n, 1); got != rev+1 {
		t.Fatalf("revision %d, want %d", got, rev+1)
	}
}

func exportState(t *testing.T, n *Node) []byte {
	t.Helper()
	var b []byte
	var err error
	n.Read(func(s *fsm.State) { b, err = proto.MarshalOptions{Deterministic: true}.Marshal(s.Export()) })
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// BenchmarkCheckLog: what the start's check of the whole log costs for a
// full log (SnapshotThreshold 16,384 entries + TrailingLogs 10,240), per
// engine and entry size (one small command; a batch of 64 of them; 64 KiB
// values). One iteration is one check of the whole log.
func BenchmarkCheckLog(b *testing.B) {
	const entries = 16384 + 10240
	for _, engine := range []string{"bolt", "wal"} {
		for _, size := range []struct {
			name string
			cmd  *fsmpb.Command
		}{
			{"small", put("key-0000")},
			{"batch64", func() *fsmpb.Command {
				batch := &fsmpb.Batch{}
				for i := 0; i < 64; i++ {
					batch.Commands = append(batch.Commands, put(fmt.Sprintf("key-%04d", i)))
				}
				return &fsmpb.Command{Op: &fsmpb.Command_Batch{Batch: batch}}
			}()},
			{"64KiB", putValue("key", 64<<10)},
		} {
			b.Run(engine+"/"+size.name, func(b *testing.B) {
				s, err := store.Open(b.TempDir(), engine, io.Discard)
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				data, err := fsm.EncodeEntry(size.cmd, 0)
				if err != nil {
					b.Fatal(err)
				}
				for i := uint64(1); i <= entries; i += 256 {
					var logs []*raft.Log
					for j := i; j < i+256 && j <= entries; j++ {
						logs = append(logs, &raft.Log{Index: j, Term: 1, Type: raft.LogCommand, Data: data})
					}
					if err := s.Log.StoreLogs(logs); err != nil {
						b.Fatal(err)
					}
				}
				b.SetBytes(int64(len(data)) * entries)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := checkLog(s, 0); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
