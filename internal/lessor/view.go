package lessor

import "time"

// TimesLeft reports, on the leader, how long each session of ids has
// before it expires unless a keepalive arrives: 0 for one being expired,
// -1 for one the lessor does not time. ok is false unless the lessor acts
// (see Term): on a follower, which keeps no deadlines, and on a leader
// that does not serve.
func (l *Lessor) TimesLeft(ids []uint64) (left []time.Duration, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.actingLocked() {
		return nil, false
	}
	now := l.nowLocked()
	left = make([]time.Duration, len(ids))
	for i, id := range ids {
		e, found := l.sessions[id]
		switch {
		case !found:
			left[i] = -1
		case e.expiring:
			left[i] = 0
		default:
			left[i] = max(e.deadline.sub(now), 0)
		}
	}
	return left, true
}
