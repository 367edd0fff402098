//go:build unix

package store

import (
	"fmt"
	"syscall"
)

// roomFor returns nil if the file system holding dir has at least size
// bytes available, else an error that says how much it has.
func roomFor(dir string, size int64) error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return err
	}
	if avail := int64(st.Bavail) * int64(st.Bsize); avail < size {
		return fmt.Errorf("%d bytes are free on the file system, a segment takes %d: %w", avail, size, syscall.ENOSPC)
	}
	return nil
}
