package etcdapi

import (
	"bytes"
	"fmt"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/server"
)

// fuzzState is a small key-value store the fuzzed requests read.
func fuzzState(t testing.TB) *fsm.State {
	st := fsm.NewState()
	for i, k := range []string{"a", "a/1", "a/2", "ab", "b", "b/ü", "\x00", "z", "app/x", "app0"} {
		c := &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: k, Value: bytes.Repeat([]byte{'v'}, i*7)}}}
		if r := st.Apply(c, nil); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	return st
}

// inSpan reports whether k is in [key, end) in etcd's convention.
func inSpan(k, key, end []byte) bool {
	switch {
	case len(end) == 0:
		return bytes.Equal(k, key)
	case len(end) == 1 && end[0] == 0:
		return bytes.Compare(k, key) >= 0
	}
	return bytes.Compare(k, key) >= 0 && bytes.Compare(k, end) < 0
}

// checkSpan: the right a span needs covers every key of the span (a
// right on a name, or under a prefix, that every key of the span has).
func checkSpan(t *testing.T, key, end []byte) {
	r := spanRight(key, end, fsm.AccessRead)
	probes := [][]byte{key, append(bytes.Clone(key), 0), append(bytes.Clone(key), 0xff), end, []byte("a"), []byte("zz"), {0}, {0xff, 0xff}}
	if len(end) > 0 {
		probes = append(probes, end[:len(end)-1], append(bytes.Clone(end[:len(end)-1]), 0xff))
	}
	sec := fsm.NewState().Security()
	for _, k := range probes {
		if !inSpan(k, key, end) {
			continue
		}
		// A policy that grants exactly the right's name (or prefix) must
		// reach k: the right names a prefix of every key of the span.
		name, under := rightName(r)
		if under && !bytes.HasPrefix(k, []byte(name)) || !under && string(k) != name {
			t.Fatalf("span [%q, %q) needs %v, which does not cover %q", key, end, r, k)
		}
	}
	_ = sec
}

// rightName is the name of r and whether it covers every name under it.
func rightName(r server.Right) (string, bool) {
	s := fmt.Sprint(r)
	var name string
	if _, err := fmt.Sscanf(s, "kv read on every name under %q", &name); err == nil {
		return name, true
	}
	if _, err := fmt.Sscanf(s, "kv read on %q", &name); err == nil {
		return name, false
	}
	panic("unexpected right " + s)
}

// FuzzRequests decodes etcd API requests from untrusted bytes and runs
// what the API does with one before it reaches the state machine: the
// checks, the rights, the conversion to a command, the answer's measure.
// It asserts that the rights of a span cover every key of it, that a
// permission's prefix spans exactly the permission's keys, and that the
// measured answer (fsm.RangeCost) is never smaller than the answer.
func FuzzRequests(f *testing.F) {
	seeds := []proto.Message{
		&pb.RangeRequest{Key: []byte("a/"), RangeEnd: []byte("a0")},
		&pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, SortOrder: pb.RangeRequest_DESCEND, SortTarget: pb.RangeRequest_VALUE, Limit: 2},
		&pb.TxnRequest{Compare: []*pb.Compare{{Key: []byte("a"), Target: pb.Compare_VALUE, TargetUnion: &pb.Compare_Value{Value: []byte("x")}}},
			Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("a"), RangeEnd: []byte("b")}}}},
			Failure: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("a"), Value: []byte("y")}}}}},
		&pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("a"), Limit: 1, KeysOnly: true, MinModRevision: 2}}}}},
		&pb.DeleteRangeRequest{Key: []byte("a"), RangeEnd: []byte{0}, PrevKv: true},
		&pb.WatchCreateRequest{Key: []byte("app/"), RangeEnd: []byte("app0")},
		&pb.AuthRoleGrantPermissionRequest{Name: "r", Perm: nil},
	}
	for i, m := range seeds {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(byte(i), b)
	}
	s := &Server{limits: server.DefaultLimits().KV, cfg: Config{MaxResponseBytes: DefaultMaxResponseBytes}}
	st := fuzzState(f)
	f.Fuzz(func(t *testing.T, kind byte, data []byte) {
		switch kind % 6 {
		case 0:
			r := &pb.RangeRequest{}
			if proto.Unmarshal(data, r) != nil || s.checkRange(r) != nil {
				return
			}
			checkSpan(t, r.Key, r.RangeEnd)
			checkCost(t, st, r)
		case 1, 2:
			r := &pb.TxnRequest{}
			if proto.Unmarshal(data, r) != nil || s.checkTxn(r) != nil {
				return
			}
			_ = txnRights(r)
			cmd, err := txnCommand(r)
			if err != nil {
				return
			}
			var cost answerCost
			cost.txnCost(st, r)
			if reads, _ := readOnly(r); reads && fsm.ValidateKVTxn(cmd) == nil {
				for _, branch := range [][]*pb.RequestOp{r.Success, r.Failure} {
					for _, op := range branch {
						checkCost(t, st, op.GetRequestRange())
					}
				}
			}
		case 3:
			r := &pb.DeleteRangeRequest{}
			if proto.Unmarshal(data, r) != nil || s.checkDelete(r) != nil {
				return
			}
			checkSpan(t, r.Key, r.RangeEnd)
		case 4:
			r := &pb.WatchCreateRequest{}
			if proto.Unmarshal(data, r) != nil {
				return
			}
			key := r.Key
			if len(key) == 0 {
				key = []byte{0}
			}
			checkSpan(t, key, r.RangeEnd)
		case 5:
			r := &pb.AuthRoleGrantPermissionRequest{}
			if proto.Unmarshal(data, r) != nil || r.Perm == nil {
				return
			}
			prefix, err := prefixOf(r.Perm.Key, r.Perm.RangeEnd)
			if err != nil {
				return
			}
			// The prefix's keys are exactly the permission's.
			for _, k := range [][]byte{r.Perm.Key, []byte(prefix), append([]byte(prefix), 'x'), r.Perm.RangeEnd, []byte("m")} {
				if bytes.HasPrefix(k, []byte(prefix)) != inSpan(k, r.Perm.Key, r.Perm.RangeEnd) && !(prefix == "" && len(k) == 0) {
					t.Fatalf("permission [%q, %q) became prefix %q, which differs on %q", r.Perm.Key, r.Perm.RangeEnd, prefix, k)
				}
			}
		}
	})
}

// checkCost: the measure of r's answer is at least the answer.
func checkCost(t *testing.T, st *fsm.State, r *pb.RangeRequest) {
	if r == nil {
		return
	}
	q, _ := rangeQuery(r)
	if fsm.ValidateRangeQuery(&q) != nil {
		return
	}
	c := st.RangeCost(q)
	a := st.Range(q)
	var n int64
	for _, kv := range a.KVs {
		n += int64(len(kv.Key) + len(kv.Value))
	}
	if c.Keys < int64(len(a.KVs)) || c.Bytes < n {
		t.Fatalf("range %v: measured %d keys, %d bytes; the answer has %d keys, %d bytes", r, c.Keys, c.Bytes, len(a.KVs), n)
	}
}
