//go:build darwin

package nemesis

import "errors"

// canMountDisks: the suite mounts size-limited file systems on Linux only.
func canMountDisks() error { return errors.New("not Linux") }

func mountDisk(string, int64) error { return canMountDisks() }

func unmountDisk(string) error { return nil }

func fillDisk(string) (int64, error) { return 0, canMountDisks() }
