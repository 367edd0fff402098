package server

// StreamsOf counts the session streams attached to session id on this
// node: a test sees a client leave its stream.
func (h *Hub) StreamsOf(id uint64) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.attachedLocked(id))
}

// DirectStreamsOf counts the session streams attached to session id on
// this node that came by a client door, not relayed by a follower: a test
// sees a client's session move to this node.
func (h *Hub) DirectStreamsOf(id uint64) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, ss := range h.attachedLocked(id) {
		if forwardedOf(ss.conn.ctx) == nil {
			n++
		}
	}
	return n
}
