package fsm_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// TestNoCommandEncodingLooksFramed: the frame's marker byte, and every
// byte one bit away from it, can start no protobuf message (field number
// 0 or wire type 7), so a bare entry written before the frame existed is
// never read as framed, and a framed entry whose marker lost a bit is not
// decoded as a bare one.
func TestNoCommandEncodingLooksFramed(t *testing.T) {
	payload := []byte{0x01, 0x02, 0x03, 0x04, 0x0a, 0x00}
	firsts := []byte{0x07}
	for bit := 0; bit < 8; bit++ {
		firsts = append(firsts, 0x07^(1<<bit))
	}
	for _, b := range firsts {
		if err := proto.Unmarshal(append([]byte{b}, payload...), &fsmpb.Command{}); err == nil {
			t.Errorf("bytes starting %#02x decode as a Command", b)
		}
	}
	for _, c := range script() {
		data, err := proto.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		if fsm.Framed(data) {
			t.Fatalf("the encoding of %v looks framed", c)
		}
	}
}

// TestEntryRoundTripAndBareEntriesStillRead: a framed entry decodes to its
// command; an entry written by an older version (the bare encoding) is
// still read and applied.
func TestEntryRoundTripAndBareEntriesStillRead(t *testing.T) {
	cmd := cmdCreate("a", 10_000)
	data, err := fsm.EncodeEntry(cmd, proto.Size(cmd))
	if err != nil {
		t.Fatal(err)
	}
	got := &fsmpb.Command{}
	if err := fsm.DecodeEntry(data, got); err != nil || !proto.Equal(got, cmd) {
		t.Fatalf("decoded %v, %v; want %v", got, err, cmd)
	}
	bare, _ := proto.Marshal(cmd)
	f := fsm.New(nil)
	if r := fsm.TakeResult(f.Apply(&raft.Log{Index: 1, Type: raft.LogCommand, Data: bare})); r.Err != nil || r.Session != 1 {
		t.Fatalf("bare entry: %+v", r)
	}
	if r := fsm.TakeResult(f.Apply(&raft.Log{Index: 2, Type: raft.LogCommand, Data: data})); r.Err != nil || r.Session != 2 {
		t.Fatalf("framed entry after a bare one: %+v", r)
	}
}

// TestCorruptEntryStopsTheStateMachine: an entry that fails its checksum,
// or does not decode, is not applied as a no-op: the state machine stops
// with an error naming the entry's index, leaves the state as it was before
// it, applies nothing after it (in the same batch or later), and takes no
// snapshot; every replica with the same bytes stops at the same place.
func TestCorruptEntryStopsTheStateMachine(t *testing.T) {
	good := func(i uint64) *raft.Log { return logOf(t, i, cmdCreate("a", 10_000)) }
	flipped := good(3)
	flipped.Data[len(flipped.Data)-1] ^= 0x10
	short := good(3)
	short.Data = short.Data[:3]
	bareAfterFramed := good(3)
	bareAfterFramed.Data, _ = proto.Marshal(cmdCreate("a", 10_000))
	cases := map[string]*raft.Log{
		"flipped bit":             flipped,
		"cut short":               short,
		"bare garbage":            {Index: 3, Type: raft.LogCommand, Data: []byte{0xff, 0xff, 0xff}},
		"bare after framed":       bareAfterFramed,
		"payload does not decode": reframe(3, []byte{0xff, 0xff, 0xff}),
	}
	for name, bad := range cases {
		t.Run(name, func(t *testing.T) {
			f := fsm.New(nil)
			f.ApplyBatch([]*raft.Log{good(1), good(2)})
			before := fsmExport(t, f)
			out := f.ApplyBatch([]*raft.Log{bad, good(4)})
			var ce *fsm.CorruptEntryError
			for i, o := range out {
				r := fsm.TakeResult(o)
				if !errors.Is(r.Err, fsm.ErrCorrupt) || !errors.As(r.Err, &ce) || ce.Index != 3 {
					t.Fatalf("result %d of the batch: %+v, want the corrupt entry 3", i, r)
				}
			}
			if err := f.Err(); !errors.As(err, &ce) || ce.Index != 3 {
				t.Fatalf("Err() = %v", err)
			}
			select {
			case <-f.Failed():
			default:
				t.Fatal("Failed() not closed")
			}
			if r := fsm.TakeResult(f.Apply(good(5))); !errors.Is(r.Err, fsm.ErrCorrupt) {
				t.Fatalf("an entry after the corrupt one was applied: %+v", r)
			}
			if !bytes.Equal(before, fsmExport(t, f)) {
				t.Fatal("the state changed after the corrupt entry")
			}
			if _, err := f.Snapshot(); err == nil {
				t.Fatal("a stopped state machine took a snapshot")
			}
		})
	}
}

// reframe frames payload, which need not be a Command, with a checksum
// that matches it.
func reframe(index uint64, payload []byte) *raft.Log {
	data := binary.LittleEndian.AppendUint32([]byte{0x07}, crc32.Checksum(payload, crc32.MakeTable(crc32.Castagnoli)))
	return &raft.Log{Index: index, Type: raft.LogCommand, Data: append(data, payload...)}
}

// TestCorruptSnapshotStopsTheStateMachine: a snapshot that does not decode
// stops the state machine, so raft cannot fall back to an older snapshot
// (whose log may be gone) behind it.
func TestCorruptSnapshotStopsTheStateMachine(t *testing.T) {
	f := fsm.New(nil)
	f.Apply(logOf(t, 1, cmdCreate("a", 10_000)))
	if err := f.Restore(io.NopCloser(bytes.NewReader([]byte{0xff, 0xff}))); !errors.Is(err, fsm.ErrCorrupt) {
		t.Fatalf("Restore of garbage: %v", err)
	}
	if !errors.Is(f.Err(), fsm.ErrCorrupt) {
		t.Fatalf("Err() after a corrupt snapshot: %v", f.Err())
	}
	good, _ := proto.Marshal(fsm.NewState().Export())
	if err := f.Restore(io.NopCloser(bytes.NewReader(good))); err == nil {
		t.Fatal("a stopped state machine restored a snapshot")
	}
}
