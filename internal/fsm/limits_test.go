package fsm_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

func cmdSetLimits(l fsm.Limits) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_SetLimits{SetLimits: &fsmpb.SetLimits{Limits: fsm.LimitsToProto(l)}}}
}

func batchOf(cmds ...*fsmpb.Command) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_Batch{Batch: &fsmpb.Batch{Commands: cmds}}}
}

func cmdEnqueue(queue, payload string) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_QueueEnqueue{QueueEnqueue: &fsmpb.QueueEnqueue{Queue: queue, Payload: []byte(payload)}}}
}

// admitted applies cmds as one batch (one log entry, as concurrent
// requests are committed) and returns how many were applied without error;
// every refusal must be ErrLimit and name the limit.
func admitted(t *testing.T, m *machine, limit string, cmds ...*fsmpb.Command) int {
	t.Helper()
	r, _ := m.apply(batchOf(cmds...))
	n := 0
	for _, br := range r.Batch {
		switch {
		case br.Err == nil:
			n++
		case !errors.Is(br.Err, fsm.ErrLimit):
			t.Fatalf("refused with %v, want ErrLimit", br.Err)
		case !strings.Contains(br.Err.Error(), "--"+limit):
			t.Fatalf("refusal %q does not say how to raise %s", br.Err, limit)
		}
	}
	return n
}

// TestLimitsCannotBeRaced applies more commands than a limit allows in one
// batch, as concurrent requests reach the log: exactly the limit is
// admitted, whatever the limit.
func TestLimitsCannotBeRaced(t *testing.T) {
	type tc struct {
		limit string
		set   fsm.Limits
		setup func(m *machine) []*fsmpb.Command // the commands that compete
		want  int
	}
	sessions := func(m *machine, n int) []uint64 {
		var ids []uint64
		for i := range n {
			ids = append(ids, m.session(fmt.Sprint("s", i)))
		}
		return ids
	}
	cases := []tc{
		{"max-sessions", fsm.Limits{MaxSessions: 3}, func(m *machine) []*fsmpb.Command {
			var cmds []*fsmpb.Command
			for i := range 5 {
				cmds = append(cmds, cmdCreate(fmt.Sprint("o", i), 10_000))
			}
			return cmds
		}, 3},
		{"max-waiters", fsm.Limits{MaxWaiters: 2}, func(m *machine) []*fsmpb.Command {
			ids := sessions(m, 6)
			m.acquire(ids[0], "l", 0)
			var cmds []*fsmpb.Command
			for _, id := range ids[1:] {
				cmds = append(cmds, cmdAcquire(id, "l", true, 0))
			}
			return cmds
		}, 2},
		{"max-total-waiters", fsm.Limits{MaxTotalWaiters: 3}, func(m *machine) []*fsmpb.Command {
			ids := sessions(m, 7)
			m.acquire(ids[0], "a", 0)
			m.acquire(ids[0], "b", 0)
			var cmds []*fsmpb.Command
			for i, id := range ids[1:] {
				cmds = append(cmds, cmdAcquire(id, []string{"a", "b"}[i%2], true, 0))
			}
			return cmds
		}, 3},
		{"max-locks", fsm.Limits{MaxLocks: 2}, func(m *machine) []*fsmpb.Command {
			id := sessions(m, 1)[0]
			var cmds []*fsmpb.Command
			for i := range 4 {
				cmds = append(cmds, cmdAcquire(id, fmt.Sprint("lock", i), false, 0))
			}
			return cmds
		}, 2},
		{"max-registers", fsm.Limits{MaxRegisters: 2}, func(m *machine) []*fsmpb.Command {
			var cmds []*fsmpb.Command
			for i := range 4 {
				cmds = append(cmds, cmdPut(fmt.Sprint("r", i), "v", 1, ""))
			}
			return cmds
		}, 2},
		{"max-register-bytes", fsm.Limits{MaxRegisterBytes: 10}, func(m *machine) []*fsmpb.Command {
			// "r0"+"xxx" is 5 bytes: two fit in 10.
			var cmds []*fsmpb.Command
			for i := range 4 {
				cmds = append(cmds, cmdPut(fmt.Sprint("r", i), "xxx", 1, ""))
			}
			return cmds
		}, 2},
		{"max-keys", fsm.Limits{MaxKeys: 2}, func(m *machine) []*fsmpb.Command {
			var cmds []*fsmpb.Command
			for i := range 4 {
				cmds = append(cmds, cmdKVPut(fmt.Sprint("k", i), "v", 0))
			}
			return cmds
		}, 2},
		{"max-kv-bytes", fsm.Limits{MaxKVBytes: 10}, func(m *machine) []*fsmpb.Command {
			var cmds []*fsmpb.Command
			for i := range 4 {
				cmds = append(cmds, cmdKVPut(fmt.Sprint("k", i), "xxx", 0))
			}
			return cmds
		}, 2},
		{"max-queues", fsm.Limits{MaxQueues: 2}, func(m *machine) []*fsmpb.Command {
			var cmds []*fsmpb.Command
			for i := range 4 {
				cmds = append(cmds, cmdEnqueue(fmt.Sprint("q", i), "x"))
			}
			return cmds
		}, 2},
		{"max-queue-length", fsm.Limits{MaxQueueLength: 3}, func(m *machine) []*fsmpb.Command {
			var cmds []*fsmpb.Command
			for range 5 {
				cmds = append(cmds, cmdEnqueue("q", "x"))
			}
			return cmds
		}, 3},
	}
	for _, c := range cases {
		t.Run(c.limit, func(t *testing.T) {
			m := newMachine(t)
			m.ok(cmdSetLimits(c.set))
			cmds := c.setup(m)
			if got := admitted(t, m, c.limit, cmds...); got != c.want {
				t.Fatalf("%d of %d admitted, want %d", got, len(cmds), c.want)
			}
		})
	}
}

func TestLimitsRefuseGrowthOnly(t *testing.T) {
	m := newMachine(t)
	m.ok(cmdKVPut("k", "0123456789", 0))
	m.ok(cmdSetLimits(fsm.Limits{MaxKVBytes: 8, MaxKeys: 1}))
	// Past both limits now: what does not grow is still served.
	m.ok(cmdKVPut("k", "short", 0))
	m.failsWith(cmdKVPut("k", "longer than short", 0), fsm.ErrLimit)
	m.failsWith(cmdKVPut("other", "", 0), fsm.ErrLimit)
	m.ok(&fsmpb.Command{Op: &fsmpb.Command_KvDelete{KvDelete: &fsmpb.KVDelete{Key: "k"}}})
	m.ok(cmdKVPut("other", "ok", 0))

	// A transaction is admitted whole or not at all.
	txn := &fsmpb.Command{Op: &fsmpb.Command_KvTxn{KvTxn: &fsmpb.KVTxn{Success: []*fsmpb.KVOp{
		{Op: &fsmpb.KVOp_Put{Put: &fsmpb.KVPut{Key: "other", Value: []byte("o")}}},
		{Op: &fsmpb.KVOp_Put{Put: &fsmpb.KVPut{Key: "third", Value: []byte("t")}}},
	}}}}
	m.failsWith(txn, fsm.ErrLimit)
}

func TestLimitsAreReplicatedState(t *testing.T) {
	m := newMachine(t)
	if got := m.s.Limits(); got != fsm.DefaultLimits() {
		t.Fatalf("new state limits %+v, want the defaults", got)
	}
	m.ok(cmdSetLimits(fsm.Limits{MaxSessions: 7}))
	m.ok(cmdSetLimits(fsm.Limits{MaxKeys: 9})) // 0 fields keep their value
	want := fsm.DefaultLimits()
	want.MaxSessions, want.MaxKeys = 7, 9
	if got := m.s.Limits(); got != want {
		t.Fatalf("limits %+v, want %+v", got, want)
	}
	back, err := fsm.Import(m.s.Export())
	if err != nil {
		t.Fatal(err)
	}
	if back.Limits() != want {
		t.Fatalf("limits after a snapshot %+v, want %+v", back.Limits(), want)
	}
}
