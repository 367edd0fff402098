package server

// SetGrantSentHook sets grantSentHook (nil removes it).
func SetGrantSentHook(fn func()) {
	if fn == nil {
		grantSentHook.Store(nil)
		return
	}
	grantSentHook.Store(&fn)
}
