package fsm

import (
	"bytes"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// TestHintedApplyEqualsDecodedApply: a replica that applies the commands it
// proposed from its hints ends in exactly the state, with exactly the
// results, of a replica that decodes every entry.
func TestHintedApplyEqualsDecodedApply(t *testing.T) {
	cmds := []*fsmpb.Command{
		{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: "a", TtlMs: 10_000}}},
		{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: "b", TtlMs: 10_000}}},
		{Op: &fsmpb.Command_Batch{Batch: &fsmpb.Batch{Commands: []*fsmpb.Command{
			{Op: &fsmpb.Command_Acquire{Acquire: &fsmpb.Acquire{Session: 1, Name: "L", Wait: true}}},
			{Op: &fsmpb.Command_Acquire{Acquire: &fsmpb.Acquire{Session: 2, Name: "L", Wait: true}}},
			{Op: &fsmpb.Command_FencedPut{FencedPut: &fsmpb.FencedPut{Key: "r", Value: []byte("v1"), Token: 3, OperationId: "op"}}},
		}}}},
		{Op: &fsmpb.Command_Release{Release: &fsmpb.Release{Session: 1, Name: "L", Token: 3}}},
		{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: "k", Value: []byte("x"), Session: 2}}},
		{Op: &fsmpb.Command_QueueEnqueue{QueueEnqueue: &fsmpb.QueueEnqueue{Queue: "q", Payload: []byte("p"), OperationId: "e1"}}},
		{Op: &fsmpb.Command_CloseSession{CloseSession: &fsmpb.CloseSession{Session: 2}}},
	}
	hinted, decoded := New(nil), New(nil)
	for i, c := range cmds {
		data, err := proto.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		l := &raft.Log{Index: uint64(i + 1), Type: raft.LogCommand, Data: data}
		hinted.Hint(data, c)
		rh := TakeResult(hinted.Apply(l))
		if len(hinted.hints) != 0 {
			t.Fatalf("command %d: the hint was not used", i)
		}
		rd := TakeResult(decoded.Apply(&raft.Log{Index: l.Index, Type: raft.LogCommand, Data: bytes.Clone(data)}))
		if rh.Revision != rd.Revision || rh.Token != rd.Token || rh.Granted != rd.Granted || (rh.Err == nil) != (rd.Err == nil) {
			t.Fatalf("command %d: hinted result %+v, decoded %+v", i, rh, rd)
		}
	}
	var eh, ed []byte
	hinted.Read(func(s *State) { eh, _ = proto.MarshalOptions{Deterministic: true}.Marshal(s.Export()) })
	decoded.Read(func(s *State) { ed, _ = proto.MarshalOptions{Deterministic: true}.Marshal(s.Export()) })
	if !bytes.Equal(eh, ed) {
		t.Fatal("the hinted replica's state differs from the decoding replica's")
	}
	// A hint for other bytes (or bytes of another length) is never used.
	data, _ := proto.Marshal(cmds[0])
	hinted.Hint(data[:len(data)-1], cmds[1])
	if hinted.takeHint(data) != nil {
		t.Fatal("a hint was used for bytes of another length")
	}
}
