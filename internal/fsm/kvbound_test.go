package fsm_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

func kvPutCmd(key string, value []byte) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: key, Value: value}}}
}

func prefixRange(prefix string) *fsmpb.KVOp {
	return &fsmpb.KVOp{Op: &fsmpb.KVOp_Range{Range: &fsmpb.KVRange{Key: prefix, Prefix: true}}}
}

// TestTxnRangesPagedAndBounded: a paged transaction's range answers one
// page (by bytes and by keys) with more set; a transaction whose ranges
// could answer more than max_answer_bytes is refused with ErrLimit and
// writes nothing, whether applied or read, counting the puts of the
// transaction that land in its ranges; an unpaged, unbounded one answers
// as before.
func TestTxnRangesPagedAndBounded(t *testing.T) {
	st := fsm.NewState()
	val := make([]byte, 1024)
	for i := range 3000 { // 3.1 MiB
		if r := st.Apply(kvPutCmd(fmt.Sprintf("b/%05d", i), val), nil); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	for i := range 12_000 {
		st.Apply(kvPutCmd(fmt.Sprintf("s/%05d", i), nil), nil)
	}
	txn := func(t *fsmpb.KVTxn) *fsmpb.Command { return &fsmpb.Command{Op: &fsmpb.Command_KvTxn{KvTxn: t}} }

	r := st.Apply(txn(&fsmpb.KVTxn{Success: []*fsmpb.KVOp{prefixRange("b/"), prefixRange("s/")}, Paged: true}), nil)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	byBytes, byKeys := r.KV.Ops[0], r.KV.Ops[1]
	size := 0
	for i := range byBytes.Range {
		size += fsm.AnswerSize(&byBytes.Range[i], false)
	}
	if !byBytes.More || size > fsm.MaxPageBytes || size+fsm.AnswerSize(&byBytes.Range[0], false) <= fsm.MaxPageBytes {
		t.Fatalf("a paged range of 3.1 MiB: %d keys, %d bytes, more %v; want one full page of %d bytes", len(byBytes.Range), size, byBytes.More, fsm.MaxPageBytes)
	}
	if !byKeys.More || len(byKeys.Range) != fsm.MaxPageItems {
		t.Fatalf("a paged range of 12,000 keys: %d keys, more %v", len(byKeys.Range), byKeys.More)
	}
	if r := st.Apply(txn(&fsmpb.KVTxn{Success: []*fsmpb.KVOp{prefixRange("b/")}}), nil); r.Err != nil || len(r.KV.Ops[0].Range) != 3000 || r.KV.Ops[0].More {
		t.Fatalf("an unpaged range: %d keys, more %v, %v", len(r.KV.Ops[0].Range), r.KV.Ops[0].More, r.Err)
	}

	rev := st.Revision()
	cases := []struct {
		name   string
		txn    *fsmpb.KVTxn
		refuse bool
	}{
		{"two pages over a 3 MiB bound", &fsmpb.KVTxn{Success: []*fsmpb.KVOp{{Op: &fsmpb.KVOp_Put{Put: &fsmpb.KVPut{Key: "marker", Value: []byte("x")}}}, prefixRange("b/"), prefixRange("b/")}, Paged: true, MaxAnswerBytes: 3 << 20}, true},
		{"two pages, ranges only", &fsmpb.KVTxn{Success: []*fsmpb.KVOp{prefixRange("b/"), prefixRange("b/")}, Paged: true, MaxAnswerBytes: 3 << 20}, true},
		{"one page under a 3 MiB bound", &fsmpb.KVTxn{Success: []*fsmpb.KVOp{prefixRange("b/")}, Paged: true, MaxAnswerBytes: 3 << 20}, false},
		{"a put landing in a later range", &fsmpb.KVTxn{Success: []*fsmpb.KVOp{{Op: &fsmpb.KVOp_Put{Put: &fsmpb.KVPut{Key: "n/a", Value: make([]byte, 600<<10)}}}, prefixRange("n/")}, Paged: true, MaxAnswerBytes: 512 << 10}, true},
		{"the failure branch, taken", &fsmpb.KVTxn{Compares: []*fsmpb.KVCompare{{Key: "none", Target: fsm.CompareVersion, Result: fsm.CompareGreater}}, Failure: []*fsmpb.KVOp{prefixRange("b/"), prefixRange("s/")}, Paged: true, MaxAnswerBytes: 2 << 20}, true},
	}
	for _, c := range cases {
		if err := st.CheckTxnAnswer(c.txn); c.refuse != errors.Is(err, fsm.ErrAnswerTooLarge) {
			t.Fatalf("%s: checked before it is proposed: %v, want refused %v", c.name, err, c.refuse)
		}
		r := st.Apply(txn(c.txn), nil)
		if c.refuse != (r.Err != nil) || (c.refuse && (!errors.Is(r.Err, fsm.ErrLimit) || !errors.Is(r.Err, fsm.ErrAnswerTooLarge))) {
			t.Fatalf("%s: %v, want refused %v", c.name, r.Err, c.refuse)
		}
		if c.refuse && st.Revision() != rev {
			t.Fatalf("%s: refused but the revision moved from %d to %d", c.name, rev, st.Revision())
		}
		if read := (&fsmpb.KVTxn{Compares: c.txn.Compares, Paged: c.txn.Paged, MaxAnswerBytes: c.txn.MaxAnswerBytes}); c.txn.Success != nil && c.txn.Success[0].GetRange() != nil {
			read.Success = c.txn.Success
			if _, err := st.ReadTxn(read); c.refuse != (err != nil) {
				t.Fatalf("%s as a read: %v, want refused %v", c.name, err, c.refuse)
			}
		}
	}
	if _, ok := st.KVGet("marker"); ok {
		t.Fatal("a refused transaction's put was written")
	}
}
