package server

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// TestFrontProposesOnlyAdmittedOps: a front's proposal is checked by the
// server before anything reaches the node: only the operations a front
// proposes are accepted, and a key or value over this node's limits is
// refused wherever it sits (a put, a delete's range end, a transaction's
// branch), whatever the front itself checked.
func TestFrontProposesOnlyAdmittedOps(t *testing.T) {
	s := &Server{limits: Limits{}.withDefaults()} // no node: nothing below may reach it
	lim := s.limits.KV
	longKey := strings.Repeat("k", lim.MaxKeyLen+1)
	bigValue := make([]byte, lim.MaxValueLen+1)
	for _, tc := range []struct {
		name string
		op   any
		want error
	}{
		{"value over the limit", &fsmpb.KVPut{Key: "a", Value: bigValue}, fsm.ErrInvalid},
		{"key over the limit", &fsmpb.KVPut{Key: longKey}, fsm.ErrInvalid},
		{"range end over the limit", &fsmpb.KVDelete{Key: "a", RangeEnd: []byte(longKey)}, fsm.ErrInvalid},
		{"transaction put over the limit", &fsmpb.KVTxn{Failure: []*fsmpb.KVOp{{Op: &fsmpb.KVOp_Put{Put: &fsmpb.KVPut{Key: "a", Value: bigValue}}}}}, fsm.ErrInvalid},
		{"transaction compare over the limit", &fsmpb.KVTxn{Compares: []*fsmpb.KVCompare{{Key: longKey}}}, fsm.ErrInvalid},
		{"transaction range over the limit", &fsmpb.KVTxn{Success: []*fsmpb.KVOp{{Op: &fsmpb.KVOp_Range{Range: &fsmpb.KVRange{Key: longKey}}}}}, fsm.ErrInvalid},
		{"enabling the ACLs", &fsmpb.AclEnable{}, errNoCommand},
		{"an acquire", &fsmpb.Acquire{Session: 1, Name: "l"}, errNoCommand},
		{"a queue's enqueue", &fsmpb.QueueEnqueue{Queue: "q"}, errNoCommand},
		{"not an operation", "put", errNoCommand},
	} {
		if _, err := s.Front().Propose(context.Background(), tc.op); !errors.Is(err, tc.want) {
			t.Errorf("%s: Propose = %v, want %v", tc.name, err, tc.want)
		}
	}
	for _, op := range []any{
		&fsmpb.KVPut{Key: strings.Repeat("k", lim.MaxKeyLen), Value: make([]byte, lim.MaxValueLen)},
		&fsmpb.KVDelete{Key: "a", RangeEnd: []byte{0}},
		&fsmpb.KVTxn{Success: []*fsmpb.KVOp{{Op: &fsmpb.KVOp_Put{Put: &fsmpb.KVPut{Key: "a", Value: []byte("v")}}}}},
		&fsmpb.CreateSession{Owner: "etcd", TtlMs: 2000, EtcdLease: true},
		&fsmpb.CloseSession{Session: 1},
		&fsmpb.SetEtcdURL{Member: "n1", Url: "http://127.0.0.1:2379"},
		&fsmpb.AclTokenUpdate{Id: "alice"},
	} {
		if err := s.admitFront(op); err != nil {
			t.Errorf("admitFront(%T) = %v, want it admitted", op, err)
		}
		if _, err := command(op); err != nil {
			t.Errorf("command(%T) = %v: a front's operation the builder does not build", op, err)
		}
	}
}
