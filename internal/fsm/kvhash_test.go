package fsm_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// hashScript is a history of every kind of key change: puts, a key bound
// to a session and ended with it, a delete, a transaction that writes a
// key twice, a binary key, and a compaction.
func hashScript() []*fsmpb.Command {
	cmds := []*fsmpb.Command{cmdSetClusterVersion(3), cmdCreate("o", 10_000)} // 1, 2: session 2
	for i := range 30 {
		sess := uint64(0)
		if i%7 == 0 {
			sess = 2
		}
		cmds = append(cmds, cmdKVPut(fmt.Sprintf("k%02d", i%9), fmt.Sprint("v", i), sess))
		if i%5 == 0 {
			cmds = append(cmds, cmdKVDelete(fmt.Sprintf("k%02d", i%4), false))
		}
	}
	cmds = append(cmds,
		cmdKVTxn(&fsmpb.KVTxn{Success: []*fsmpb.KVOp{opPut("t", "a", 0), opPut("t", "b", 0)}}),
		cmdKVPutOp(&fsmpb.KVPut{KeyBin: []byte("bin\xff"), Value: []byte("x")}),
		cmdCompact(20),
		cmdExpire(2),
		cmdKVPut("last", "1", 0),
	)
	return cmds
}

// TestKVHashGolden: HashKV's value for a fixed history is what it was
// when the hash was defined: members of different releases compare it
// (`etcdctl endpoint hashkv --cluster`), so a change of the walk must not
// change it. The values were computed by the walk under the state's lock
// that KVView replaced; the view answers the same.
func TestKVHashGolden(t *testing.T) {
	f := fsm.New(nil)
	var logs []*raft.Log
	for i, cmd := range hashScript() {
		logs = append(logs, logOf(t, uint64(i+1), cmd))
	}
	for i, r := range f.ApplyBatch(logs) {
		if res := fsm.TakeResult(r); res.Err != nil {
			t.Fatalf("entry %d: %v", i+1, res.Err)
		}
	}
	golden := map[uint64]uint32{20: 0x8cdfb48b, 30: 0xe5778356, 40: 0x3ca44df1, 0: 0x743b1405}
	for rev, want := range golden {
		var got uint32
		var hashRev, compactRev uint64
		var err error
		f.Read(func(st *fsm.State) { got, hashRev, compactRev, err = st.HashKV(rev) })
		if err != nil {
			t.Fatalf("at %d: %v", rev, err)
		}
		t.Logf("at %d: %#x (revision %d, compact revision %d)", rev, got, hashRev, compactRev)
		if got != want {
			t.Errorf("HashKV at %d: %#x, want %#x", rev, got, want)
		}
		if v, vRev, vCompact, err := f.KVView().HashKV(rev); err != nil || v != want || vRev != hashRev || vCompact != compactRev {
			t.Errorf("KVView.HashKV at %d: %#x %d %d %v, want %#x %d %d", rev, v, vRev, vCompact, err, want, hashRev, compactRev)
		}
	}
}

// TestKVViewStaysWhileApplyGoesOn: a view answers the hash of the state
// it was taken from while Apply overwrites, deletes and compacts (the
// walk runs beside the applies: -race checks that they share nothing
// written), and a revision after it is ErrFutureRevision.
func TestKVViewStaysWhileApplyGoesOn(t *testing.T) {
	f := fsm.New(nil)
	var logs []*raft.Log
	add := func(cmd *fsmpb.Command) { logs = append(logs, logOf(t, uint64(len(logs)+1), cmd)) }
	add(cmdSetClusterVersion(3))
	for i := range 2000 {
		add(cmdKVPut(fmt.Sprintf("k%04d", i%500), fmt.Sprint("v", i), 0))
	}
	f.ApplyBatch(logs)
	var want uint32
	var wantRev uint64
	f.Read(func(st *fsm.State) { want, wantRev, _, _ = st.HashKV(0) })
	v := f.KVView()
	done := make(chan struct{})
	go func() {
		defer close(done)
		var later []*raft.Log
		for i := range 1000 {
			cmd := cmdKVPut(fmt.Sprintf("k%04d", i%700), "changed", 0)
			switch i % 3 {
			case 1:
				cmd = cmdKVDelete(fmt.Sprintf("k%04d", i%500), false)
			case 2:
				cmd = cmdCompact(wantRev + uint64(i)/2)
			}
			later = append(later, logOf(t, uint64(len(logs)+len(later)+1), cmd))
			if len(later) == 10 {
				f.ApplyBatch(later)
				later = nil
			}
		}
		f.ApplyBatch(later)
	}()
	for range 20 {
		got, rev, _, err := v.HashKV(0)
		if err != nil || got != want || rev != wantRev {
			t.Fatalf("the view's hash: %#x at %d (%v), want %#x at %d", got, rev, err, want, wantRev)
		}
	}
	<-done
	if _, _, _, err := v.HashKV(wantRev + 1); !errors.Is(err, fsm.ErrFutureRevision) {
		t.Fatalf("the view at a revision after it: %v", err)
	}
	var now uint32
	f.Read(func(st *fsm.State) { now, _, _, _ = st.HashKV(0) })
	if now == want {
		t.Fatal("the state's hash did not change with the applies")
	}
}
