package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/testutil"
)

// smallFS mounts a tmpfs of size bytes for the test and returns its path;
// it is unmounted when the test ends. Mounting needs root: the test is
// skipped otherwise (CI runs as root).
func smallFS(t *testing.T, size int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a size-limited tmpfs (CI runs the suite as root)")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", size)); err != nil {
		t.Fatalf("mounting a %d-byte tmpfs on %s: %v", size, dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
	return dir
}

// recovering reports whether err is an answer a node may give while it
// recovers from a full disk: "storage full" until an election finds room,
// "not the leader" between a failed append and the next election, and
// "outcome unknown" for a write in flight when leadership was lost.
func recovering(err error) bool {
	st := status.Convert(err)
	return st.Code() == codes.ResourceExhausted || st.Code() == codes.Unavailable ||
		st.Code() == codes.Unknown && strings.Contains(st.Message(), "outcome unknown")
}

// freeBytes returns the bytes available on the file system holding dir.
func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * int64(st.Bsize)
}

// reserve writes a file of size bytes at path.
func reserve(t *testing.T, path string, size int64) {
	t.Helper()
	if size <= 0 {
		t.Fatalf("no room to reserve %d bytes", size)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for size > 0 {
		n := min(size, int64(len(buf)))
		if _, err := f.Write(buf[:n]); err != nil {
			t.Fatal(err)
		}
		size -= n
	}
}

// fillFS writes path until the file system is full.
func fillFS(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, chunk := range []int{1 << 20, 4 << 10} {
		buf := make([]byte, chunk)
		for {
			if _, err := f.Write(buf); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatal(err)
				}
				break
			}
		}
	}
}

// TestStorageFull: with the disk full, a write is refused with
// RESOURCE_EXHAUSTED "storage full on node n1" (never UNKNOWN or "not the
// leader"), status says so, and nothing acknowledged is lost. Once space is
// freed, the node takes writes again by itself, whatever the engine (raft-wal
// must then start the segment it failed to create).
func TestStorageFull(t *testing.T) {
	testutil.Slow(t)
	for _, tc := range []struct {
		engine string
		fsSize int
		value  int
	}{
		{"bolt", 24 << 20, 60 << 10},
		// A raft-wal segment is 64 MiB, preallocated: it fails only when
		// it must start the next one, and once space is freed there is
		// room for that one.
		{"wal", 200 << 20, 60 << 10},
	} {
		t.Run(tc.engine, func(t *testing.T) {
			mnt := smallFS(t, tc.fsSize)
			cfg := daemon.Config{DataDir: filepath.Join(mnt, "data"), LogStore: tc.engine}
			srv := testutil.StartConfig(t, cfg)
			api := testutil.API(t, srv.Addr())
			value := bytes.Repeat([]byte{'v'}, tc.value)
			acked := map[string]bool{}
			put := func(key string) error {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_, err := api.KVPut(ctx, &pb.KVPutRequest{Key: key, Value: value})
				if err == nil {
					acked[key] = true
				}
				return err
			}
			storageError := func() string {
				st, err := api.Status(context.Background(), &pb.StatusRequest{})
				if err != nil {
					t.Fatal(err)
				}
				return st.GetStorageError()
			}
			for i := 0; i < 5; i++ {
				if err := put(fmt.Sprint("before-", i)); err != nil {
					t.Fatal(err)
				}
			}
			ballast := filepath.Join(mnt, "ballast")
			fillFS(t, ballast)

			// Full: every refusal is RESOURCE_EXHAUSTED, and they keep coming.
			refusals, refusal := 0, ""
			for i := 0; refusals < 10; i++ {
				if i > 3000 {
					t.Fatalf("%d writes and only %d refusals on a full disk", i, refusals)
				}
				err := put(fmt.Sprint("full-", i))
				if err == nil {
					continue // it fitted
				}
				refusals++
				refusal = err.Error()
				if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "storage full on node n1") {
					t.Fatalf("write on a full disk: %v, want RESOURCE_EXHAUSTED storage full on node n1", err)
				}
			}
			if msg := storageError(); !strings.Contains(msg, "storage full on node n1") {
				t.Fatalf("status storage_error %q on a full disk", msg)
			}
			// A linearizable read needs the leadership the full disk keeps
			// losing: it is answered, or refused the same way.
			for i := 0; i < 5; i++ {
				_, err := api.KVRange(context.Background(), &pb.KVRangeRequest{Key: "before-0"})
				if st := status.Convert(err); err != nil && (st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "storage full on node n1")) {
					t.Fatalf("read on a full disk: %v", err)
				}
			}

			if err := os.Remove(ballast); err != nil {
				t.Fatal(err)
			}
			if tc.engine == "wal" {
				// With less room than raft-wal's next segment, writes are
				// refused before the engine fills its current segment
				// (it would then seal its log for want of the next one).
				free := freeBytes(t, mnt)
				reserve(t, filepath.Join(mnt, "ballast2"), free-(16<<20))
				refused := 0
				for i := 0; refused < 5; i++ {
					if i > 3000 {
						t.Fatalf("%d writes with less than a segment free and only %d refused", i, refused)
					}
					err := put(fmt.Sprint("segment-", i))
					if err == nil {
						continue
					}
					if !recovering(err) || strings.Contains(err.Error(), "sealed") {
						t.Fatalf("wal write with less than a segment free: %v", err)
					}
					if strings.Contains(err.Error(), "storage full on node n1") {
						refused++
					}
				}
				if err := os.Remove(filepath.Join(mnt, "ballast2")); err != nil {
					t.Fatal(err)
				}
			}
			// Serves again, without a restart, whatever the engine.
			deadline := time.Now().Add(20 * time.Second)
			for i := 0; ; i++ {
				err := put(fmt.Sprint("after-", i))
				if err == nil {
					break
				}
				if !recovering(err) {
					t.Fatalf("write after freeing space: %v", err)
				}
				if time.Now().After(deadline) {
					t.Fatalf("no write succeeded within 20s of freeing space: %v", err)
				}
				time.Sleep(50 * time.Millisecond) // the next election's write finds the room; nothing to await
			}
			for i := 0; i < 5; i++ {
				if err := put(fmt.Sprint("later-", i)); err != nil {
					t.Fatalf("write once space is free: %v", err)
				}
			}
			if msg := storageError(); msg != "" {
				t.Fatalf("status storage_error %q once writes succeed", msg)
			}

			// Every acknowledged write is there after a restart.
			srv.Stop(t)
			srv = testutil.StartConfig(t, cfg)
			api = testutil.API(t, srv.Addr())
			for key := range acked {
				resp, err := api.KVRange(context.Background(), &pb.KVRangeRequest{Key: key})
				if err != nil {
					t.Fatal(err)
				}
				if len(resp.GetKvs()) != 1 || !bytes.Equal(resp.GetKvs()[0].GetValue(), value) {
					t.Fatalf("acknowledged key %s lost after the restart", key)
				}
			}
			t.Logf("%s: %d writes acknowledged, %d refused while full, such as: %s", tc.engine, len(acked), refusals, refusal)
		})
	}
}
