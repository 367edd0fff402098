package fsm_test

// Fuzz targets for every decoder of bytes the state machine takes in: log
// entries (commands, framed or bare), snapshots, ACL rules and names. Their
// seed corpora are under testdata/fuzz/<target>/; TENURE_WRITE_FUZZ_SEEDS=1
// rewrites them from fuzzSeeds (TestWriteFuzzSeeds).

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// seedCommands is a history touching each part of the state: sessions,
// locks, registers, the key-value store (a paged transaction with a
// bound), queues and the ACLs.
func seedCommands() []*fsmpb.Command {
	secret := fsm.HashSecret([]byte("0123456789abcdef"))
	cmd := func(c *fsmpb.Command) *fsmpb.Command { return c }
	txn := &fsmpb.KVTxn{
		Compares: []*fsmpb.KVCompare{{Key: "k/a", Target: fsm.CompareVersion, Result: fsm.CompareGreater, Number: 0}},
		Success: []*fsmpb.KVOp{
			{Op: &fsmpb.KVOp_Put{Put: &fsmpb.KVPut{Key: "k/b", Value: []byte("2")}}},
			{Op: &fsmpb.KVOp_Range{Range: &fsmpb.KVRange{Key: "k/", Prefix: true}}},
		},
		Failure: []*fsmpb.KVOp{{Op: &fsmpb.KVOp_Delete{Delete: &fsmpb.KVDelete{Key: "k/", Prefix: true}}}},
		Paged:   true, MaxAnswerBytes: 1 << 20,
	}
	return []*fsmpb.Command{
		cmd(&fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: "w1", TtlMs: 10_000, SecretHash: secret}}}),
		cmd(&fsmpb.Command{Op: &fsmpb.Command_Acquire{Acquire: &fsmpb.Acquire{Session: 1, Name: "jobs/1", Wait: true}}}),
		cmd(&fsmpb.Command{Op: &fsmpb.Command_FencedPut{FencedPut: &fsmpb.FencedPut{Key: "reg", Value: []byte("v"), Token: 2, Lock: "jobs/1"}}}),
		cmd(&fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: "k/a", Value: []byte("1")}}}),
		cmd(&fsmpb.Command{Op: &fsmpb.Command_KvTxn{KvTxn: txn}}),
		cmd(&fsmpb.Command{Op: &fsmpb.Command_QueueEnqueue{QueueEnqueue: &fsmpb.QueueEnqueue{Queue: "q", Payload: []byte("p"), OperationId: "op1"}}}),
		cmd(&fsmpb.Command{Op: &fsmpb.Command_QueueEnqueueBatch{QueueEnqueueBatch: &fsmpb.QueueEnqueueBatch{Queue: "q", Items: fsm.AppendBatchItem(nil, []byte("p2"), "op2")}}}),
		cmd(&fsmpb.Command{Op: &fsmpb.Command_QueueDequeue{QueueDequeue: &fsmpb.QueueDequeue{Queue: "q", Session: 1, VisibilityMs: 1000, ReceiptHash: secret}}}),
		cmd(&fsmpb.Command{Op: &fsmpb.Command_AclBootstrap{AclBootstrap: &fsmpb.AclBootstrap{Token: &fsmpb.AclToken{Id: "root", SecretHash: secret, Policies: []string{"management"}}}}}),
		cmd(&fsmpb.Command{Op: &fsmpb.Command_AclPolicySet{AclPolicySet: &fsmpb.AclPolicySet{Policy: &fsmpb.AclPolicy{Name: "worker", Rules: []*fsmpb.AclRule{{Kind: "lock", Prefix: "jobs/", Access: "write"}}}}}}),
		cmd(&fsmpb.Command{Op: &fsmpb.Command_Release{Release: &fsmpb.Release{Session: 1, Name: "jobs/1"}}}),
		cmd(&fsmpb.Command{Op: &fsmpb.Command_Batch{Batch: &fsmpb.Batch{Commands: []*fsmpb.Command{
			{Op: &fsmpb.Command_KvDelete{KvDelete: &fsmpb.KVDelete{Key: "k/a"}}},
			{Op: &fsmpb.Command_CloseSession{CloseSession: &fsmpb.CloseSession{Session: 1}}},
		}}}}),
	}
}

// appendCommands appends each command, length-delimited: the input of
// FuzzApplyCommands.
func appendCommands(b []byte, cmds ...*fsmpb.Command) []byte {
	for _, c := range cmds {
		enc, err := proto.Marshal(c)
		if err != nil {
			panic(err)
		}
		b = protowire.AppendBytes(b, enc)
	}
	return b
}

// applyAll applies the length-delimited commands of data to a new state,
// checking after each that its indexes hold; the commands that do not
// decode are skipped (as DecodeEntry would refuse them).
func applyAll(t *testing.T, data []byte) *fsm.State {
	st := fsm.NewState()
	for i := 0; len(data) > 0 && i < 64; i++ {
		enc, n := protowire.ConsumeBytes(data)
		if n < 0 {
			break
		}
		data = data[n:]
		var cmd fsmpb.Command
		if proto.Unmarshal(enc, &cmd) != nil {
			continue
		}
		st.Apply(&cmd, nil)
		if err := st.CheckIndexes(); err != nil {
			t.Fatalf("after command %d (%v): %v", i, &cmd, err)
		}
	}
	return st
}

// FuzzApplyCommands applies a sequence of decoded commands to a new
// state: nothing panics, the state's indexes hold after each command, the
// same commands give the same state twice (Apply reads nothing but the
// state and the command), and the state survives a snapshot: what Export
// gives, Import takes back and exports the same.
func FuzzApplyCommands(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		a := applyAll(t, data)
		b := applyAll(t, data)
		ea, eb := a.Export(), b.Export()
		if !proto.Equal(ea, eb) {
			t.Fatal("the same commands gave two states")
		}
		st, err := fsm.Import(ea)
		if err != nil {
			t.Fatalf("the state's own snapshot does not import: %v", err)
		}
		if !proto.Equal(st.Export(), ea) {
			t.Fatal("a snapshot imported and exported again differs")
		}
	})
}

// FuzzDecodeEntry decodes a raft log entry: nothing panics, an entry that
// decodes encodes (framed) to an entry that decodes to the same command,
// and a framed entry with a byte of its command changed is refused.
func FuzzDecodeEntry(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		var cmd fsmpb.Command
		if err := fsm.DecodeEntry(data, &cmd); err != nil {
			return
		}
		enc, err := fsm.EncodeEntry(&cmd, 0)
		if err != nil {
			t.Fatalf("a decoded command does not encode: %v", err)
		}
		var again fsmpb.Command
		if err := fsm.DecodeEntry(enc, &again); err != nil || !proto.Equal(&cmd, &again) {
			t.Fatalf("re-encoded entry: %v, equal %v", err, proto.Equal(&cmd, &again))
		}
		if len(enc) > 5 {
			enc[len(enc)-1] ^= 0x40
			if err := fsm.CheckEntry(enc); err == nil {
				t.Fatal("a framed entry with a changed byte passed its checksum")
			}
		}
	})
}

// FuzzReadSnapshot reads a snapshot from bytes: nothing panics (nor
// allocates what the bytes merely claim); bytes that are not a snapshot
// are an error; a snapshot that is read exports, is written and read
// again to the same state.
func FuzzReadSnapshot(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := fsm.ReadSnapshot(bytes.NewReader(data))
		if err != nil {
			return
		}
		snap := st.Export()
		enc, err := proto.Marshal(snap)
		if err != nil {
			t.Fatal(err)
		}
		again, err := fsm.ReadSnapshot(bytes.NewReader(enc))
		if err != nil {
			t.Fatalf("a snapshot read and written again does not read: %v", err)
		}
		if !proto.Equal(again.Export(), snap) {
			t.Fatal("a snapshot read, written and read again differs")
		}
	})
}

// FuzzParseRule parses an ACL rule: one that parses prints as a rule that
// parses to the same rule, and is valid as a policy's rule.
func FuzzParseRule(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) {
		r, err := fsm.ParseRule(s)
		if err != nil {
			if !errors.Is(err, fsm.ErrInvalid) {
				t.Fatalf("ParseRule(%q): %v is not ErrInvalid", s, err)
			}
			return
		}
		again, err := fsm.ParseRule(r.String())
		if err != nil || again != r {
			t.Fatalf("ParseRule(%q) = %+v, printed %q, parsed again %+v, %v", s, r, r.String(), again, err)
		}
		st := fsm.NewState()
		res := st.Apply(&fsmpb.Command{Op: &fsmpb.Command_AclPolicySet{AclPolicySet: &fsmpb.AclPolicySet{Policy: &fsmpb.AclPolicy{Name: "p", Rules: []*fsmpb.AclRule{{Kind: string(r.Kind), Prefix: r.Prefix, Access: r.Access.String()}}}}}}, nil)
		if res.Err != nil {
			t.Fatalf("rule %q parses but a policy of it is refused: %v", s, res.Err)
		}
	})
}

// FuzzValidateACLName checks a policy name or token id: it is accepted
// exactly when it is 1..128 bytes of letters, digits, '-', '_' and '.'.
func FuzzValidateACLName(f *testing.F) {
	f.Fuzz(func(t *testing.T, name string) {
		want := len(name) >= 1 && len(name) <= 128
		for i := 0; i < len(name); i++ {
			c := name[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
				want = false
			}
		}
		err := fsm.ValidateACLName("policy name", name)
		if (err == nil) != want {
			t.Fatalf("ValidateACLName(%q) = %v, want accepted %v", name, err, want)
		}
		if err != nil && !errors.Is(err, fsm.ErrInvalid) {
			t.Fatalf("ValidateACLName(%q): %v is not ErrInvalid", name, err)
		}
	})
}

// fuzzSeeds are the seed corpora: target → seeds, each the target's
// arguments.
func fuzzSeeds(t *testing.T) map[string][][]any {
	cmds := seedCommands()
	var entries [][]any
	for _, c := range cmds[:6] {
		framed, err := fsm.EncodeEntry(c, 0)
		if err != nil {
			t.Fatal(err)
		}
		bare, _ := proto.Marshal(c)
		entries = append(entries, []any{framed}, []any{bare})
	}
	var snaps [][]any
	st := fsm.NewState()
	snaps = append(snaps, []any{mustMarshal(t, st.Export())})
	for i, c := range cmds {
		st.Apply(c, nil)
		if i == 4 || i == 7 || i == len(cmds)-1 {
			snaps = append(snaps, []any{mustMarshal(t, st.Export())})
		}
	}
	return map[string][][]any{
		"FuzzApplyCommands": {
			{appendCommands(nil, cmds...)},
			{appendCommands(nil, cmds[:5]...)},
			{appendCommands(nil, cmds[0], cmds[1], cmds[10], cmds[1])},
			{appendCommands(nil, cmds[5:8]...)},
		},
		"FuzzDecodeEntry":     entries,
		"FuzzReadSnapshot":    snaps,
		"FuzzParseRule":       {{"lock:jobs/:write"}, {"kv::read"}, {"cluster::write"}, {"queue:a:b:deny"}, {"session:x:read"}, {"fence:r/:write"}},
		"FuzzValidateACLName": {{"management"}, {"ci-runner_2.prod"}, {""}, {"bad name"}, {strings.Repeat("a", 128)}},
	}
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestWriteFuzzSeeds rewrites testdata/fuzz from fuzzSeeds when
// TENURE_WRITE_FUZZ_SEEDS is set (after a format change).
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("TENURE_WRITE_FUZZ_SEEDS") == "" {
		t.Skip("set TENURE_WRITE_FUZZ_SEEDS=1 to rewrite testdata/fuzz")
	}
	writeFuzzSeeds(t, fuzzSeeds(t))
}

// writeFuzzSeeds writes seeds in Go's corpus format under testdata/fuzz.
func writeFuzzSeeds(t *testing.T, seeds map[string][][]any) {
	for target, list := range seeds {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, args := range list {
			var b strings.Builder
			b.WriteString("go test fuzz v1\n")
			for _, a := range args {
				switch v := a.(type) {
				case []byte:
					fmt.Fprintf(&b, "[]byte(%q)\n", v)
				case string:
					fmt.Fprintf(&b, "string(%q)\n", v)
				default:
					t.Fatalf("seed argument of type %T", a)
				}
			}
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed%02d", i)), []byte(b.String()), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestReadSnapshotClaimedLength: a snapshot field whose length claims 16
// GiB in a file of 11 bytes (found by FuzzReadSnapshot) is refused
// without allocating what it claims; before, the node allocated the
// 16 GiB first.
func TestReadSnapshotClaimedLength(t *testing.T) {
	for _, num := range []protowire.Number{3, 11, 100} { // a field of the core, the queue items, an unknown one
		b := protowire.AppendVarint(protowire.AppendTag(nil, num, protowire.BytesType), 1<<34)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := fsm.ReadSnapshot(bytes.NewReader(b))
		runtime.ReadMemStats(&after)
		if err == nil {
			t.Fatalf("field %d: a snapshot cut short was read", num)
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
			t.Fatalf("field %d: reading 11 bytes allocated %d MiB", num, grew>>20)
		}
	}
}

// TestReadSnapshotEmptyQueueChunk: a snapshot whose queue items chunk
// holds no item (found by FuzzReadSnapshot) is read as an empty queue;
// before, reading it panicked (index out of range).
func TestReadSnapshotEmptyQueueChunk(t *testing.T) {
	core := mustMarshal(t, &fsmpb.Snapshot{Revision: 5, Queues: []*fsmpb.QueueState{{Name: "q", MaxAttempts: 3}}})
	chunk := mustMarshal(t, &fsmpb.QueueItems{Queue: "q"})
	data := protowire.AppendBytes(protowire.AppendTag(core, 11, protowire.BytesType), chunk)
	st, err := fsm.ReadSnapshot(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("a snapshot with an empty chunk of queue items: %v", err)
	}
	if qs := st.Export().GetQueues(); len(qs) != 1 || qs[0].GetName() != "q" || len(qs[0].GetReady()) != 0 {
		t.Fatalf("queues read: %v", qs)
	}
}

// TestReadSnapshotQueueItemIDZero: a snapshot listing a queue item of id
// 0 (found by FuzzReadSnapshot) is refused; before, it was read, and the
// snapshot the node then wrote could not be read back (its chunks hold
// increasing ids from 1).
func TestReadSnapshotQueueItemIDZero(t *testing.T) {
	for _, qs := range []*fsmpb.QueueState{
		{Name: "q", MaxAttempts: 3, Dead: []*fsmpb.QueueItemState{{Id: 0, Payload: []byte("x")}}},
		{Name: "q", MaxAttempts: 3, Ready: []*fsmpb.QueueItemState{{Id: 0}}},
		{Name: "q", MaxAttempts: 3, InFlight: []*fsmpb.QueueItemState{{Id: 0}}},
	} {
		data := mustMarshal(t, &fsmpb.Snapshot{Revision: 5, Queues: []*fsmpb.QueueState{qs}})
		if _, err := fsm.ReadSnapshot(bytes.NewReader(data)); err == nil {
			t.Fatalf("a snapshot with a queue item of id 0 was read: %v", qs)
		}
	}
}
