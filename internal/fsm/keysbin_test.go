package fsm_test

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// viaLog encodes cmd as a proposer does and decodes it as the state
// machine does (a protobuf string cannot carry a key that is not UTF-8).
func viaLog(t *testing.T, cmd *fsmpb.Command) *fsmpb.Command {
	t.Helper()
	b, err := fsm.EncodeEntryVersion(cmd, 3, 0)
	if err != nil {
		t.Fatalf("encoding %v: %v", cmd, err)
	}
	var out fsmpb.Command
	if err := fsm.DecodeEntry(b, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

// TestBinaryKeys: from cluster version 3 a key of any bytes (etcd's) is
// stored through the log, read, compared, deleted by range and kept by a
// snapshot; the proposal gate refuses one below version 3; Tenure's own
// API's rule (ValidateKVKey) stays UTF-8 text; ShowKey quotes it and
// KeyFromShown reads a page's start key back.
func TestBinaryKeys(t *testing.T) {
	bin := "k\xff\x00\xfe"
	put := cmdKVPut(bin, "v", 0)
	if err := fsm.CheckVersion(put, 2); !errors.Is(err, fsm.ErrVersion) {
		t.Fatalf("a binary key at cluster version 2: %v, want ErrVersion", err)
	}
	m := newMachine(t)
	m.ok(viaLog(t, put))
	if kv, ok := m.s.KVGet(bin); !ok || string(kv.Value) != "v" {
		t.Fatalf("the binary key: %+v %v", kv, ok)
	}
	txn := &fsmpb.KVTxn{
		Compares: []*fsmpb.KVCompare{{Key: bin, Target: fsm.CompareValue, Result: fsm.CompareEqual, Value: []byte("v")}},
		Success:  []*fsmpb.KVOp{opPut(bin+"\x01", "w", 0), {Op: &fsmpb.KVOp_Range{Range: &fsmpb.KVRange{Key: "k", Prefix: true, StartKey: bin}}}},
	}
	r, _ := m.ok(viaLog(t, cmdKVTxn(txn)))
	if !r.KV.Succeeded || len(r.KV.Ops[1].Range) != 2 || r.KV.Ops[1].Range[0].Key != bin {
		t.Fatalf("txn on binary keys: %+v", r.KV)
	}
	// A snapshot keeps them.
	b, err := proto.Marshal(m.s.Export())
	if err != nil {
		t.Fatalf("snapshot of binary keys: %v", err)
	}
	var snap fsmpb.Snapshot
	if err := proto.Unmarshal(b, &snap); err != nil {
		t.Fatal(err)
	}
	st, err := fsm.Import(&snap)
	if err != nil {
		t.Fatal(err)
	}
	if kv, ok := st.KVGet(bin + "\x01"); !ok || string(kv.Value) != "w" {
		t.Fatalf("after the snapshot: %+v %v", kv, ok)
	}
	r, _ = m.ok(viaLog(t, &fsmpb.Command{Op: &fsmpb.Command_KvDelete{KvDelete: &fsmpb.KVDelete{Key: bin, RangeEnd: []byte(bin + "\x02")}}}))
	if r.KV.Deleted != 2 {
		t.Fatalf("deleted %d binary keys, want 2", r.KV.Deleted)
	}
	if err := fsm.ValidateKVKey(bin, false); !errors.Is(err, fsm.ErrInvalid) {
		t.Fatalf("Tenure's API's key rule took a binary key: %v", err)
	}
	shown := fsm.ShowKey(bin)
	if shown != `"k\xff\x00\xfe"` || fsm.ShowKey("text") != "text" {
		t.Fatalf("shown as %s", shown)
	}
	if fsm.KeyFromShown(shown+"\x00") != bin+"\x00" || fsm.KeyFromShown(`"text"`) != `"text"` {
		t.Fatal("KeyFromShown")
	}
}

// TestBinaryKeysInTheHistoryWindow: past versions of a key that is not
// UTF-8 are read at their revision, and kept by a snapshot's history.
func TestBinaryKeysInTheHistoryWindow(t *testing.T) {
	bin := "h\xff"
	m := newMachine(t)
	r1, _ := m.ok(viaLog(t, cmdKVPut(bin, "1", 0)))
	m.ok(viaLog(t, cmdKVPut(bin, "2", 0)))
	snap := m.s.Export()
	if len(snap.GetKvHistory()) == 0 {
		t.Fatal("no history in the snapshot")
	}
	b, err := proto.Marshal(snap)
	if err != nil {
		t.Fatalf("a snapshot with binary keys in its history: %v", err)
	}
	var back fsmpb.Snapshot
	if err := proto.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	st, err := fsm.Import(&back)
	if err != nil {
		t.Fatal(err)
	}
	res, err := st.ReadTxn(&fsmpb.KVTxn{Success: []*fsmpb.KVOp{{Op: &fsmpb.KVOp_Range{Range: &fsmpb.KVRange{Key: bin, Revision: r1.Revision}}}}})
	if err != nil || len(res.Ops[0].Range) != 1 || string(res.Ops[0].Range[0].Value) != "1" {
		t.Fatalf("the binary key at its first revision after the snapshot: %+v %v", res, err)
	}
}
