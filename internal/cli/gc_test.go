package cli

import (
	"os"
	"runtime/debug"
	"testing"
)

// TestServeGCPercent: serve sets the collector's target to ServeGCPercent
// when GOGC is not set, and leaves GOGC's when it is.
func TestServeGCPercent(t *testing.T) {
	old, had := os.LookupEnv("GOGC")
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() {
		debug.SetGCPercent(prev)
		if had {
			os.Setenv("GOGC", old)
		} else {
			os.Unsetenv("GOGC")
		}
	})
	os.Unsetenv("GOGC")
	serveGCPercent()
	if got := debug.SetGCPercent(100); got != ServeGCPercent {
		t.Fatalf("without GOGC serve set the GC percent to %d, want %d", got, ServeGCPercent)
	}
	os.Setenv("GOGC", "100")
	serveGCPercent()
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("with GOGC=100 serve set the GC percent to %d", got)
	}
}
