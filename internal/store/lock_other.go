//go:build !unix

package store

import "io"

// lockDir does nothing where flock is missing: there each engine's own
// file lock (bbolt's) is all that keeps a second process out.
func lockDir(string) (io.Closer, error) { return nopCloser{}, nil }

type nopCloser struct{}

func (nopCloser) Close() error { return nil }
