package node

import (
	"testing"
	"time"
)

// TestRaftFuturesEndOnClose pins what endOnClose relies on in raft: the
// futures of Barrier (the type Apply returns too) and VerifyLeader carry a
// ShutdownCh it can set. If raft changes that, this fails (and settle
// falls back to a goroutine that may outlive Close).
func TestRaftFuturesEndOnClose(t *testing.T) {
	n := openRunning(t, Config{DataDir: t.TempDir()})
	for name, f := range map[string]interface{ Error() error }{
		"Barrier":      n.raft.Barrier(time.Second),
		"VerifyLeader": n.raft.VerifyLeader(),
	} {
		if !endOnClose(f, n.quit) {
			t.Errorf("%s: raft's future has no ShutdownCh to set", name)
		}
		_ = f.Error()
	}
}
