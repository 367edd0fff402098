package fsm

import (
	"fmt"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// CheckIndexes reports whether the ordered indexes of sessions, locks and
// registers hold exactly what their maps hold (index.go), and the totals kept of
// the locks are right (stats.go).
func (s *State) CheckIndexes() error {
	if s.sessionOrder.Len() != len(s.sessions) {
		return fmt.Errorf("%d sessions indexed, %d exist", s.sessionOrder.Len(), len(s.sessions))
	}
	var err error
	s.sessionOrder.Ascend(func(ss *session) bool {
		if s.sessions[ss.id] != ss {
			err = fmt.Errorf("session %d indexed but not in the map", ss.id)
		}
		return err == nil
	})
	if err != nil {
		return err
	}
	if s.lockOrder.Len() != len(s.locks) {
		return fmt.Errorf("%d locks indexed, %d exist", s.lockOrder.Len(), len(s.locks))
	}
	s.lockOrder.Ascend(func(l *lock) bool {
		if s.locks[l.name] != l {
			err = fmt.Errorf("lock %q indexed but not in the map", l.name)
		}
		return err == nil
	})
	if err != nil {
		return err
	}
	if s.registerOrder.Len() != len(s.registers) {
		return fmt.Errorf("%d registers indexed, %d exist", s.registerOrder.Len(), len(s.registers))
	}
	s.registerOrder.Ascend(func(key string) bool {
		if s.registers[key] == nil {
			err = fmt.Errorf("register %q indexed but not in the map", key)
		}
		return err == nil
	})
	if err != nil {
		return err
	}
	return s.checkTotals()
}

// checkTotals reports whether the totals kept as locks change (stats.go)
// match a count of the locks.
func (s *State) checkTotals() error {
	held, delayed := 0, 0
	for _, l := range s.locks {
		if len(l.holders) > 0 {
			held++
		}
		if l.delayed {
			delayed++
		}
		shared := 0
		for w := l.head; w != nil; w = w.next {
			if w.shared {
				shared++
			}
		}
		if shared != l.nwaitShared {
			return fmt.Errorf("lock %q: %d readers wait, %d counted", l.name, shared, l.nwaitShared)
		}
	}
	if held != s.heldLocks || delayed != s.delayedLocks {
		return fmt.Errorf("%d locks held and %d delayed, counted %d and %d", held, delayed, s.heldLocks, s.delayedLocks)
	}
	return nil
}

// QueueItemsOf returns the ready and the dead-lettered items of the named
// queue of a snapshot, chunked or listed, as messages in id order.
func QueueItemsOf(snap *fsmpb.Snapshot, name string) (ready, dead []*fsmpb.QueueItemState, err error) {
	for _, st := range snap.GetQueues() {
		if st.GetName() == name {
			ready, dead = append(ready, st.GetReady()...), append(dead, st.GetDead()...)
		}
	}
	for _, c := range snap.GetQueueItems() {
		if c.GetQueue() != name {
			continue
		}
		err = unpack(c.GetPacked(), func(it qItem) error {
			m := &fsmpb.QueueItemState{Id: it.id, Payload: it.payload, Attempts: it.attempts}
			if c.GetDead() {
				dead = append(dead, m)
			} else {
				ready = append(ready, m)
			}
			return nil
		})
		if err != nil {
			return nil, nil, err
		}
	}
	return ready, dead, nil
}

// NewStateAt is NewState at cluster version v.
func NewStateAt(v uint32) *State {
	s := NewState()
	s.clusterVersion = v
	return s
}

// ZnodeBytes is what the znode tree counts against MaxZnodeBytes.
func (s *State) ZnodeBytes() uint64 { return s.zk.bytes }
