package zkapi

import "time"

// SetHandshakeTimeout sets how long a new connection may take to send
// its first packet, until the returned func restores it.
func SetHandshakeTimeout(d time.Duration) (restore func()) {
	old := handshakeTimeout
	handshakeTimeout = d
	return func() { handshakeTimeout = old }
}
