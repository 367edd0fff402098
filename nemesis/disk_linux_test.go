//go:build linux

package nemesis

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// A node's own file system is an ext4 image, sparse, loop-mounted on the
// node's disk directory. Its ballast is allocated with fallocate, so
// filling it writes nothing to the host's disk; what the node writes goes
// to the image file (the host's disk, not memory).

// canMountDisks reports why the test cannot give the nodes file systems of
// their own (nil if it can): it mounts and unmounts a small one.
func canMountDisks() error {
	if os.Geteuid() != 0 {
		return errors.New("not root")
	}
	for _, tool := range []string{"mkfs.ext4", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("no %s", tool)
		}
	}
	dir, err := os.MkdirTemp("", "tenure-nemesis-mount-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	mnt := filepath.Join(dir, "mnt")
	if err := mountDisk(mnt, 32<<20); err != nil {
		return err
	}
	return unmountDisk(mnt)
}

// mountDisk makes a sparse ext4 image of size bytes beside dir (dir.img,
// no blocks reserved for root: the nodes run as root) and loop-mounts it
// on dir.
func mountDisk(dir string, size int64) error {
	img := dir + ".img"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.Create(img)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := run("mkfs.ext4", "-q", "-F", "-m", "0", img); err != nil {
		return err
	}
	return run("mount", "-o", "loop", img, dir)
}

// unmountDisk unmounts dir (lazily if it is still busy) and removes its
// image.
func unmountDisk(dir string) error {
	err := unix.Unmount(dir, 0)
	if errors.Is(err, unix.EBUSY) {
		err = unix.Unmount(dir, unix.MNT_DETACH)
	}
	if err != nil {
		return fmt.Errorf("unmounting %s: %w", dir, err)
	}
	return os.Remove(dir + ".img")
}

func run(argv ...string) error {
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// fillDisk fills path's file system with the file path: allocated, not
// written, then topped up with zeros until it is full. It returns the
// file's size.
func fillDisk(path string) (int64, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(path), &st); err != nil {
		return 0, err
	}
	var n int64
	for want := int64(st.Bavail) * st.Bsize; want >= 1<<20; want -= want / 16 {
		err := unix.Fallocate(int(f.Fd()), 0, n, want)
		if err == nil {
			n += want
			break
		}
		if !errors.Is(err, unix.ENOSPC) {
			return n, fmt.Errorf("fallocate %s: %w", path, err)
		}
	}
	if _, err := f.Seek(n, 0); err != nil {
		return n, err
	}
	for _, chunk := range []int{1 << 20, 4 << 10, 512} {
		buf := make([]byte, chunk)
		for {
			m, err := f.Write(buf)
			n += int64(m)
			if errors.Is(err, syscall.ENOSPC) {
				break
			}
			if err != nil {
				return n, err
			}
		}
	}
	return n, nil
}
