package testutil

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
)

var (
	// handedMu guards handed.
	handedMu sync.Mutex
	// handed: the addresses FreeAddr has returned in this test binary.
	handed = map[string]bool{}
)

// FreeAddr returns a loopback address with a port in lo..hi-1 that nothing
// listens on now and that no earlier call in this test binary returned:
// two nodes asking one after the other would otherwise both get a port
// that is free only because neither has bound it yet. Callers pick the
// range: below the kernel's ephemeral range (32768 and up on Linux) for a
// process that binds the port later or again after a restart.
func FreeAddr(t testing.TB, lo, hi int) string {
	t.Helper()
	for range 200 {
		addr := fmt.Sprintf("127.0.0.1:%d", lo+rand.IntN(hi-lo))
		handedMu.Lock()
		taken := handed[addr]
		handed[addr] = true
		handedMu.Unlock()
		if taken {
			continue
		}
		if l, err := net.Listen("tcp", addr); err == nil {
			l.Close()
			return addr
		}
	}
	t.Fatalf("no free loopback port in %d..%d", lo, hi-1)
	return ""
}

// LogWriter returns a writer that logs what is written to it with t.Log,
// line by line, each prefixed with id (a node's logs in a cluster test).
func LogWriter(t testing.TB, id string) io.Writer { return prefixLog{t, id} }

type prefixLog struct {
	t  testing.TB
	id string
}

func (w prefixLog) Write(p []byte) (int, error) {
	w.t.Log(w.id + ": " + strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
