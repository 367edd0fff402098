package store_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/tenure-io/tenure/internal/store"
)

func TestReopenKeepsLogAndStable(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			dir := t.TempDir()
			s, err := store.Open(dir, engine)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Log.StoreLogs([]*raft.Log{{Index: 1, Term: 1, Data: []byte("a")}, {Index: 2, Term: 1, Data: []byte("b")}}); err != nil {
				t.Fatal(err)
			}
			if err := s.Stable.SetUint64([]byte("term"), 7); err != nil {
				t.Fatal(err)
			}
			s.Close()
			s, err = store.Open(dir, "")
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var l raft.Log
			if err := s.Log.GetLog(2, &l); err != nil || string(l.Data) != "b" {
				t.Fatalf("log 2 after reopen: %q %v", l.Data, err)
			}
			if v, err := s.Stable.GetUint64([]byte("term")); err != nil || v != 7 {
				t.Fatalf("term after reopen: %d %v", v, err)
			}
		})
	}
}

// BenchmarkStoreLogs measures one fsynced append of a batch of small
// entries, per engine: the floor under every commit.
func BenchmarkStoreLogs(b *testing.B) {
	for _, engine := range store.Engines {
		for _, n := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/batch=%d", engine, n), func(b *testing.B) {
				s, err := store.Open(b.TempDir(), engine)
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				idx := uint64(1)
				data := make([]byte, 48)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					logs := make([]*raft.Log, n)
					for j := range logs {
						logs[j] = &raft.Log{Index: idx, Term: 1, Type: raft.LogCommand, Data: data}
						idx++
					}
					if err := s.Log.StoreLogs(logs); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// TestDefaultEngine: a new directory gets raft-boltdb; a directory created
// with raft-wal keeps it when no engine is named.
func TestDefaultEngine(t *testing.T) {
	fresh := t.TempDir()
	s, err := store.Open(fresh, "")
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := os.Stat(filepath.Join(fresh, "raft.db")); err != nil {
		t.Fatalf("a new directory did not get the bolt engine: %v", err)
	}
	if _, err := os.Stat(filepath.Join(fresh, "wal")); err == nil {
		t.Fatal("a new directory got a wal")
	}

	walDir := t.TempDir()
	s, err = store.Open(walDir, "wal")
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = store.Open(walDir, "")
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := os.Stat(filepath.Join(walDir, "raft.db")); err == nil {
		t.Fatal("reopening a wal directory without naming the engine created a bolt file")
	}
}

// TestBoltInUseIsRefusedQuickly: a second process (here, a second open) on
// a bolt data directory gets a clear error instead of waiting forever.
func TestBoltInUseIsRefusedQuickly(t *testing.T) {
	dir := t.TempDir()
	s, err := store.Open(dir, "bolt")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = store.Open(dir, "bolt")
	if err == nil || !strings.Contains(err.Error(), "locked by another process") {
		t.Fatalf("second open: %v, want a locked error", err)
	}
}
