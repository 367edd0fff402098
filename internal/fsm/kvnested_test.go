package fsm_test

import (
	"errors"
	"testing"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

func opTxn(t *fsmpb.KVTxn) *fsmpb.KVOp { return &fsmpb.KVOp{Op: &fsmpb.KVOp_Txn{Txn: t}} }

// exists compares key's version with 0: it holds when the key exists.
func exists(key string) *fsmpb.KVCompare {
	return &fsmpb.KVCompare{Key: key, Target: fsm.CompareVersion, Result: fsm.CompareGreater}
}

// TestNestedTxnGatedAtVersion3: below cluster version 3 a transaction
// holding a transaction is refused with ErrVersion and changes nothing,
// as a member of an older release refuses the op it does not know.
func TestNestedTxnGatedAtVersion3(t *testing.T) {
	m := &machine{tb: t, s: fsm.NewStateAt(2)}
	nestedTxn := cmdKVTxn(&fsmpb.KVTxn{Success: []*fsmpb.KVOp{opTxn(&fsmpb.KVTxn{Success: []*fsmpb.KVOp{opPut("k", "v", 0)}})}})
	m.failsWith(nestedTxn, fsm.ErrVersion)
	if err := fsm.CheckVersion(nestedTxn, 2); !errors.Is(err, fsm.ErrVersion) {
		t.Fatalf("proposal gate at version 2: %v", err)
	}
	m.ok(cmdSetClusterVersion(3))
	if err := fsm.CheckVersion(nestedTxn, 3); err != nil {
		t.Fatalf("proposal gate at version 3: %v", err)
	}
	m.ok(nestedTxn)
	if kv, ok := m.s.KVGet("k"); !ok || string(kv.Value) != "v" {
		t.Fatalf("the nested put: %+v %v", kv, ok)
	}
}

// TestNestedTxnRunsAsEtcd: every compare, nested ones included, is
// evaluated on the state before the transaction; the ops then run in
// order (a nested range sees a put before it), every write at one
// revision; a nested read-only transaction is a read.
func TestNestedTxnRunsAsEtcd(t *testing.T) {
	m := newMachine(t)
	m.ok(cmdKVPut("a", "1", 0))
	inner := &fsmpb.KVTxn{
		Compares: []*fsmpb.KVCompare{exists("b")}, // b does not exist before the transaction
		Success:  []*fsmpb.KVOp{opPut("c", "then", 0)},
		Failure:  []*fsmpb.KVOp{opPut("c", "else", 0), opRange("b", false)},
	}
	txn := &fsmpb.KVTxn{
		Compares: []*fsmpb.KVCompare{exists("a")},
		Success:  []*fsmpb.KVOp{opPut("b", "2", 0), opTxn(inner), opRange("c", false)},
	}
	before := m.s.Revision()
	r, evs := m.ok(cmdKVTxn(txn))
	if r.Revision != before+1 {
		t.Fatalf("revision %d, want %d: one for every write", r.Revision, before+1)
	}
	for _, e := range evs {
		if e.Kind == fsm.EventKVPut && e.Revision != before+1 {
			t.Fatalf("event %+v at another revision", e)
		}
	}
	if !r.KV.Succeeded || len(r.KV.Ops) != 3 {
		t.Fatalf("outer %+v", r.KV)
	}
	in := r.KV.Ops[1].Txn
	if in == nil || in.Succeeded || len(in.Ops) != 2 {
		t.Fatalf("nested result %+v: want the failure branch (compares read the state before the transaction)", in)
	}
	if got := in.Ops[1].Range; len(got) != 1 || string(got[0].Value) != "2" {
		t.Fatalf("the nested range of b: %+v, want the put before it", got)
	}
	if got := r.KV.Ops[2].Range; len(got) != 1 || string(got[0].Value) != "else" {
		t.Fatalf("the range of c after the nested transaction: %+v", got)
	}
	// A read of nested ranges only.
	ro := &fsmpb.KVTxn{Success: []*fsmpb.KVOp{opTxn(&fsmpb.KVTxn{Compares: []*fsmpb.KVCompare{exists("c")}, Success: []*fsmpb.KVOp{opRange("c", false)}})}}
	res, err := m.s.ReadTxn(ro)
	if err != nil || !res.Ops[0].Txn.Succeeded || string(res.Ops[0].Txn.Ops[0].Range[0].Value) != "else" {
		t.Fatalf("read of a nested transaction: %+v %v", res, err)
	}
	// A nested put's checks are made too: a lease that does not exist
	// refuses the whole transaction, changing nothing.
	bad := &fsmpb.KVTxn{Success: []*fsmpb.KVOp{opPut("d", "1", 0), opTxn(&fsmpb.KVTxn{Success: []*fsmpb.KVOp{{Op: &fsmpb.KVOp_Put{Put: &fsmpb.KVPut{Key: "e", Lease: 999}}}}})}}
	m.failsWith(cmdKVTxn(bad), fsm.ErrSessionNotFound)
}

// TestValueLimitGatedAtVersion3: from cluster version 3 a key holds a
// value up to etcd's request limit (1.5 MiB); below it, over 1 MiB is
// refused as a member of an older release refuses it, changing nothing.
func TestValueLimitGatedAtVersion3(t *testing.T) {
	big := string(make([]byte, 1<<20+1))
	old := &machine{tb: t, s: fsm.NewStateAt(2)}
	old.failsWith(cmdKVPut("k", big, 0), fsm.ErrInvalid)
	old.failsWith(cmdKVTxn(&fsmpb.KVTxn{Success: []*fsmpb.KVOp{opPut("k", big, 0)}}), fsm.ErrInvalid)
	m := newMachine(t)
	m.ok(cmdKVPut("k", string(make([]byte, fsm.MaxKVValueLen)), 0))
	m.ok(cmdKVTxn(&fsmpb.KVTxn{Success: []*fsmpb.KVOp{opPut("k", big, 0)}}))
	m.failsWith(cmdKVPut("k", string(make([]byte, fsm.MaxKVValueLen+1)), 0), fsm.ErrInvalid)
}
