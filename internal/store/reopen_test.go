package store

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
)

// sealedLog is a log store that refuses appends as raft-wal does once it
// has sealed its log, and takes them otherwise.
type sealedLog struct {
	raft.LogStore
	sealed bool
	stored int
}

func (l *sealedLog) StoreLogs(logs []*raft.Log) error {
	if l.sealed {
		return fmt.Errorf("appending: %w", raftwal.ErrSealed)
	}
	l.stored += len(logs)
	return nil
}

// TestSealedWALOpensAgain: an append refused because raft-wal sealed its log
// after failing to start a segment is refused as "full" while there is no
// room for a segment, and once there is, the engine is opened again in
// place and the append retried on it; the failure clears.
func TestSealedWALOpensAgain(t *testing.T) {
	h := &health{}
	old := &sealedLog{sealed: true}
	fresh := &sealedLog{}
	var roomErr error = fmt.Errorf("3 MiB free: %w", syscall.ENOSPC)
	reopened := 0
	var openErr error
	c := &checked{health: h, log: old, room: func() error { return roomErr },
		reopen: func() (raft.LogStore, raft.StableStore, error) {
			reopened++
			if openErr != nil {
				return nil, nil, openErr
			}
			return fresh, nil, nil
		}}
	logs := []*raft.Log{{Index: 1}}

	// No room: the room check refuses before the engine sees the append.
	if err := c.StoreLogs(logs); !errors.Is(err, ErrFull) || reopened != 0 {
		t.Fatalf("append without room: %v (reopened %d), want ErrFull and no reopen", err, reopened)
	}
	// Room, but the engine sealed its log without a failed rotation: not
	// opened again (a sealed log is raft-wal's own business then).
	roomErr = nil
	if err := c.StoreLogs(logs); !errors.Is(err, raftwal.ErrSealed) || reopened != 0 {
		t.Fatalf("append to a sealed log without a rotation error: %v (reopened %d)", err, reopened)
	}
	// The rotation failed (raft-wal logged why), and the open after
	// closing the engine fails too: refused, and the next append opens it.
	h.Accept("wal", hclog.Error, "rotate error", "err", syscall.ENOSPC)
	if !h.rotationFailed() {
		t.Fatal("raft-wal's logged error was not kept")
	}
	openErr = errors.New("opening: disk gone")
	if err := c.StoreLogs(logs); err == nil || reopened != 1 || !c.closed {
		t.Fatalf("append when the open fails: %v (reopened %d, closed %v)", err, reopened, c.closed)
	}
	openErr = nil
	reopened = 0
	// Opened again, retried.
	if err := c.StoreLogs(logs); err != nil || reopened != 1 || fresh.stored != 1 {
		t.Fatalf("append after a failed rotation with room: %v (reopened %d, stored %d), want it stored on the engine opened again", err, reopened, fresh.stored)
	}
	if err := h.failure(); err != nil || h.rotationFailed() {
		t.Fatalf("failure %v / rotation failed %v after the append succeeded", err, h.rotationFailed())
	}
}
