package etcdapi

import "time"

// SetHTTPHeaderTimeout sets the listener's bound on an HTTP request's
// headers for the servers started after it; restore sets it back.
func SetHTTPHeaderTimeout(d time.Duration) (restore func()) {
	old := httpHeaderTimeout
	httpHeaderTimeout = d
	return func() { httpHeaderTimeout = old }
}

// SetHashWalkHook makes fn run as each HashKV walk begins, on the walking
// goroutine; restore removes it.
func SetHashWalkHook(fn func()) (restore func()) {
	hashWalkHook.Store(&fn)
	return func() { hashWalkHook.Store(nil) }
}
