package fsm_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

func cmdCompact(rev uint64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_KvCompact{KvCompact: &fsmpb.KVHistoryCompact{Revision: rev}}}
}

func mustApply(t *testing.T, st *fsm.State, cmd *fsmpb.Command) fsm.Result {
	t.Helper()
	r := st.Apply(cmd, nil)
	if r.Err != nil {
		t.Fatalf("%v: %v", cmd, r.Err)
	}
	return r
}

// everyKey reads every key at rev.
func everyKey(st *fsm.State, rev uint64) []fsm.KV {
	return st.Range(fsm.RangeQuery{Key: "\x00", End: []byte{0}, Revision: rev}).KVs
}

// TestKVRangeAtPastRevision: a read at a revision inside the window
// answers the keys as they were then (their create and mod revisions and
// versions of that time; deleted keys absent), after other keys changed.
func TestKVRangeAtPastRevision(t *testing.T) {
	st := fsm.NewState()
	mustApply(t, st, cmdKVPut("a", "a1", 0))  // 1
	mustApply(t, st, cmdKVPut("b", "b1", 0))  // 2
	mustApply(t, st, cmdKVPut("a", "a2", 0))  // 3
	mustApply(t, st, cmdKVDelete("b", false)) // 4
	mustApply(t, st, cmdKVPut("b", "b2", 0))  // 5
	mustApply(t, st, cmdKVPut("c", "c1", 0))  // 6
	want := map[uint64][]fsm.KV{
		1: {{Key: "a", Value: []byte("a1"), CreateRevision: 1, ModRevision: 1, Version: 1}},
		2: {{Key: "a", Value: []byte("a1"), CreateRevision: 1, ModRevision: 1, Version: 1}, {Key: "b", Value: []byte("b1"), CreateRevision: 2, ModRevision: 2, Version: 1}},
		3: {{Key: "a", Value: []byte("a2"), CreateRevision: 1, ModRevision: 3, Version: 2}, {Key: "b", Value: []byte("b1"), CreateRevision: 2, ModRevision: 2, Version: 1}},
		4: {{Key: "a", Value: []byte("a2"), CreateRevision: 1, ModRevision: 3, Version: 2}},
		5: {{Key: "a", Value: []byte("a2"), CreateRevision: 1, ModRevision: 3, Version: 2}, {Key: "b", Value: []byte("b2"), CreateRevision: 5, ModRevision: 5, Version: 1}},
	}
	for rev, kvs := range want {
		if got := everyKey(st, rev); !reflect.DeepEqual(got, kvs) {
			t.Errorf("at revision %d: %+v, want %+v", rev, got, kvs)
		}
		if err := st.CheckKVRevision(rev); err != nil {
			t.Errorf("revision %d: %v", rev, err)
		}
	}
	if got := st.Range(fsm.RangeQuery{Key: "b", Revision: 3}).KVs; len(got) != 1 || string(got[0].Value) != "b1" {
		t.Errorf("b at 3: %+v", got)
	}
	if got := st.Range(fsm.RangeQuery{Key: "b", Revision: 4}).KVs; len(got) != 0 {
		t.Errorf("b at 4 (deleted): %+v", got)
	}
	if a := st.Range(fsm.RangeQuery{Key: "a", End: []byte{0}, CountOnly: true, Revision: 2}); a.Count != 2 {
		t.Errorf("count at 2: %d", a.Count)
	}
	if err := st.CheckKVRevision(7); !errors.Is(err, fsm.ErrFutureRevision) {
		t.Errorf("revision 7: %v", err)
	}
	// A transaction's range reads at its revision too.
	r := mustApply(t, st, cmdKVTxn(&fsmpb.KVTxn{Success: []*fsmpb.KVOp{{Op: &fsmpb.KVOp_Range{Range: &fsmpb.KVRange{Key: "b", Revision: 2}}}}}))
	if got := r.KV.Ops[0].Range; len(got) != 1 || string(got[0].Value) != "b1" {
		t.Errorf("txn range b at 2: %+v", got)
	}
}

// TestKVHistoryMatchesEveryRevision: after random puts, deletes,
// transactions and compactions, every query (limit, sort, keys only,
// count, revision filters) at every revision inside the window answers
// what the current-only store answered at that revision, and one before
// it is ErrCompactedRevision.
func TestKVHistoryMatchesEveryRevision(t *testing.T) {
	for seed := range uint64(8) {
		rng := rand.New(rand.NewPCG(seed, 7))
		st := fsm.NewState()
		if seed%2 == 1 {
			mustApply(t, st, cmdSetLimits(fsm.Limits{MaxKVHistoryRevisions: 40, MaxKVHistoryBytes: 8 << 10}))
		}
		past := map[uint64]*fsmpb.Snapshot{st.Revision(): st.Export()}
		key := func() string { return fmt.Sprintf("k%d", rng.IntN(12)) }
		for range 200 {
			var cmd *fsmpb.Command
			switch rng.IntN(10) {
			case 0, 1, 2, 3:
				cmd = cmdKVPut(key(), fmt.Sprint(rng.IntN(1000)), 0)
			case 4:
				cmd = cmdKVDelete(key(), false)
			case 5:
				cmd = cmdKVDelete("k1", true)
			case 6:
				cmd = cmdKVTxn(&fsmpb.KVTxn{Success: []*fsmpb.KVOp{opPut(key(), "t", 0), opDelete(key()+"x", false), opPut("z"+key(), "u", 0)}})
			case 7: // a key written twice, then deleted or written again, in one transaction
				k := key()
				cmd = cmdKVTxn(&fsmpb.KVTxn{Success: []*fsmpb.KVOp{opPut(k, "t1", 0), opPut(k, "t2", 0), opDelete(key(), false), opPut(key(), "t3", 0)}})
			case 8:
				if st.Revision() > 5 {
					cmd = cmdCompact(st.KVCompactRevision() + 1 + uint64(rng.IntN(3)))
				} else {
					continue
				}
			default:
				cmd = cmdKVPut(key(), string(bytes.Repeat([]byte("v"), rng.IntN(2000))), 0)
			}
			if r := st.Apply(cmd, nil); r.Err != nil && !errors.Is(r.Err, fsm.ErrFutureRevision) {
				t.Fatalf("seed %d: %v", seed, r.Err)
			}
			past[st.Revision()] = st.Export()
		}
		compact := st.KVCompactRevision()
		if compact == 0 || compact >= st.Revision() {
			t.Fatalf("seed %d: compact revision %d of %d", seed, compact, st.Revision())
		}
		queries := []fsm.RangeQuery{
			{Key: "\x00", End: []byte{0}},
			{Key: "k1", End: []byte("k5"), Limit: 2, Count: true},
			{Key: "\x00", End: []byte{0}, SortOrder: fsm.SortDescend, SortTarget: fsm.SortByMod, Limit: 3},
			{Key: "\x00", End: []byte{0}, SortOrder: fsm.SortAscend, SortTarget: fsm.SortByVersion, KeysOnly: true},
			{Key: "k", End: []byte("l"), CountOnly: true},
			{Key: "k3"},
			{Key: "\x00", End: []byte{0}, MinModRevision: 20, MaxCreateRevision: 150, Count: true},
		}
		for rev, snap := range past {
			if rev == 0 {
				continue
			}
			if rev < compact {
				if err := st.CheckKVRevision(rev); !errors.Is(err, fsm.ErrCompactedRevision) {
					t.Fatalf("seed %d: revision %d before the window's start %d: %v", seed, rev, compact, err)
				}
				continue
			}
			then, err := fsm.Import(snap)
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range queries {
				want := then.Range(q)
				q.Revision = rev
				if got := st.Range(q); !reflect.DeepEqual(got, want) {
					t.Fatalf("seed %d: %+v at revision %d:\n got %+v\nwant %+v", seed, q, rev, got, want)
				}
			}
		}
	}
}

// TestKVCompact: etcd's Compact moves the window's start; a read before
// it, and a second compact of it, are ErrCompactedRevision; a compact of
// a future revision is ErrFutureRevision; the compact takes no revision.
func TestKVCompact(t *testing.T) {
	st := fsm.NewState()
	for i := range 10 {
		mustApply(t, st, cmdKVPut("k", fmt.Sprint(i), 0))
	}
	r := mustApply(t, st, cmdCompact(6))
	if r.Revision != 10 || st.KVCompactRevision() != 6 {
		t.Fatalf("after compact: revision %d, compact revision %d", r.Revision, st.KVCompactRevision())
	}
	if err := st.CheckKVRevision(5); !errors.Is(err, fsm.ErrCompactedRevision) {
		t.Fatalf("read at 5: %v", err)
	}
	if got := everyKey(st, 6); len(got) != 1 || string(got[0].Value) != "5" || got[0].Version != 6 {
		t.Fatalf("at 6: %+v", got)
	}
	for _, c := range []struct {
		rev  uint64
		want error
	}{{6, fsm.ErrCompactedRevision}, {3, fsm.ErrCompactedRevision}, {11, fsm.ErrFutureRevision}} {
		if r := st.Apply(cmdCompact(c.rev), nil); !errors.Is(r.Err, c.want) {
			t.Errorf("compact %d: %v, want %v", c.rev, r.Err, c.want)
		}
	}
	_, err := st.ReadTxn(&fsmpb.KVTxn{Success: []*fsmpb.KVOp{{Op: &fsmpb.KVOp_Range{Range: &fsmpb.KVRange{Key: "k", Revision: 5}}}}})
	if !errors.Is(err, fsm.ErrCompactedRevision) {
		t.Fatalf("txn read at 5: %v", err)
	}
	mustApply(t, st, cmdCompact(10))
	if n, _ := st.KVHistoryStats(); n != 1 { // the change at 10, which a watch from 10 replays
		t.Fatalf("compacted to the current revision: %d records", n)
	}
}

// TestKVHistoryBounds: the window never spans more than
// max-kv-history-revisions nor holds more than max-kv-history-bytes; the
// oldest revisions are compacted as keys change.
func TestKVHistoryBounds(t *testing.T) {
	st := fsm.NewState()
	mustApply(t, st, cmdSetLimits(fsm.Limits{MaxKVHistoryRevisions: 50, MaxKVHistoryBytes: 1 << 30}))
	for i := range 200 {
		mustApply(t, st, cmdKVPut(fmt.Sprint("k", i%10), "v", 0))
	}
	if got := st.Revision() - st.KVCompactRevision(); got != 50 {
		t.Fatalf("the window spans %d revisions, want 50", got)
	}
	mustApply(t, st, cmdSetLimits(fsm.Limits{MaxKVHistoryRevisions: 1 << 40, MaxKVHistoryBytes: 20_000}))
	value := bytes.Repeat([]byte("x"), 1000)
	for i := range 200 {
		mustApply(t, st, &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: fmt.Sprint("k", i%10), Value: value}}})
		if _, b := st.KVHistoryStats(); b > 20_000 {
			t.Fatalf("after put %d the window holds %d bytes", i, b)
		}
	}
	if n, _ := st.KVHistoryStats(); n < 10 {
		t.Fatalf("the window holds %d records", n)
	}
	if got := everyKey(st, st.KVCompactRevision()); len(got) != 10 {
		t.Fatalf("at the window's start: %d keys", len(got))
	}
}

// TestKVHistorySnapshot: a snapshot holds the window; the restored state
// answers the same past reads, exports the same, and applies on alike.
func TestKVHistorySnapshot(t *testing.T) {
	f := fsm.New(nil)
	var logs []*raft.Log
	add := func(cmd *fsmpb.Command) { logs = append(logs, logOf(t, uint64(len(logs)+1), cmd)) }
	add(cmdSetClusterVersion(3))
	add(cmdCreate("o", 10_000)) // session 2
	for i := range 300 {
		sess := uint64(0)
		if i%7 == 0 {
			sess = 2
		}
		add(cmdKVPut(fmt.Sprintf("k%02d", i%40), fmt.Sprint("v", i), sess))
		if i%11 == 0 {
			add(cmdKVDelete(fmt.Sprintf("k%02d", i%13), false))
		}
	}
	add(cmdCompact(100))
	f.ApplyBatch(logs)
	want := fsmExport(t, f)
	var before [][]fsm.KV
	f.Read(func(st *fsm.State) {
		for rev := uint64(100); rev <= st.Revision(); rev++ {
			before = append(before, everyKey(st, rev))
		}
	})
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Release()
	var later []*raft.Log
	for i := range 300 { // overwrite, delete and compact while the snapshot is written
		cmd := cmdKVPut(fmt.Sprintf("k%02d", i%40), "changed", 0)
		if i%3 == 0 {
			cmd = cmdKVDelete(fmt.Sprintf("k%02d", i%40), false)
		}
		later = append(later, logOf(t, uint64(len(logs)+len(later)+1), cmd))
	}
	later = append(later, logOf(t, uint64(len(logs)+len(later)+1), cmdCompact(500)), logOf(t, uint64(len(logs)+len(later)+2), cmdExpire(2)))
	f.ApplyBatch(later)
	g := restored(t, snap)
	if !bytes.Equal(fsmExport(t, g), want) {
		t.Fatal("the restored state exports differently")
	}
	var exp fsmpb.Snapshot
	if err := proto.Unmarshal(want, &exp); err != nil {
		t.Fatal(err)
	}
	if exp.GetKvCompactRevision() != 100 || len(exp.GetKvHistory()) == 0 {
		t.Fatalf("the snapshot holds no window: compact revision %d, %d records", exp.GetKvCompactRevision(), len(exp.GetKvHistory()))
	}
	g.Read(func(st *fsm.State) {
		if st.KVCompactRevision() != 100 {
			t.Fatalf("restored compact revision %d", st.KVCompactRevision())
		}
		for i, kvs := range before {
			if got := everyKey(st, 100+uint64(i)); !reflect.DeepEqual(got, kvs) {
				t.Fatalf("restored, at revision %d: %+v, want %+v", 100+i, got, kvs)
			}
		}
	})
	g.ApplyBatch(later)
	if !bytes.Equal(fsmExport(t, g), fsmExport(t, f)) {
		t.Fatal("restored FSM diverged after the same entries")
	}
}

// TestKVHistoryGated: below cluster version 3 no history is kept (a read
// names the current revision or nothing, as before), Compact is refused
// with ErrVersion and changes nothing, and the history limits are
// ignored; raising the version starts the window at the raise.
func TestKVHistoryGated(t *testing.T) {
	st := fsm.NewStateAt(2)
	mustApply(t, st, cmdKVPut("a", "1", 0))
	mustApply(t, st, cmdKVPut("b", "1", 0))
	if err := st.CheckKVRevision(1); !errors.Is(err, fsm.ErrCompactedRevision) {
		t.Fatalf("read at 1 at version 2: %v", err)
	}
	if r := st.Apply(cmdCompact(1), nil); !errors.Is(r.Err, fsm.ErrVersion) {
		t.Fatalf("compact at version 2: %v", r.Err)
	}
	if err := fsm.CheckVersion(cmdCompact(1), 2); !errors.Is(err, fsm.ErrVersion) {
		t.Fatalf("compact proposed at version 2: %v", err)
	}
	mustApply(t, st, cmdSetLimits(fsm.Limits{MaxKVHistoryRevisions: 3}))
	if st.Limits().MaxKVHistoryRevisions != fsm.DefaultLimits().MaxKVHistoryRevisions {
		t.Fatal("the history limit was set at version 2")
	}
	if snap := st.Export(); snap.GetKvCompactRevision() != 0 || len(snap.GetKvHistory()) != 0 {
		t.Fatal("a snapshot at version 2 holds history fields")
	}
	mustApply(t, st, cmdSetClusterVersion(3)) // revision 3
	mustApply(t, st, cmdKVPut("a", "2", 0))   // 4
	if err := st.CheckKVRevision(2); !errors.Is(err, fsm.ErrCompactedRevision) {
		t.Fatalf("read at 2, before the raise: %v", err)
	}
	if got := everyKey(st, 3); len(got) != 2 || string(got[0].Value) != "1" {
		t.Fatalf("at 3: %+v", got)
	}
}

// TestKVHistoryTwiceInOneTxn: a transaction that writes a key twice (the
// native API allows it) leaves the key's versions readable at every
// revision, before and after the oldest are compacted.
func TestKVHistoryTwiceInOneTxn(t *testing.T) {
	st := fsm.NewState()
	mustApply(t, st, cmdKVPut("k", "a", 0))                                                                  // 1
	mustApply(t, st, cmdKVTxn(&fsmpb.KVTxn{Success: []*fsmpb.KVOp{opPut("k", "b", 0), opPut("k", "c", 0)}})) // 2
	mustApply(t, st, cmdKVPut("x", "x", 0))                                                                  // 3
	mustApply(t, st, cmdKVPut("k", "d", 0))                                                                  // 4
	check := func(rev uint64, want string) {
		t.Helper()
		got := st.Range(fsm.RangeQuery{Key: "k", Revision: rev}).KVs
		if len(got) != 1 || string(got[0].Value) != want {
			t.Fatalf("k at %d: %+v, want %s", rev, got, want)
		}
	}
	check(1, "a")
	check(2, "c")
	check(3, "c")
	check(4, "d")
	mustApply(t, st, cmdCompact(3))
	check(3, "c")
	check(4, "d")
}

// TestKVCompactAtADelete: as etcd's compaction (which keeps each key's
// newest change at or before the compact revision, a tombstone
// included), a delete made at the compact revision stays in the window:
// a watch from that revision replays it; the next compaction past it
// drops it.
func TestKVCompactAtADelete(t *testing.T) {
	st := fsm.NewState()
	mustApply(t, st, cmdKVPut("a", "1", 0))   // 1
	mustApply(t, st, cmdKVPut("b", "1", 0))   // 2
	mustApply(t, st, cmdKVDelete("a", false)) // 3
	mustApply(t, st, cmdKVPut("c", "1", 0))   // 4
	mustApply(t, st, cmdCompact(3))
	changes, through, err := st.KVChangesFrom(3, 10)
	if err != nil || through != 4 || len(changes) != 2 || changes[0].Put || changes[0].KV.Key != "a" || changes[0].KV.ModRevision != 3 || !changes[1].Put {
		t.Fatalf("changes from the compact revision 3: %+v through %d, %v", changes, through, err)
	}
	if got := everyKey(st, 3); len(got) != 1 || got[0].Key != "b" {
		t.Fatalf("at 3: %+v", got)
	}
	mustApply(t, st, cmdCompact(4))
	if changes, _, err := st.KVChangesFrom(4, 10); err != nil || len(changes) != 1 || changes[0].KV.Key != "c" {
		t.Fatalf("changes from 4 after compacting to it: %+v, %v", changes, err)
	}
}
