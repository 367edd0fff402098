package fsm_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// snapNames are lock names and register keys in an order that is not
// their byte order, some sharing prefixes, some beyond ASCII, so that an
// export in any other order than sorted is seen.
var snapNames = []string{"m", "a", "zz", "z", "b/1", "b", "é", "b/10", "b/2", "A", "~", "日本"}

// drawSnapCommand draws a command that touches the state a snapshot
// writes: sessions (etcd leases and with secrets too), mutexes,
// semaphores, read-write locks and elections with holders, waiters,
// lock-delays and history, fenced registers with remembered operations
// (a small operation memory, so that its ring wraps) and deletes, the
// key-value store and queues. Its arguments are drawn near the state's
// revision, so that many commands apply and some fail.
func drawSnapCommand(t *rapid.T, rev uint64) *fsmpb.Command {
	near := func(label string) uint64 { return rapid.Uint64Range(1, rev+2).Draw(t, label) }
	name := func(label string) string { return rapid.SampledFrom(snapNames).Draw(t, label) }
	value := func(label string) []byte {
		return []byte(rapid.SampledFrom([]string{"", "v", "value-2"}).Draw(t, label))
	}
	switch rapid.IntRange(0, 17).Draw(t, "kind") {
	case 0, 1:
		return cmdCreate(fmt.Sprint("owner-", rev), rapid.SampledFrom([]int64{1_000, 60_000}).Draw(t, "ttl"))
	case 2:
		return cmdEtcdLease(5_000)
	case 3:
		return cmdCreateSessionSecret("secret", 10_000, []byte{byte(rev)})
	case 4, 5, 6:
		return cmdAcquireArgs(&fsmpb.Acquire{
			Session:     near("session"),
			Name:        name("lock"),
			Wait:        rapid.Bool().Draw(t, "wait"),
			LockDelayMs: rapid.SampledFrom([]int64{0, 0, 500}).Draw(t, "delay"),
			Permits:     rapid.SampledFrom([]uint32{0, 1, 3}).Draw(t, "permits"),
			Shared:      rapid.Bool().Draw(t, "shared"),
			Election:    rapid.Bool().Draw(t, "election"),
			Value:       value("value"),
		})
	case 7:
		return cmdRelease(near("session"), name("lock"), near("token"))
	case 8:
		return cmdCancel(near("session"), name("lock"), near("acquireRevision"))
	case 9:
		if rapid.Bool().Draw(t, "expire") {
			return cmdExpire(near("session"))
		}
		return cmdClose(near("session"))
	case 10:
		return cmdEndDelay(name("lock"), rapid.Uint64Range(1, 3).Draw(t, "generation"))
	case 11:
		return cmdProclaim(near("session"), name("lock"), near("token"), string(value("value")))
	case 12, 16, 17:
		key := rapid.SampledFrom(snapNames[:3]).Draw(t, "key")
		lock := rapid.SampledFrom(append([]string{"", "", "", ""}, snapNames...)).Draw(t, "registerLock")
		opID := fmt.Sprint("op-", rapid.IntRange(0, 9).Draw(t, "opID"))
		if rapid.IntRange(0, 5).Draw(t, "delete") == 0 {
			return cmdDelete(key, near("token"), lock, opID)
		}
		return cmdPutLock(key, string(value("value")), near("token"), lock, opID)
	case 13:
		return cmdRetention(rapid.Uint32Range(0, 4).Draw(t, "lockHistory"), rapid.Uint32Range(0, 3).Draw(t, "opMemory"))
	case 14:
		return cmdKVPut(name("kvKey"), string(value("value")), 0)
	default:
		return cmdEnqueue(name("queue"), "payload")
	}
}

// TestSnapshotBytesMatchSortedExport: a snapshot that walks the ordered
// indexes writes the very bytes that sorting the maps' keys wrote, for
// State.Export and for FSM.Snapshot's Persist, and what Persist writes is
// the state at Snapshot even when commands are applied while Persist runs
// (as raft does: Persist runs concurrently with Apply).
func TestSnapshotBytesMatchSortedExport(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		f := fsm.New(nil)
		var index uint64
		apply := func(cmd *fsmpb.Command) error {
			index++
			data, err := fsm.EncodeEntry(cmd, 0)
			if err != nil {
				return err
			}
			f.Apply(&raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: data})
			return nil
		}
		for range rapid.IntRange(0, 120).Draw(t, "before") {
			var rev uint64
			f.Read(func(s *fsm.State) { rev = s.Revision() })
			if err := apply(drawSnapCommand(t, rev)); err != nil {
				t.Fatalf("encode: %v", err)
			}
		}

		var want, got []byte
		f.Read(func(s *fsm.State) {
			var err error
			want, err = proto.MarshalOptions{Deterministic: true}.Marshal(s.ExportSorted())
			if err != nil {
				t.Fatalf("marshal the sorted export: %v", err)
			}
			got = exportBytes(t, s)
		})
		if !bytes.Equal(got, want) {
			t.Fatalf("Export differs from the sorted export (%d and %d bytes)", len(got), len(want))
		}

		sorted, err := f.SnapshotSorted()
		if err != nil {
			t.Fatalf("the sorted snapshot: %v", err)
		}
		indexed, err := f.Snapshot()
		if err != nil {
			t.Fatalf("Snapshot: %v", err)
		}
		// Commands drawn now are applied while the snapshots persist,
		// as raft does (run with -race).
		var between []*fsmpb.Command
		var rev uint64
		f.Read(func(s *fsm.State) { rev = s.Revision() })
		for i := range rapid.IntRange(0, 40).Draw(t, "between") {
			between = append(between, drawSnapCommand(t, rev+uint64(i)))
		}
		applied := make(chan error, 1)
		go func() {
			for _, cmd := range between {
				if err := apply(cmd); err != nil {
					applied <- err
					return
				}
			}
			applied <- nil
		}()
		var ws, gs memSink
		errSorted, errIndexed := sorted.Persist(&ws), indexed.Persist(&gs)
		if err := <-applied; err != nil {
			t.Fatalf("apply during Persist: %v", err)
		}
		if errSorted != nil || errIndexed != nil {
			t.Fatalf("Persist: %v (the sorted snapshot: %v)", errIndexed, errSorted)
		}
		if !bytes.Equal(gs.buf.Bytes(), ws.buf.Bytes()) {
			t.Fatalf("Persist wrote %d bytes unlike the sorted snapshot's %d", gs.buf.Len(), ws.buf.Len())
		}
		st, err := fsm.ReadSnapshot(bytes.NewReader(gs.buf.Bytes()))
		if err != nil {
			t.Fatalf("the snapshot does not read back: %v", err)
		}
		if err := st.CheckIndexes(); err != nil {
			t.Fatalf("the restored state's indexes: %v", err)
		}
		if back := exportBytes(t, st); !bytes.Equal(back, want) {
			t.Fatal("the snapshot does not hold the state at Snapshot")
		}
	})
}
