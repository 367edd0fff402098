package zkapi

import "time"

// SetHandshakeTimeout sets the TLS handshake's bound for a test; the
// returned function restores it.
func SetHandshakeTimeout(d time.Duration) (restore func()) {
	old := handshakeTimeout
	handshakeTimeout = d
	return func() { handshakeTimeout = old }
}
