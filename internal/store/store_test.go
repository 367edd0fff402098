package store_test

import (
	"fmt"
	"io"
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
			s, err := store.Open(dir, engine, io.Discard)
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
		s, err := store.Open(dir, "", io.Discard)
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
				s, err := store.Open(b.TempDir(), engine, io.Discard)
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
	s, err := store.Open(fresh, "", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s.Engine != "wal" {
		t.Fatalf("a new directory got engine %q", s.Engine)
	}
	s.Close()
	if _, err := os.Stat(filepath.Join(fresh, "wal")); err != nil {
		t.Fatalf("a new directory did not get the wal engine: %v", err)
	}
	if _, err := os.Stat(filepath.Join(fresh, "raft.db")); err == nil {
		t.Fatal("a new directory got a bolt file")
	}

	boltDir := t.TempDir()
	s, err = store.Open(boltDir, "bolt", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = store.Open(boltDir, "", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s.Engine != "bolt" {
		t.Fatalf("a bolt directory reopened with engine %q", s.Engine)
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
			if _, err := store.Open(dir, second, io.Discard); err == nil || !strings.Contains(err.Error(), "locked by another process") {
				t.Fatalf("second open (engine %q): %v, want a locked error", second, err)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s, err := store.Open(dir, "", io.Discard)
		if err != nil {
			t.Fatalf("open after close: %v", err)
		}
		s.Close()
	})
}

// TestMissingWALMetaRefused: a wal directory whose metadata database is
// gone, with its segment files still there, is refused with one line
// naming the file (raft-wal alone fails with "file exists", or would
// start an empty log over the old segments).
func TestMissingWALMetaRefused(t *testing.T) {
	dir := t.TempDir()
	s, err := store.Open(dir, "wal", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Log.StoreLogs([]*raft.Log{{Index: 1, Term: 1, Data: []byte("a")}}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	meta := filepath.Join(dir, "wal", "wal-meta.db")
	if err := os.Remove(meta); err != nil {
		t.Fatal(err)
	}
	_, err = store.Open(dir, "", io.Discard)
	if err == nil || !strings.Contains(err.Error(), meta+" is missing") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("open without the wal metadata: %v", err)
	}
}

// TestDamagedBoltRefused: a bolt file that is not a database any more is
// refused with one line naming it and what to do.
func TestDamagedBoltRefused(t *testing.T) {
	dir := t.TempDir()
	s, err := store.Open(dir, "bolt", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	path := filepath.Join(dir, "raft.db")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 8192 && i < len(b); i++ { // both meta pages
		b[i] ^= 0x5a
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = store.Open(dir, "", io.Discard)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "rebuild this member") {
		t.Fatalf("open of a damaged bolt file: %v", err)
	}
}

// TestFileOf: an entry's file is the bolt database, or the wal segment
// that starts at or below its index.
func TestFileOf(t *testing.T) {
	withEachEngine(t, func(t *testing.T, engine, dir string, s *store.Stores) {
		defer s.Close()
		if err := s.Log.StoreLogs([]*raft.Log{{Index: 1, Term: 1, Data: []byte("a")}}); err != nil {
			t.Fatal(err)
		}
		want := filepath.Join(dir, "raft.db")
		if engine == "wal" {
			want = filepath.Join(dir, "wal", "00000000000000000001-0000000000000000.wal")
		}
		if got := s.FileOf(1); got != want {
			t.Fatalf("FileOf(1) = %s, want %s", got, want)
		}
	})
}

// TestDamagedWALMetaRefused: raft-wal's metadata database overwritten is
// one line naming the directory and what to do.
func TestDamagedWALMetaRefused(t *testing.T) {
	dir := t.TempDir()
	s, err := store.Open(dir, "wal", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	meta := filepath.Join(dir, "wal", "wal-meta.db")
	if err := os.WriteFile(meta, []byte(strings.Repeat("garbage ", 2048)), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = store.Open(dir, "", io.Discard)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "wal")) || !strings.Contains(err.Error(), "rebuild this member") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("open with damaged wal metadata: %v", err)
	}
}
