package fsm

import "github.com/google/btree"

// Sessions, locks and fenced registers are each kept twice: in a map, for
// lookups, and in a B-tree ordered by id, by name or by key, for the
// listings that come in pages (read.go) and for snapshots (snapcore.go):
// a page is found in O(log n) and read in O(page), and a snapshot walks
// the trees in order, where sorting the map would cost O(n log n) under
// the state lock. The two change together, only through the helpers
// below.

func newSessionOrder() *btree.BTreeG[*session] {
	return btree.NewG(32, func(a, b *session) bool { return a.id < b.id })
}

func newLockOrder() *btree.BTreeG[*lock] {
	return btree.NewG(32, func(a, b *lock) bool { return a.name < b.name })
}

func newRegisterOrder() *btree.BTreeG[string] {
	return btree.NewG(32, func(a, b string) bool { return a < b })
}

// addSession adds a new session.
func (s *State) addSession(ss *session) {
	s.sessions[ss.id] = ss
	s.sessionOrder.ReplaceOrInsert(ss)
	if ss.etcdLease {
		s.etcdLeases++
	}
}

// removeSession removes a session.
func (s *State) removeSession(ss *session) {
	delete(s.sessions, ss.id)
	s.sessionOrder.Delete(ss)
	s.ttls.Delete(sessionTTL{id: ss.id})
	if ss.etcdLease {
		s.etcdLeases--
	}
}

// addLock adds a new lock.
func (s *State) addLock(l *lock) {
	s.locks[l.name] = l
	s.lockOrder.ReplaceOrInsert(l)
}

// removeLock removes an unused lock (see forget).
func (s *State) removeLock(l *lock) {
	delete(s.locks, l.name)
	s.lockOrder.Delete(l)
}

// addRegister adds a new register at key.
func (s *State) addRegister(key string, r *register) {
	s.registers[key] = r
	s.registerOrder.ReplaceOrInsert(key)
}

// removeRegister removes the register at key.
func (s *State) removeRegister(key string) {
	delete(s.registers, key)
	s.registerOrder.Delete(key)
}
