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

// withEachEngine runs fn in a subtest per engine, on stores newly opened
// in a directory of their own.
func withEachEngine(t *testing.T, fn func(t *testing.T, engine, dir string, s *store.Stores)) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			dir := t.TempDir()
			s, err := store.Open(dir, engine)
			if err != nil {
				t.Fatal(err)
			}
			fn(t, engine, dir, s)
		})
	}
}

func TestReopenKeepsLogAndStable(t *testing.T) {
	withEachEngine(t, func(t *testing.T, _, dir string, s *store.Stores) {
		if err := s.Log.StoreLogs([]*raft.Log{{Index: 1, Term: 1, Data: []byte("a")}, {Index: 2, Term: 1, Data: []byte("b")}}); err != nil {
			t.Fatal(err)
		}
		if err := s.Stable.SetUint64([]byte("term"), 7); err != nil {
			t.Fatal(err)
		}
		s.Close()
		s, err := store.Open(dir, "")
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

// TestDefaultEngine: a new directory gets raft-wal; a directory created
// with raft-boltdb keeps it when no engine is named.
func TestDefaultEngine(t *testing.T) {
	fresh := t.TempDir()
	s, err := store.Open(fresh, "")
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if fi, err := os.Stat(filepath.Join(fresh, "wal")); err != nil || !fi.IsDir() {
		t.Fatalf("a new directory did not get the wal engine: %v", err)
	}
	if _, err := os.Stat(filepath.Join(fresh, "raft.db")); err == nil {
		t.Fatal("a new directory got a bolt file")
	}

	boltDir := t.TempDir()
	s, err = store.Open(boltDir, "bolt")
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = store.Open(boltDir, "")
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := os.Stat(filepath.Join(boltDir, "wal")); err == nil {
		t.Fatal("reopening a bolt directory without naming the engine created a wal")
	}
}

// TestInUseIsRefusedQuickly: a second process (here, a second open) on a
// data directory in use gets a clear error at once instead of waiting or
// sharing the files, whatever the engine; once the first closes, the
// directory opens again.
func TestInUseIsRefusedQuickly(t *testing.T) {
	withEachEngine(t, func(t *testing.T, engine, dir string, s *store.Stores) {
		for _, second := range []string{engine, ""} {
			if _, err := store.Open(dir, second); err == nil || !strings.Contains(err.Error(), "locked by another process") {
				t.Fatalf("second open (engine %q): %v, want a locked error", second, err)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s, err := store.Open(dir, "")
		if err != nil {
			t.Fatalf("open after close: %v", err)
		}
		s.Close()
	})
}
