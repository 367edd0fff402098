package zkapi

import "time"

// SetHandshakeTimeout sets how long a new connection may take to send
// its first packet, until the returned func restores it.
func SetHandshakeTimeout(d time.Duration) (restore func()) {
	old := handshakeTimeout
	handshakeTimeout = d
	return func() { handshakeTimeout = old }
}

// SetMaxQueuedTotal sets the bound of the bytes queued to every
// connection together, until the returned func restores it.
func SetMaxQueuedTotal(n int64) (restore func()) {
	old := maxQueuedTotal
	maxQueuedTotal = n
	return func() { maxQueuedTotal = old }
}
