package zkapi

import (
	"sync"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// watches holds every watch of the node's connections and the revision
// up to which the state machine's events reached them (fed).
//
// A watch event reaches its client before the client can read the
// change: a read takes mu, reads the state only when the state's
// revision equals fed (every event up to it queued to the connections),
// and queues its answer before releasing mu; events after the read are
// queued, under mu, after that answer. Lock order: mu, then the state's
// read lock (Front.Read), then a connection's out.mu.
type watches struct {
	// mu guards the fields below.
	mu sync.Mutex
	// fed: every event up to this revision has been delivered; moved
	// is closed (and replaced) when fed moves.
	fed   uint64
	moved chan struct{}
	// data: getData and exists watches (exists of a missing node too,
	// as ZooKeeper keeps them); child: getChildren watches; persistent:
	// addWatch's, true for recursive ones.
	data       map[string]map[*conn]struct{}
	child      map[string]map[*conn]struct{}
	persistent map[string]map[*conn]bool
	recursive  int // persistent recursive watches, to skip the walk up when none
	// count is how many watches are registered; bytes counts what they
	// hold (watchCost each), at most maxBytes on the node.
	count           int
	bytes, maxBytes int64
	// ended is called, under mu, with each session that ends.
	ended func(session uint64)
}

func newWatches(maxBytes int64) *watches {
	return &watches{moved: make(chan struct{}), data: map[string]map[*conn]struct{}{}, child: map[string]map[*conn]struct{}{}, persistent: map[string]map[*conn]bool{},
		maxBytes: maxBytes}
}

// watchCost is what one watch on path counts against the node's bound:
// its path and the maps' entries.
func watchCost(path string) int64 { return int64(len(path)) + 128 }

// chargeLocked counts a new watch of c on path; false past the
// connection's or the node's bound.
func (w *watches) chargeLocked(c *conn, path string) bool {
	if c.watchCount >= c.z.cfg.MaxWatches || w.bytes+watchCost(path) > w.maxBytes {
		return false
	}
	c.watchCount++
	w.count++
	w.bytes += watchCost(path)
	return true
}

// releaseLocked uncounts a watch of c on path.
func (w *watches) releaseLocked(c *conn, path string) {
	c.watchCount--
	w.count--
	w.bytes -= watchCost(path)
}

// Watch kinds of a connection's count and of removeWatches.
const (
	watchChildren = 1
	watchData     = 2
	watchAny      = 3
)

// addLocked registers a one-shot watch of c on path.
func (w *watches) addLocked(m map[string]map[*conn]struct{}, path string, c *conn) bool {
	if len(path) > fsm.MaxZnodePath {
		return true // no znode has such a path: the watch would never fire
	}
	set := m[path]
	if set == nil {
		set = map[*conn]struct{}{}
		m[path] = set
	}
	if _, ok := set[c]; ok {
		return true
	}
	if !w.chargeLocked(c, path) {
		if len(set) == 0 {
			delete(m, path)
		}
		return false
	}
	set[c] = struct{}{}
	return true
}

func (w *watches) addPersistentLocked(path string, c *conn, recursive bool) bool {
	if len(path) > fsm.MaxZnodePath {
		return true // no znode has such a path: the watch would never fire
	}
	set := w.persistent[path]
	if set == nil {
		set = map[*conn]bool{}
		w.persistent[path] = set
	}
	if old, ok := set[c]; ok {
		if old {
			w.recursive--
		}
	} else if !w.chargeLocked(c, path) {
		if len(set) == 0 {
			delete(w.persistent, path)
		}
		return false
	}
	set[c] = recursive
	if recursive {
		w.recursive++
	}
	return true
}

// removeConnLocked drops every watch of c (its connection closed).
func (w *watches) removeConnLocked(c *conn) {
	for _, m := range []map[string]map[*conn]struct{}{w.data, w.child} {
		for p, set := range m {
			if _, ok := set[c]; ok {
				w.releaseLocked(c, p)
				delete(set, c)
			}
			if len(set) == 0 {
				delete(m, p)
			}
		}
	}
	for p, set := range w.persistent {
		if rec, ok := set[c]; ok {
			if rec {
				w.recursive--
			}
			w.releaseLocked(c, p)
			delete(set, c)
			if len(set) == 0 {
				delete(w.persistent, p)
			}
		}
	}
	c.watchCount = 0
}

// removeLocked removes c's watches of kind on path (removeWatches);
// false if it had none.
func (w *watches) removeLocked(c *conn, path string, kind int32) bool {
	found := false
	drop := func(m map[string]map[*conn]struct{}) {
		if _, ok := m[path][c]; ok {
			delete(m[path], c)
			if len(m[path]) == 0 {
				delete(m, path)
			}
			w.releaseLocked(c, path)
			found = true
		}
	}
	if kind == watchChildren || kind == watchAny {
		drop(w.child)
	}
	if kind == watchData || kind == watchAny {
		drop(w.data)
	}
	if kind == watchAny {
		if rec, ok := w.persistent[path][c]; ok {
			if rec {
				w.recursive--
			}
			delete(w.persistent[path], c)
			if len(w.persistent[path]) == 0 {
				delete(w.persistent, path)
			}
			w.releaseLocked(c, path)
			found = true
		}
	}
	return found
}

// event delivers one state machine event; it runs on the apply path.
func (w *watches) event(e fsm.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch e.Kind {
	case fsm.EventApplied, fsm.EventRestored:
		if e.Revision != w.fed {
			w.fed = e.Revision
			close(w.moved)
			w.moved = make(chan struct{})
		}
	case fsm.EventZnode:
		w.triggerLocked(e)
	case fsm.EventSessionEnded:
		// The session's connections end (closing one does not block).
		if w.ended != nil {
			w.ended(e.Session)
		}
	}
}

// triggerLocked sends e to the watches it fires, as ZooKeeper's
// WatchManager does: one-shot watches are removed, a connection gets one
// notification per event however many of its watches fire.
func (w *watches) triggerLocked(e fsm.Event) {
	path, typ := e.Name, e.ZnodeType
	got := map[*conn]bool{}
	fire := func(m map[string]map[*conn]struct{}) {
		for c := range m[path] {
			got[c] = true
			w.releaseLocked(c, path)
		}
		delete(m, path)
	}
	switch typ {
	case fsm.ZnodeCreated, fsm.ZnodeDataChanged:
		fire(w.data)
	case fsm.ZnodeChildrenChanged:
		fire(w.child)
	case fsm.ZnodeDeleted:
		fire(w.data)
		fire(w.child)
	}
	for c, rec := range w.persistent[path] {
		if typ == fsm.ZnodeChildrenChanged && rec {
			continue // recursive watches get no child events
		}
		got[c] = true
	}
	if w.recursive > 0 && typ != fsm.ZnodeChildrenChanged {
		for p := path; p != "/"; {
			p, _ = fsm.ZnodeParent(p)
			for c, rec := range w.persistent[p] {
				if rec && !got[c] && c.mayReadLocked(path, e.ZnodeACL) {
					got[c] = true
				}
			}
		}
	}
	for c := range got {
		c.notify(int32(typ), path, int64(e.Revision))
	}
}

// mayReadLocked reports whether c may read the znode at path, whose ACL
// is acl: a persistent recursive watch on an ancestor is told only of
// the znodes its client may read (ZooKeeper checks the same since
// CVE-2024-23944), by their own ACL and, under --auth, the Tenure right.
// The connection's identities and token change under mu.
func (c *conn) mayReadLocked(path string, acl []*fsmpb.ZnodeACL) bool {
	if !fsm.ZkAllowed(acl, fsm.ZkPermRead, c.ids) {
		return false
	}
	if !c.z.srv.AuthEnforced() {
		return true
	}
	if !c.hasToken {
		return false
	}
	_, ok := c.z.srv.Missing(c.caller, c.z.front.Security(), zkRight(path, false))
	return ok
}

// hasLocked reports whether c has a watch of kind on path (checkWatches).
func (w *watches) hasLocked(c *conn, path string, kind int32) bool {
	_, child := w.child[path][c]
	_, data := w.data[path][c]
	_, pers := w.persistent[path][c]
	switch kind {
	case watchChildren:
		return child || pers
	case watchData:
		return data || pers
	}
	return child || data || pers
}
