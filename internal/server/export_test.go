package server

// StreamsOf counts the session streams attached to session id on this
// node: a test sees a client leave its stream.
func (h *Hub) StreamsOf(id uint64) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.attachedLocked(id))
}
