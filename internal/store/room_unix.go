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
		return fmt.Errorf("%d MiB free, the wal engine keeps %d MiB for its next log segment: %w", avail>>20, size>>20, syscall.ENOSPC)
	}
	return nil
}
