package server

// SetAcquireAnsweredHook sets acquireAnsweredHook (nil removes it).
func SetAcquireAnsweredHook(fn func()) {
	if fn == nil {
		acquireAnsweredHook.Store(nil)
		return
	}
	acquireAnsweredHook.Store(&fn)
}
