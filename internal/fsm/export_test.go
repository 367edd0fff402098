package fsm

import "fmt"

// CheckIndexes reports whether the ordered indexes of sessions and locks
// hold exactly what their maps hold (index.go).
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
	return err
}
