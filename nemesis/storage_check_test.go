//go:build linux || darwin

package nemesis

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
)

// TestCorruptLogHitsOneCommand: corrupt-restart's corruption lands inside
// one entry's command: read back with raft-wal, exactly one entry's data
// differs from what was stored, in 16 bytes, and every index and term is
// intact.
func TestCorruptLogHitsOneCommand(t *testing.T) {
	dataDir := t.TempDir()
	walDir := filepath.Join(dataDir, "raft", "wal")
	if err := os.MkdirAll(walDir, 0o755); err != nil {
		t.Fatal(err)
	}
	data := func(i int) []byte { return bytes.Repeat([]byte(fmt.Sprintf("command %05d;", i)), 10) }
	w, err := raftwal.Open(walDir)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 300; i++ { // one append per entry, as raft's are
		if err := w.StoreLogs([]*raft.Log{{Index: uint64(i), Term: 1, Type: raft.LogCommand, Data: data(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	what, err := corruptLog(dataDir, rand.New(rand.NewPCG(1, 2)))
	if err != nil {
		t.Fatal(err)
	}
	t.Log(what)

	w, err = raftwal.Open(walDir)
	if err != nil {
		t.Fatalf("raft-wal refuses the corrupted log (%v): then the fault tests nothing of the server", err)
	}
	defer w.Close()
	changed := 0
	for i := 1; i <= 300; i++ {
		var l raft.Log
		if err := w.GetLog(uint64(i), &l); err != nil {
			first, _ := w.FirstIndex()
			last, _ := w.LastIndex()
			t.Fatalf("entry %d: %v (log %d..%d)", i, err, first, last)
		}
		if l.Index != uint64(i) || l.Term != 1 {
			t.Fatalf("entry %d reads as index %d term %d", i, l.Index, l.Term)
		}
		if diff := countDiff(l.Data, data(i)); diff > 0 {
			changed++
			if diff != 16 || len(l.Data) != len(data(i)) {
				t.Errorf("entry %d: %d of %d bytes differ (read %d bytes)", i, diff, len(data(i)), len(l.Data))
			}
		}
	}
	if changed != 1 {
		t.Fatalf("%d entries changed, want 1", changed)
	}
}

func countDiff(a, b []byte) int {
	n := 0
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			n++
		}
	}
	return n + max(len(a), len(b)) - min(len(a), len(b))
}

// TestFaultFindings: what a fault found wrong becomes an anomaly under its
// check; holds across a pause are counted kept or lost.
func TestFaultFindings(t *testing.T) {
	const s = int64(1e9)
	faults := []Fault{
		{Kind: faultCorrupt, Target: "n2", Start: 10 * s, End: 12 * s, Anomalies: []anomaly{{checkCorruptRefused, "it started and served"}}},
		{Kind: faultDiskFull, Target: "n1", Start: 20 * s, End: 25 * s},
		{Kind: faultPauseLeader, Target: "n3", Start: 30 * s, End: 31 * s},
	}
	ops := []Op{
		{Client: "g0.0", Kind: kindAcquire, Outcome: outOK, Token: 7, Invoke: 29 * s, Complete: 29 * s},
		{Client: "g0.1", Kind: kindAcquire, Outcome: outOK, Token: 8, Invoke: 29 * s, Complete: 29 * s},
		{Client: "g0.0", Kind: kindRelease, Outcome: outOK, Token: 7, Invoke: 32 * s, Complete: 32 * s},
		{Client: "g0.1", Kind: kindRelease, Outcome: outLost, Token: 8, Invoke: 33 * s, Complete: 33 * s},
	}
	var r report
	checkFaultFindings(faults, &r)
	checkHoldsAcross(ops, faults, &r)
	if got := r.byCheck(); len(r.anomalies) != 1 || got[checkCorruptRefused] != 1 {
		t.Fatalf("anomalies %v", r.anomalies)
	}
	want := map[string]bool{
		"disk-full: 1 times the node caught up by itself once its disk had room again": true,
		"holds across pause-leader (1 faults): 1 kept, 1 lost or not confirmed":        true,
	}
	for _, l := range r.lines {
		delete(want, l)
	}
	if len(want) > 0 {
		t.Fatalf("lines %q lack %v", r.lines, want)
	}
}
