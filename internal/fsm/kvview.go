package fsm

// KVView: a read-only copy of the key-value store and its history window,
// taken in O(1) under the state lock and read after it is released, so
// that a walk of every key (HashKV) does not stop Apply.

// KVView is the key-value store and its history window as they were at
// one revision, read without the state lock: FSM.KVView takes it in O(1)
// (the key tree and the window's index are cloned copy-on-write, the
// window's records shared, as a snapshot takes them), and Apply goes on
// meanwhile. It never changes, and is safe for concurrent use. While it
// is held it keeps alive the parts of the state that Apply has replaced
// since (at worst a second copy of the keys and the window), as a
// snapshot being written does: hold it for one walk.
type KVView struct {
	// st holds only the key-value store, its window, the revision and
	// the cluster version: only the key-value reads below run on it.
	st *State
}

// KVView returns a view of the key-value store and its history window
// at the state's current revision. It holds the state lock for writing
// (cloning marks the trees copy-on-write, which no reader may see half
// done) for O(1).
func (f *FSM) KVView() *KVView {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.state
	v := &State{revision: s.revision, clusterVersion: s.clusterVersion}
	v.kv.tree = s.kv.tree.Clone()
	h := &s.kv.hist
	v.kv.hist = kvHistory{
		compactRev: h.compactRev,
		// Apply appends past the end and never modifies a record: the
		// records up to the end are the view's (historyCopy).
		log:      h.log[h.head:len(h.log):len(h.log)],
		versions: h.versions.Clone(),
		bytes:    h.bytes,
	}
	return &KVView{st: v}
}

// Revision is the state's revision when the view was taken.
func (v *KVView) Revision() uint64 { return v.st.revision }

// HashKV is State.HashKV on the view: the same hash for the same
// revision, computed without the state lock.
func (v *KVView) HashKV(rev uint64) (hash uint32, hashRev, compactRev uint64, err error) {
	return v.st.HashKV(rev)
}
