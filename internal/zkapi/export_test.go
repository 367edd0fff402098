package zkapi

import "time"

// SetHandshakeTimeout sets the bound of a TLS handshake and of a
// connection's first packet for a test; the returned function restores
// it.
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
