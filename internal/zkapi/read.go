package zkapi

import (
	"context"
	"strings"

	"github.com/tenure-io/tenure/internal/fsm"
)

// readPath is the znode a read of path reads: ZooKeeper's tree holds the
// root under "" as well as "/" (DataTree), so a read of the empty path,
// which its clients refuse to send, answers the root. A watch it sets
// stays on "", where no event ever fires, as ZooKeeper keeps it.
func readPath(path string) string {
	if path == "" {
		return "/"
	}
	return path
}

// readOp serves the requests answered from this member's applied state.
func (c *conn) readOp(ctx context.Context, h requestHeader, body []byte) error {
	d := decoder{b: body}
	w := c.z.w
	switch h.op {
	case opExists, opGetData, opGetChildren, opGetChildren2:
		path, watch := d.string(), d.bool()
		if d.err != nil {
			return errBadPacket
		}
		// ZooKeeper does not validate the path of a read (clients do):
		// a path no znode has is NoNode; exists refuses a NUL.
		if h.op == opExists && strings.IndexByte(path, 0) >= 0 {
			return c.read(ctx, h.xid, func(*fsm.State) (fsm.ZkCode, []byte) { return fsm.ZkBadArguments, nil })
		}
		if !c.allowed(opReadName(h.op), false, readPath(path)) {
			return c.read(ctx, h.xid, func(*fsm.State) (fsm.ZkCode, []byte) { return fsm.ZkNoAuth, nil })
		}
		return c.read(ctx, h.xid, func(st *fsm.State) (fsm.ZkCode, []byte) {
			data, acl, s, ok := st.Znode(readPath(path))
			var e encoder
			switch h.op {
			case opExists:
				if watch && !w.addLocked(w.data, path, c) {
					return fsm.ZkQuotaExceeded, nil
				}
				if !ok {
					return fsm.ZkNoNode, nil
				}
				e.stat(wireStat(s))
				return fsm.ZkOK, e.b
			case opGetData:
				if !ok {
					return fsm.ZkNoNode, nil
				}
				if !fsm.ZkAllowed(acl, fsm.ZkPermRead, c.ids) {
					return fsm.ZkNoAuth, nil
				}
				if watch && !w.addLocked(w.data, path, c) {
					return fsm.ZkQuotaExceeded, nil
				}
				e.buffer(data) // nil: null data, answered as ZooKeeper answers it (-1)
				e.stat(wireStat(s))
				return fsm.ZkOK, e.b
			}
			if !ok {
				return fsm.ZkNoNode, nil
			}
			if !fsm.ZkAllowed(acl, fsm.ZkPermRead, c.ids) {
				return fsm.ZkNoAuth, nil
			}
			if watch && !w.addLocked(w.child, path, c) {
				return fsm.ZkQuotaExceeded, nil
			}
			children, _ := st.ZnodeChildren(readPath(path))
			if stringsLen(children) > maxAnswer {
				return codeTooLarge, nil
			}
			e.strings(children)
			if h.op == opGetChildren2 {
				e.stat(wireStat(s))
			}
			return fsm.ZkOK, e.b
		})
	case opGetACL:
		path := d.string()
		if d.err != nil {
			return errBadPacket
		}
		if !c.allowed("getACL", false, readPath(path)) {
			return c.read(ctx, h.xid, func(*fsm.State) (fsm.ZkCode, []byte) { return fsm.ZkNoAuth, nil })
		}
		return c.read(ctx, h.xid, func(st *fsm.State) (fsm.ZkCode, []byte) {
			_, list, s, ok := st.Znode(readPath(path))
			if !ok {
				return fsm.ZkNoNode, nil
			}
			if !fsm.ZkAllowed(list, fsm.ZkPermRead|fsm.ZkPermAdmin, c.ids) {
				return fsm.ZkNoAuth, nil
			}
			// Without admin, digest ids are masked (user:x), as ZooKeeper
			// masks them.
			admin := fsm.ZkAllowed(list, fsm.ZkPermAdmin, c.ids)
			var e encoder
			as := make([]acl, 0, len(list))
			for _, a := range list {
				id := a.GetId()
				if !admin && a.GetScheme() == "digest" {
					user, _, _ := strings.Cut(id, ":")
					id = user + ":x"
				}
				as = append(as, aclOf(a.GetPerms(), a.GetScheme(), id))
			}
			e.acls(as)
			e.stat(wireStat(s))
			return fsm.ZkOK, e.b
		})
	case opGetAllChildren:
		path := d.string()
		if d.err != nil {
			return errBadPacket
		}
		if !c.allowed("getAllChildrenNumber", false, readPath(path)) {
			return c.read(ctx, h.xid, func(*fsm.State) (fsm.ZkCode, []byte) { return fsm.ZkNoAuth, nil })
		}
		return c.read(ctx, h.xid, func(st *fsm.State) (fsm.ZkCode, []byte) {
			_, acl, _, ok := st.Znode(readPath(path))
			if !ok {
				return fsm.ZkNoNode, nil
			}
			if !fsm.ZkAllowed(acl, fsm.ZkPermRead, c.ids) {
				return fsm.ZkNoAuth, nil
			}
			n, _ := st.ZnodeDescendants(readPath(path))
			var e encoder
			e.int(int32(n))
			return fsm.ZkOK, e.b
		})
	case opGetEphemerals:
		prefix := d.string()
		if d.err != nil {
			return errBadPacket
		}
		return c.read(ctx, h.xid, func(st *fsm.State) (fsm.ZkCode, []byte) {
			// Read in order from the session's index of ephemerals, and
			// no further than an answer's worth: the read holds the
			// state, so its cost is what it answers, not the session's
			// count of ephemerals.
			eph, size := []string{}, 4
			st.ZnodeEphemeralsFunc(c.session, prefix, func(p string) bool {
				size += 4 + len(p)
				eph = append(eph, p)
				return size <= maxAnswer
			})
			if size > maxAnswer {
				return codeTooLarge, nil
			}
			var e encoder
			e.strings(eph)
			return fsm.ZkOK, e.b
		})
	case opAddWatch:
		path, mode := d.string(), d.int()
		if d.err != nil {
			return errBadPacket
		}
		if err := fsm.ValidateZnodePath(path); err != nil || (mode != addWatchPersistent && mode != addWatchPersistentRecursive) {
			return c.read(ctx, h.xid, func(*fsm.State) (fsm.ZkCode, []byte) { return fsm.ZkBadArguments, nil })
		}
		if !c.allowed("addWatch", false, path) {
			return c.read(ctx, h.xid, func(*fsm.State) (fsm.ZkCode, []byte) { return fsm.ZkNoAuth, nil })
		}
		return c.read(ctx, h.xid, func(st *fsm.State) (fsm.ZkCode, []byte) {
			if !w.addPersistentLocked(path, c, mode == addWatchPersistentRecursive) {
				return fsm.ZkQuotaExceeded, nil
			}
			// ZooKeeper answers addWatch with an ErrorResponse of 0.
			var e encoder
			e.int(0)
			return fsm.ZkOK, e.b
		})
	case opRemoveWatches, opCheckWatches:
		path, kind := d.string(), d.int()
		if d.err != nil {
			return errBadPacket
		}
		return c.read(ctx, h.xid, func(st *fsm.State) (fsm.ZkCode, []byte) {
			if h.op == opCheckWatches {
				if !w.hasLocked(c, path, kind) {
					return codeNoWatcher, nil
				}
				return fsm.ZkOK, nil
			}
			if !w.removeLocked(c, path, kind) {
				return codeNoWatcher, nil
			}
			return fsm.ZkOK, nil
		})
	case opWhoAmI:
		return c.read(ctx, h.xid, func(st *fsm.State) (fsm.ZkCode, []byte) {
			var e encoder
			e.int(int32(len(c.ids)))
			for _, id := range c.ids {
				user := id.GetId()
				if id.GetScheme() == "digest" {
					user, _, _ = strings.Cut(user, ":")
				}
				e.string(id.GetScheme())
				e.string(user)
			}
			return fsm.ZkOK, e.b
		})
	case opMultiRead:
		return c.multiRead(ctx, h, &d)
	}
	return c.read(ctx, h.xid, func(*fsm.State) (fsm.ZkCode, []byte) { return fsm.ZkUnimplemented, nil })
}

func opReadName(op int32) string {
	switch op {
	case opExists:
		return "exists"
	case opGetData:
		return "getData"
	}
	return "getChildren"
}

func aclOf(perms int32, scheme, id string) acl { return acl{perms: perms, scheme: scheme, id: id} }

// statLen is the length of an encoded stat.
const statLen = 68

// stringsLen is the length of ss encoded as a jute vector.
func stringsLen(ss []string) int {
	n := 4
	for _, s := range ss {
		n += 4 + len(s)
	}
	return n
}

// multiRead serves a multiRead: getData and getChildren ops, each with
// its own result or error.
func (c *conn) multiRead(ctx context.Context, h requestHeader, d *decoder) error {
	type readReq struct {
		typ  int32
		path string
	}
	var reqs []readReq
	for i := 0; ; i++ {
		typ, done := d.int(), d.bool()
		_ = d.int()
		if d.err != nil {
			return errBadPacket
		}
		if done {
			break
		}
		if i >= fsm.MaxZkOps || (typ != opGetData && typ != opGetChildren) {
			return c.read(ctx, h.xid, func(*fsm.State) (fsm.ZkCode, []byte) { return fsm.ZkBadArguments, nil })
		}
		path, _ := d.string(), d.bool()
		reqs = append(reqs, readReq{typ, path})
	}
	if d.err != nil {
		return errBadPacket
	}
	allowed := make([]bool, len(reqs))
	for i, r := range reqs {
		allowed[i] = c.allowed("multiRead", false, r.path)
	}
	return c.read(ctx, h.xid, func(st *fsm.State) (fsm.ZkCode, []byte) {
		var e encoder
		for i, r := range reqs {
			data, acl, s, ok := st.Znode(r.path)
			code := fsm.ZkOK
			switch {
			case fsm.ValidateZnodePath(r.path) != nil:
				code = fsm.ZkBadArguments
			case !ok:
				code = fsm.ZkNoNode
			case !allowed[i] || !fsm.ZkAllowed(acl, fsm.ZkPermRead, c.ids):
				code = fsm.ZkNoAuth
			}
			if code != fsm.ZkOK {
				e.int(opError)
				e.bool(false)
				e.int(int32(code))
				e.int(int32(code))
				continue
			}
			e.int(r.typ)
			e.bool(false)
			e.int(0)
			if r.typ == opGetData {
				if len(e.b)+len(data)+statLen+4 > maxAnswer {
					return codeTooLarge, nil
				}
				e.buffer(data) // nil: null data, answered as ZooKeeper answers it (-1)
				e.stat(wireStat(s))
			} else {
				children, _ := st.ZnodeChildren(r.path)
				if len(e.b)+stringsLen(children) > maxAnswer {
					return codeTooLarge, nil
				}
				e.strings(children)
			}
		}
		e.int(-1)
		e.bool(true)
		e.int(-1)
		return fsm.ZkOK, e.b
	})
}
