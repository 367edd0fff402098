package node_test

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/tenure-io/tenure/internal/node"
	"github.com/tenure-io/tenure/internal/store"
	"github.com/tenure-io/tenure/internal/testutil"
)

// tmpfs mounts a tmpfs of size MiB for the test and returns its path and a
// function that resizes it; it is unmounted when the test ends. Mounting
// needs root: the test is skipped otherwise (CI runs the suite as root).
func tmpfs(t *testing.T, mib int) (dir string, resize func(mib int)) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a size-limited tmpfs (CI runs the suite as root)")
	}
	dir = t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%dm", mib)); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
	return dir, func(mib int) {
		t.Helper()
		if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_REMOUNT, fmt.Sprintf("size=%dm", mib)); err != nil {
			t.Fatalf("resizing the tmpfs: %v", err)
		}
	}
}

// TestFirstStartOnFullDisk: a first start on a file system without room
// for the log says "disk full" (not that the log is damaged), and the
// directory it leaves starts, bootstraps and serves once there is room.
// Both places the first start can run out: the log's first segment
// (raft-wal preallocates 64 MiB), and the bootstrap's first entry (the
// store keeps room for the next segment).
func TestFirstStartOnFullDisk(t *testing.T) {
	testutil.Slow(t)
	for _, mib := range []int{16, 100} {
		t.Run(fmt.Sprintf("%dMiB", mib), func(t *testing.T) {
			fs, resize := tmpfs(t, mib)
			dir := fs + "/data"
			_, err := node.Open(node.Config{DataDir: dir, PeerAddr: freeAddr(t), LogOutput: io.Discard}, nil)
			if err == nil {
				t.Fatalf("first start on %d MiB: no error", mib)
			}
			if msg := err.Error(); !strings.Contains(msg, "disk full") || strings.Contains(msg, "damaged") || !errors.Is(err, store.ErrFull) {
				t.Fatalf("first start on %d MiB: %v; want disk full (store.ErrFull), not damaged", mib, err)
			}
			resize(400)
			n, _, _, _ := runIdentity(t, node.Config{DataDir: dir, PeerAddr: freeAddr(t)})
			testutil.WaitFor(t, "the node to serve once there is room", 20e9, func() bool {
				select {
				case <-n.Ready():
					return true
				default:
					return false
				}
			})
		})
	}
}
