package testutil

import "testing"

// Slow skips t under -short (the quick gate, `go test -short ./...`): for
// tests that take more than about a second, or run clusters of servers.
// `make test` runs them.
func Slow(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("slow; skipped with -short")
	}
}
