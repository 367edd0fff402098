//go:build linux

package nemesis

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// canMountDisks reports why the test cannot give the nodes file systems of
// their own (nil if it can).
func canMountDisks() error {
	if os.Geteuid() != 0 {
		return errors.New("not root")
	}
	dir, err := os.MkdirTemp("", "tenure-nemesis-mount-")
	if err != nil {
		return err
	}
	defer os.Remove(dir)
	if err := mountDisk(dir, 1<<20); err != nil {
		return err
	}
	return unmountDisk(dir)
}

// mountDisk mounts a tmpfs of size bytes on dir (created if needed).
func mountDisk(dir string, size int64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%d,mode=0755", size)); err != nil {
		return fmt.Errorf("mounting a %d MiB tmpfs on %s: %w", size>>20, dir, err)
	}
	return nil
}

// unmountDisk unmounts dir; a file system still busy is detached (it goes
// once the last process using it is gone).
func unmountDisk(dir string) error {
	err := unix.Unmount(dir, 0)
	if errors.Is(err, unix.EBUSY) {
		err = unix.Unmount(dir, unix.MNT_DETACH)
	}
	if err != nil {
		return fmt.Errorf("unmounting %s: %w", dir, err)
	}
	return nil
}
