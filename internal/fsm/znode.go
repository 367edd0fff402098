package fsm

// ZooKeeper's znodes (internal/zkapi serves them): a tree of paths, each
// with data, an ACL and ZooKeeper's stat, held in a path index beside the
// key-value store and ordered by the same revisions. A write request (or
// a multi) is one ZkTxn: its ops are checked and applied all or nothing
// at one revision, which is ZooKeeper's zxid (czxid, mzxid, pzxid). An
// ephemeral znode belongs to a session and is removed by the very command
// that ends the session (endSession), with the session's locks and keys.
//
// Everything here is deterministic: the ctime and mtime come from the
// proposer's clock in the command (ZkTxn.time_ms), the sequential
// suffix from the parent's count of child creations, and children are
// listed sorted.

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/google/btree"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// ZooKeeper's permission bits (ZooDefs.Perms).
const (
	ZkPermRead   = 1
	ZkPermWrite  = 2
	ZkPermCreate = 4
	ZkPermDelete = 8
	ZkPermAdmin  = 16
	ZkPermAll    = 31
)

// ZooKeeper's create modes (CreateMode.toFlag).
const (
	ZkPersistent           = 0
	ZkEphemeral            = 1
	ZkPersistentSequential = 2
	ZkEphemeralSequential  = 3
	ZkContainer            = 4
	// TTL nodes (ZooKeeper's createTTL): persistent nodes that the
	// leader removes once they have no children and were not changed
	// for their TTL.
	ZkPersistentWithTTL           = 5
	ZkPersistentSequentialWithTTL = 6
)

// MaxZnodeTTL is the longest TTL of a TTL node, ms: ZooKeeper's
// EphemeralType.TTL.maxValue() (2^40 - 1, about 34 years).
const MaxZnodeTTL = 1<<40 - 1

// Limits of the znode tree. They are part of the replicated contract.
const (
	// MaxZnodeData is the most data one znode holds: ZooKeeper's default
	// jute.maxbuffer (0xfffff bytes).
	MaxZnodeData = 0xfffff
	// MaxZnodePath is the longest znode path, bytes.
	MaxZnodePath = 4096
	// MaxZnodeChildren is the most children one znode has (a listing of
	// them must fit in jute.maxbuffer).
	MaxZnodeChildren = 100_000
	// MaxZnodes is the most znodes the tree holds, and MaxZnodeBytes the
	// most bytes of paths, data and ACLs (schemes and ids).
	MaxZnodes     = 1_000_000
	MaxZnodeBytes = 1 << 30
	// MaxZkOps is the most ops of one multi.
	MaxZkOps = 1000
	// MaxZnodeACL is the most entries of one ACL.
	MaxZnodeACL = 64
)

// ZkCode is one of ZooKeeper's KeeperException codes.
type ZkCode int32

// The codes a znode command answers with (KeeperException.Code).
const (
	ZkOK                      ZkCode = 0
	ZkRuntimeInconsistency    ZkCode = -2
	ZkBadArguments            ZkCode = -8
	ZkUnimplemented           ZkCode = -6
	ZkNoNode                  ZkCode = -101
	ZkNoAuth                  ZkCode = -102
	ZkBadVersion              ZkCode = -103
	ZkNoChildrenForEphemerals ZkCode = -108
	ZkNodeExists              ZkCode = -110
	ZkNotEmpty                ZkCode = -111
	ZkSessionExpired          ZkCode = -112
	ZkInvalidACL              ZkCode = -114
	ZkQuotaExceeded           ZkCode = -125
)

// ZkError is a znode command's refusal: ZooKeeper's code, and a message
// for logs.
type ZkError struct {
	Code ZkCode
	Msg  string
}

func (e *ZkError) Error() string { return fmt.Sprintf("zookeeper: %s (code %d)", e.Msg, e.Code) }

func zkErr(code ZkCode, format string, args ...any) *ZkError {
	return &ZkError{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// ZnodeEventType is ZooKeeper's watcher event type.
type ZnodeEventType int32

// The event types (Watcher.Event.EventType).
const (
	ZnodeCreated         ZnodeEventType = 1
	ZnodeDeleted         ZnodeEventType = 2
	ZnodeDataChanged     ZnodeEventType = 3
	ZnodeChildrenChanged ZnodeEventType = 4
)

// EventZnode: the znode Name changed at Revision, as ZnodeType says.
const EventZnode EventKind = 160

// ZnodeStat is ZooKeeper's Stat of a znode.
type ZnodeStat struct {
	Czxid, Mzxid, Pzxid         uint64
	Ctime, Mtime                int64
	Version, Cversion, Aversion int32
	EphemeralOwner              uint64
	DataLength, NumChildren     int32
}

// ZkOpResult is the result of one op of a ZkTxn: Path (a create's
// actual path) and Stat (of what a create or setData made), or Code.
type ZkOpResult struct {
	Code ZkCode
	Path string
	Stat ZnodeStat
}

// ZkResult is the result of a ZkTxn: one result per op. Err, for a txn
// that is not a multi, is its one op's refusal; a multi that failed has
// the failing op's code in its results and the others ZkOK (before it)
// or ZkRuntimeInconsistency (after it), as ZooKeeper answers.
type ZkResult struct {
	Ops []ZkOpResult
}

type znode struct {
	data                []byte // replaced, never written into
	acl                 []*fsmpb.ZnodeACL
	czxid, mzxid, pzxid uint64
	ctime, mtime        int64
	// cversion counts the creations of children, as ZooKeeper's
	// DataTree does (a delete leaves it): it names the next sequential
	// child; the stat reports 2*cversion - numChildren, the count of
	// changes of children (DataNode.copyStat).
	version, cversion, aversion int32
	dataNull                    bool // the data is null, not empty (data is empty then)
	container                   bool
	owner                       uint64 // the ephemeral owner's session (0: persistent, a container or TTL node too)
	ttl                         int64  // a TTL node's time to live, ms (0: not one)
	children                    map[string]struct{}
	desc                        *zcount // derived state (the count of descendants, the sorted children), shared by the txn's copies of the node
}

// zcount is what a znode's reads derive from the tree: its count of
// descendants (getAllChildrenNumber), linked to its parent's, and its
// children's names sorted (getChildren), once read. It is derived state,
// not replicated: the count is kept as znodes are created and removed,
// when a txn commits (O(depth) each), and rebuilt from the tree when a
// snapshot is restored; the listing is dropped when a commit changes the
// children; snapshots hold neither. A txn's copies of a node share its
// zcount, which only commit changes, so a failed txn leaves it as it
// was. Each znode keeps one (24 bytes, and the listing once read) and a
// pointer to it (which the znode's field order keeps within the znode's
// size class).
type zcount struct {
	n      int
	parent *zcount // nil: the root's
	// sorted: the children's names, sorted, cached by the first read
	// after a change (reads run concurrently, hence atomic); nil: not
	// cached.
	sorted atomic.Pointer[[]string]
}

// addAncestors adds d to the counts of c's node's ancestors.
func (c *zcount) addAncestors(d int) {
	for a := c.parent; a != nil; a = a.parent {
		a.n += d
	}
}

// countDescendants links every node's zcount to its parent's and counts
// the descendants, in O(nodes): sorted is z's paths in order, where a
// node comes after its ancestors (a path's prefixes sort before it).
func (z *znodeStore) countDescendants(sorted []string) {
	for _, p := range sorted {
		c := &zcount{}
		if p != "/" {
			pp, _ := ZnodeParent(p)
			c.parent = z.nodes[pp].desc
		}
		z.nodes[p].desc = c
	}
	for i := len(sorted) - 1; i >= 0; i-- {
		if c := z.nodes[sorted[i]].desc; c.parent != nil {
			c.parent.n += 1 + c.n
		}
	}
}

// shallow copies n for a txn to change; the children map is shared with
// n (a txn records its changes of children apart, zkOverlay.kids, and
// writes them into the map only when it commits).
func (n *znode) shallow() *znode {
	c := *n
	return &c
}

// stat is the node's stat with numChildren children. A container's and
// a TTL node's ephemeralOwner is 0, as ZooKeeper reports them
// (DataNode's getClientEphemeralOwner: its stored owner, which encodes
// the TTL, never reaches a client).
func (n *znode) stat(numChildren int) ZnodeStat {
	return ZnodeStat{Czxid: n.czxid, Mzxid: n.mzxid, Pzxid: n.pzxid, Ctime: n.ctime, Mtime: n.mtime,
		Version: n.version, Cversion: 2*n.cversion - int32(numChildren), Aversion: n.aversion, EphemeralOwner: n.owner,
		DataLength: int32(len(n.data)), NumChildren: int32(numChildren)}
}

// znodeStore is the tree: every znode by path, and each session's
// ephemerals.
type znodeStore struct {
	nodes map[string]*znode
	// ephemerals: each session's ephemerals' paths, in order, so that
	// getEphemerals of a prefix reads only what it answers and a session
	// that ends removes them in path order.
	ephemerals map[uint64]*btree.BTreeG[string]
	// containers: the paths of the container znodes (ZooKeeper's
	// DataTree.containers), which the leader's container check reads.
	containers map[string]struct{}
	// ttls: the paths of the TTL znodes (DataTree.ttls), which the
	// leader's container check reads too.
	ttls  map[string]struct{}
	bytes uint64            // paths, data and ACLs (zkACLBytes)
	addrs map[string]string // member -> its ZooKeeper listener address
}

// ephemeralCount is how many znodes sessions own, O(sessions).
func (z *znodeStore) ephemeralCount() int {
	n := 0
	for _, t := range z.ephemerals {
		n += t.Len()
	}
	return n
}

// openACL is ZooKeeper's OPEN_ACL_UNSAFE.
func openACL() []*fsmpb.ZnodeACL {
	return []*fsmpb.ZnodeACL{{Perms: ZkPermAll, Scheme: "world", Id: "anyone"}}
}

// newZnodeStore is the tree of a new ZooKeeper 3.8 server: the root and
// /zookeeper with its quota and config nodes, with the stats ZooKeeper
// reports for them (no child created, so the root's reported cversion is
// -1 and /zookeeper's -2; the config node's aversion -1).
func newZnodeStore() znodeStore {
	z := znodeStore{nodes: make(map[string]*znode), ephemerals: make(map[uint64]*btree.BTreeG[string]), containers: make(map[string]struct{}),
		ttls: make(map[string]struct{})}
	z.nodes["/"] = &znode{acl: openACL(), children: map[string]struct{}{"zookeeper": {}}}
	z.nodes["/zookeeper"] = &znode{acl: openACL(), children: map[string]struct{}{"quota": {}, "config": {}}}
	z.nodes["/zookeeper/quota"] = &znode{acl: openACL()}
	z.nodes["/zookeeper/config"] = &znode{aversion: -1, acl: []*fsmpb.ZnodeACL{{Perms: ZkPermRead, Scheme: "world", Id: "anyone"}}}
	// Counted as a snapshot's restore counts them, so that a member
	// restored from one counts what a member that applied the log does.
	for p, n := range z.nodes {
		z.bytes += uint64(int64(len(p)+len(n.data)) + zkACLBytes(n.acl))
	}
	z.countDescendants(slices.Sorted(maps.Keys(z.nodes)))
	return z
}

// ZnodeParent splits a path into its parent and last name ("/a/b": "/a",
// "b"; "/a": "/", "a").
func ZnodeParent(path string) (parent, name string) {
	i := strings.LastIndexByte(path, '/')
	if i <= 0 {
		return "/", path[i+1:]
	}
	return path[:i], path[i+1:]
}

// ValidateZnodePath checks a path as ZooKeeper's PathUtils.validatePath
// does; the error is ZkBadArguments.
func ValidateZnodePath(path string) error {
	if len(path) == 0 {
		return zkErr(ZkBadArguments, "path length must be > 0")
	}
	if path[0] != '/' {
		return zkErr(ZkBadArguments, "path %q must start with / character", path)
	}
	if len(path) == 1 {
		return nil
	}
	if len(path) > MaxZnodePath {
		return zkErr(ZkBadArguments, "path is %d bytes, the limit is %d", len(path), MaxZnodePath)
	}
	if path[len(path)-1] == '/' {
		return zkErr(ZkBadArguments, "path %q must not end with / character", path)
	}
	rs := []rune(path)
	for i := 1; i < len(rs); i++ {
		c, last := rs[i], rs[i-1]
		switch {
		case c == 0:
			return zkErr(ZkBadArguments, "null character not allowed @%d", i)
		case c == '/' && last == '/':
			return zkErr(ZkBadArguments, "empty node name specified @%d", i)
		case c == '.' && last == '.':
			if rs[i-2] == '/' && (i+1 == len(rs) || rs[i+1] == '/') {
				return zkErr(ZkBadArguments, "relative paths not allowed @%d", i)
			}
		case c == '.':
			if last == '/' && (i+1 == len(rs) || rs[i+1] == '/') {
				return zkErr(ZkBadArguments, "relative paths not allowed @%d", i)
			}
		case c > 0 && c <= 0x1f, c >= 0x7f && c <= 0x9f, c >= 0xd800 && c <= 0xf8ff, c >= 0xfff0:
			return zkErr(ZkBadArguments, "invalid character @%d", i)
		}
	}
	return nil
}

// Znode returns a znode's data, ACL and stat (read only: the data is
// shared with the state). The data is nil when the znode's data is null
// (created or set with null data), never otherwise.
func (s *State) Znode(path string) (data []byte, acl []*fsmpb.ZnodeACL, st ZnodeStat, ok bool) {
	n, ok := s.zk.nodes[path]
	if !ok {
		return nil, nil, ZnodeStat{}, false
	}
	switch {
	case n.dataNull:
		data = nil
	case n.data == nil:
		data = []byte{}
	default:
		data = n.data
	}
	return data, n.acl, n.stat(len(n.children)), true
}

// ZnodeChildren returns a znode's children's names, sorted (read only:
// the slice is shared with the state). The listing is sorted once after
// each change of the children and kept for the reads that follow, so a
// parent of many children listed again and again is sorted once.
func (s *State) ZnodeChildren(path string) ([]string, bool) {
	n, ok := s.zk.nodes[path]
	if !ok {
		return nil, false
	}
	if kids := n.desc.sorted.Load(); kids != nil {
		return *kids, true
	}
	kids := slices.Sorted(maps.Keys(n.children))
	n.desc.sorted.Store(&kids)
	return kids, true
}

// ZnodeDescendants is the count of the znodes under path (not path
// itself), ZooKeeper's getAllChildrenNumber: for the root, every other
// znode, /zookeeper's included. It is kept as the tree changes, so this
// is O(1).
func (s *State) ZnodeDescendants(path string) (int, bool) {
	n, ok := s.zk.nodes[path]
	if !ok {
		return 0, false
	}
	return n.desc.n, true
}

// ZnodeEphemerals returns the paths of a session's ephemerals that start
// with prefix, sorted.
func (s *State) ZnodeEphemerals(session uint64, prefix string) []string {
	var out []string
	s.ZnodeEphemeralsFunc(session, prefix, func(p string) bool {
		out = append(out, p)
		return true
	})
	return out
}

// ZnodeEphemeralsFunc calls fn with the paths of a session's ephemerals
// that start with prefix, in order, until fn returns false: O(log n) to
// find the first, then O(1) each, however many ephemerals the session
// has outside prefix.
func (s *State) ZnodeEphemeralsFunc(session uint64, prefix string, fn func(path string) bool) {
	t := s.zk.ephemerals[session]
	if t == nil {
		return
	}
	t.AscendGreaterOrEqual(prefix, func(p string) bool {
		return strings.HasPrefix(p, prefix) && fn(p)
	})
}

// ZnodeContainerCandidates is what ZooKeeper's container manager
// removes: the containers with no children that had one once (their
// count of child creations, ZooKeeper's stored cversion, is above 0), in
// path order, at most limit of them.
func (s *State) ZnodeContainerCandidates(limit int) []string {
	var out []string
	for _, p := range slices.Sorted(maps.Keys(s.zk.containers)) {
		if len(out) >= limit {
			break
		}
		if n := s.zk.nodes[p]; n != nil && len(n.children) == 0 && n.cversion > 0 {
			out = append(out, p)
		}
	}
	return out
}

// ZnodeTTLCandidate is a TTL node the leader's check found expired, with
// what it read of it: the removal (ZkDelete.ttl) carries them, and the
// state machine keeps the node if they changed since.
type ZnodeTTLCandidate struct {
	Path     string
	Mzxid    uint64
	Cversion int32 // the count of child creations, as stored
}

// ZnodeTTLCandidates is what ZooKeeper's container manager removes of the
// TTL nodes: those with no children whose mtime is more than their TTL
// before nowMs, in path order, at most limit of them.
func (s *State) ZnodeTTLCandidates(nowMs int64, limit int) []ZnodeTTLCandidate {
	var out []ZnodeTTLCandidate
	for _, p := range slices.Sorted(maps.Keys(s.zk.ttls)) {
		if len(out) >= limit {
			break
		}
		if n := s.zk.nodes[p]; n != nil && len(n.children) == 0 && n.ttlExpired(nowMs) {
			out = append(out, ZnodeTTLCandidate{Path: p, Mzxid: n.mzxid, Cversion: n.cversion})
		}
	}
	return out
}

// ttlExpired reports whether n is a TTL node whose mtime is more than its
// TTL before nowMs (ContainerManager: elapsed > ttl).
func (n *znode) ttlExpired(nowMs int64) bool {
	return n.ttl > 0 && nowMs-n.mtime > n.ttl
}

// ZnodeCount is how many znodes the tree holds.
func (s *State) ZnodeCount() int { return len(s.zk.nodes) }

// ZkAddr is member's ZooKeeper listener address ("" unknown).
func (s *State) ZkAddr(member string) string { return s.zk.addrs[member] }

// setZkAddr records (or with an empty address removes) a member's
// ZooKeeper listener address; like setClientAddr it takes no revision.
func (s *State) setZkAddr(c *fsmpb.SetEtcdURL) Result {
	_, err := setMemberAddr(&s.zk.addrs, c, "a ZooKeeper address", MaxClientAddrs, maxClientAddrLen)
	return Result{Err: err}
}

// ZkAllowed reports whether an ACL grants perm to one of ids (world:anyone
// always matches).
func ZkAllowed(acl []*fsmpb.ZnodeACL, perm int32, ids []*fsmpb.ZnodeACL) bool {
	for _, a := range acl {
		if a.GetPerms()&perm == 0 {
			continue
		}
		if a.GetScheme() == "world" && a.GetId() == "anyone" {
			return true
		}
		for _, id := range ids {
			if id.GetScheme() == "super" {
				return true
			}
			if id.GetScheme() == a.GetScheme() && id.GetId() == a.GetId() {
				return true
			}
		}
	}
	return false
}

// fixupZkACL is ZooKeeper's fixupACL: an empty ACL, an unknown scheme or
// an "auth" entry with no authenticated id is InvalidACL; "auth" becomes
// the caller's ids; duplicates are dropped.
// zkACLBytes is what an ACL counts against MaxZnodeBytes: its schemes
// and ids (a client's ACL ids are its own to choose, up to a request's
// size, so they count as the data does).
func zkACLBytes(acl []*fsmpb.ZnodeACL) int64 {
	var n int64
	for _, a := range acl {
		n += int64(len(a.GetScheme()) + len(a.GetId()))
	}
	return n
}

func fixupZkACL(acl []*fsmpb.ZnodeACL, ids []*fsmpb.ZnodeACL) ([]*fsmpb.ZnodeACL, *ZkError) {
	if len(acl) == 0 || len(acl) > MaxZnodeACL {
		return nil, zkErr(ZkInvalidACL, "an ACL has 1 to %d entries, not %d", MaxZnodeACL, len(acl))
	}
	var out []*fsmpb.ZnodeACL
	add := func(a *fsmpb.ZnodeACL) {
		for _, o := range out {
			if o.GetPerms() == a.GetPerms() && o.GetScheme() == a.GetScheme() && o.GetId() == a.GetId() {
				return
			}
		}
		out = append(out, a)
	}
	for _, a := range acl {
		switch a.GetScheme() {
		case "world":
			if a.GetId() != "anyone" {
				return nil, zkErr(ZkInvalidACL, "world:%s is not a valid id", a.GetId())
			}
			add(&fsmpb.ZnodeACL{Perms: a.GetPerms(), Scheme: "world", Id: "anyone"})
		case "auth":
			found := false
			for _, id := range ids {
				if id.GetScheme() == "digest" || id.GetScheme() == "x509" {
					add(&fsmpb.ZnodeACL{Perms: a.GetPerms(), Scheme: id.GetScheme(), Id: id.GetId()})
					found = true
				}
			}
			if !found {
				return nil, zkErr(ZkInvalidACL, "the auth scheme needs an authenticated id")
			}
		case "digest":
			if strings.Count(a.GetId(), ":") != 1 {
				return nil, zkErr(ZkInvalidACL, "digest:%s is not user:digest", a.GetId())
			}
			add(&fsmpb.ZnodeACL{Perms: a.GetPerms(), Scheme: "digest", Id: a.GetId()})
		case "ip", "x509":
			if a.GetId() == "" {
				return nil, zkErr(ZkInvalidACL, "%s: empty id", a.GetScheme())
			}
			add(&fsmpb.ZnodeACL{Perms: a.GetPerms(), Scheme: a.GetScheme(), Id: a.GetId()})
		default:
			return nil, zkErr(ZkInvalidACL, "unknown scheme %q", a.GetScheme())
		}
	}
	return out, nil
}

// zkOverlay is a ZkTxn's view of the tree: the znodes it changed (nil:
// deleted), over the state's. Nothing reaches the state unless every op
// passed.
type zkOverlay struct {
	s       *State
	changed map[string]*znode
	order   []string // paths in the order they were first changed
	// fresh: nodes the txn created, whose children map is their own;
	// kids: the changes of the children of the other changed nodes
	// (name: true added, false removed), over the map they share with
	// the state's node, so that a txn costs no copy of a large parent's
	// children.
	fresh  map[string]bool
	kids   map[string]map[string]bool
	events []Event
	nodes  int   // change of the node count
	bytes  int64 // change of the byte count
}

func newOverlay(s *State) *zkOverlay {
	return &zkOverlay{s: s, changed: make(map[string]*znode), fresh: make(map[string]bool), kids: make(map[string]map[string]bool)}
}

// childCount is how many children path's node n has in the txn's view.
func (o *zkOverlay) childCount(path string, n *znode) int {
	c := len(n.children)
	if o.fresh[path] {
		return c
	}
	for _, added := range o.kids[path] {
		if added {
			c++
		} else {
			c--
		}
	}
	return c
}

func (o *zkOverlay) addChild(path string, n *znode, name string) {
	if o.fresh[path] {
		if n.children == nil {
			n.children = make(map[string]struct{})
		}
		n.children[name] = struct{}{}
		return
	}
	k := o.kids[path]
	if k == nil {
		k = make(map[string]bool)
		o.kids[path] = k
	}
	if _, base := n.children[name]; base {
		delete(k, name) // removed earlier in the txn, back again
	} else {
		k[name] = true
	}
}

func (o *zkOverlay) removeChild(path string, n *znode, name string) {
	if o.fresh[path] {
		delete(n.children, name)
		return
	}
	k := o.kids[path]
	if k == nil {
		k = make(map[string]bool)
		o.kids[path] = k
	}
	if _, base := n.children[name]; base {
		k[name] = false
	} else {
		delete(k, name) // added earlier in the txn
	}
}

// stat is n's stat in the txn's view.
func (o *zkOverlay) stat(path string, n *znode) ZnodeStat {
	return n.stat(o.childCount(path, n))
}

// commit writes the overlay into the state: the nodes, each session's
// ephemerals, the children and the byte count.
func (o *zkOverlay) commit() {
	s := o.s
	for _, p := range o.order {
		n := o.changed[p]
		old := s.zk.nodes[p]
		// The counts of descendants: a node that is gone (or was
		// replaced: deleted and created again) leaves its ancestors, a
		// new one joins its own. A deleted node's zcount is dropped with
		// it; its chain still reaches the live ancestors'.
		if old != nil && (n == nil || n.desc != old.desc) {
			old.desc.addAncestors(-1)
		}
		if n != nil && (old == nil || n.desc != old.desc) {
			n.desc.addAncestors(1)
		}
		if old != nil && old.owner != 0 && (n == nil || n.owner != old.owner) {
			s.unEphemeral(old.owner, p)
		}
		if n == nil || !n.container {
			delete(s.zk.containers, p)
		} else {
			s.zk.containers[p] = struct{}{}
		}
		if n == nil || n.ttl == 0 {
			delete(s.zk.ttls, p)
		} else {
			s.zk.ttls[p] = struct{}{}
		}
		if n == nil {
			delete(s.zk.nodes, p)
			continue
		}
		if n.owner != 0 && (old == nil || old.owner != n.owner) {
			s.zk.addEphemeral(n.owner, p)
		}
		s.zk.nodes[p] = n
		if k := o.kids[p]; len(k) > 0 && !o.fresh[p] {
			for _, name := range slices.Sorted(maps.Keys(k)) {
				if k[name] {
					if n.children == nil {
						n.children = make(map[string]struct{})
					}
					n.children[name] = struct{}{}
				} else {
					delete(n.children, name)
				}
			}
			n.desc.sorted.Store(nil)
		}
	}
	s.zk.bytes = uint64(int64(s.zk.bytes) + o.bytes)
}

func (o *zkOverlay) get(path string) *znode {
	if n, ok := o.changed[path]; ok {
		return n
	}
	return o.s.zk.nodes[path]
}

// edit returns a copy of path's node that the txn may change.
func (o *zkOverlay) edit(path string) *znode {
	if n, ok := o.changed[path]; ok {
		return n
	}
	n := o.s.zk.nodes[path].shallow()
	o.set(path, n)
	return n
}

func (o *zkOverlay) set(path string, n *znode) {
	if _, ok := o.changed[path]; !ok {
		o.order = append(o.order, path)
	}
	o.changed[path] = n
}

func (o *zkOverlay) event(t ZnodeEventType, path string) {
	var acl []*fsmpb.ZnodeACL
	if n := o.get(path); n != nil {
		acl = n.acl
	}
	o.eventACL(t, path, acl)
}

// eventACL records an event of a znode whose ACL is acl (a removed one's).
func (o *zkOverlay) eventACL(t ZnodeEventType, path string, acl []*fsmpb.ZnodeACL) {
	o.events = append(o.events, Event{Kind: EventZnode, Name: path, ZnodeType: t, ZnodeACL: acl})
}

// zkTxn applies a ZkTxn: every op in order on an overlay; if all pass,
// the overlay becomes the state at one new revision and the events are
// emitted; otherwise nothing changes.
func (s *State) zkTxn(c *fsmpb.ZkTxn, emit EventSink) Result {
	ops := c.GetOps()
	if len(ops) == 0 || len(ops) > MaxZkOps || (!c.GetMulti() && len(ops) != 1) {
		return Result{Err: fmt.Errorf("%w: a znode txn has 1 to %d ops (one unless a multi), not %d", ErrInvalid, MaxZkOps, len(ops))}
	}
	res := &ZkResult{Ops: make([]ZkOpResult, len(ops))}
	if c.GetSession() != 0 {
		if _, ok := s.sessions[c.GetSession()]; !ok {
			return Result{Err: zkErr(ZkSessionExpired, "session %d expired", c.GetSession())}
		}
	}
	rev := s.revision + 1
	o := newOverlay(s)
	failed := -1
	for i, op := range ops {
		r, err := o.apply(op, c, rev)
		if err != nil {
			res.Ops[i] = ZkOpResult{Code: err.Code}
			failed = i
			if !c.GetMulti() {
				return Result{Err: err, Zk: res}
			}
			break
		}
		res.Ops[i] = r
	}
	if failed >= 0 {
		for i := range res.Ops {
			switch {
			case i < failed:
				res.Ops[i] = ZkOpResult{Code: ZkOK}
			case i > failed:
				res.Ops[i] = ZkOpResult{Code: ZkRuntimeInconsistency}
			}
		}
		return Result{Zk: res}
	}
	if uint64(int64(len(s.zk.nodes))+int64(o.nodes)) > MaxZnodes || uint64(int64(s.zk.bytes)+o.bytes) > MaxZnodeBytes {
		e := zkErr(ZkQuotaExceeded, "the znode tree holds at most %d znodes and %d bytes", MaxZnodes, MaxZnodeBytes)
		if !c.GetMulti() {
			return Result{Err: e, Zk: res}
		}
		res.Ops[0] = ZkOpResult{Code: e.Code}
		for i := 1; i < len(res.Ops); i++ {
			res.Ops[i] = ZkOpResult{Code: ZkRuntimeInconsistency}
		}
		return Result{Zk: res}
	}
	s.bump()
	o.commit()
	for _, e := range o.events {
		e.Revision = s.revision
		emit(e)
	}
	return Result{Zk: res}
}

func (s *State) unEphemeral(owner uint64, path string) {
	t := s.zk.ephemerals[owner]
	if t == nil {
		return
	}
	t.Delete(path)
	if t.Len() == 0 {
		delete(s.zk.ephemerals, owner)
	}
}

// addEphemeral records path as an ephemeral of owner.
func (z *znodeStore) addEphemeral(owner uint64, path string) {
	t := z.ephemerals[owner]
	if t == nil {
		t = btree.NewG(32, func(a, b string) bool { return a < b })
		z.ephemerals[owner] = t
	}
	t.ReplaceOrInsert(path)
}

// apply checks and applies one op on the overlay, in ZooKeeper's order of
// checks (PrepRequestProcessor).
func (o *zkOverlay) apply(op *fsmpb.ZkOp, c *fsmpb.ZkTxn, rev uint64) (ZkOpResult, *ZkError) {
	ids := c.GetIds()
	switch {
	case op.GetCreate() != nil:
		return o.create(op.GetCreate(), c, rev)
	case op.GetDelete() != nil:
		d := op.GetDelete()
		if d.GetPath() == "/" {
			// ZooKeeper refuses to delete the root as a bad argument.
			return ZkOpResult{}, zkErr(ZkBadArguments, "the root cannot be deleted")
		}
		if err := ValidateZnodePath(d.GetPath()); err != nil {
			return ZkOpResult{}, err.(*ZkError)
		}
		parentPath, name := ZnodeParent(d.GetPath())
		parent := o.get(parentPath)
		n := o.get(d.GetPath())
		if parent == nil || n == nil {
			return ZkOpResult{}, zkErr(ZkNoNode, "%s", d.GetPath())
		}
		if d.GetContainer() {
			// The leader's container removal (ZooKeeper's
			// deleteContainer): a node that is not a container is
			// refused with BadVersion, as ZooKeeper refuses it; one that
			// has a child, or never had one (created again since the
			// check), with NotEmpty. Neither ACL nor version is checked.
			switch {
			case !n.container:
				return ZkOpResult{}, zkErr(ZkBadVersion, "%s is not a container", d.GetPath())
			case o.childCount(d.GetPath(), n) > 0 || n.cversion == 0:
				return ZkOpResult{}, zkErr(ZkNotEmpty, "%s is not an emptied container", d.GetPath())
			}
			o.remove(d.GetPath(), parentPath, name, n, rev)
			return ZkOpResult{}, nil
		}
		if d.GetTtl() {
			// The leader's removal of an expired TTL node: it goes only
			// if it is as the leader read it (neither set nor given a
			// child since: its mzxid and count of child creations), has
			// no children, and its mtime is more than its TTL before the
			// command's time. Neither ACL nor version is checked.
			switch {
			case n.ttl == 0:
				return ZkOpResult{}, zkErr(ZkBadVersion, "%s is not a TTL node", d.GetPath())
			case o.childCount(d.GetPath(), n) > 0:
				return ZkOpResult{}, zkErr(ZkNotEmpty, "%s has children", d.GetPath())
			case n.mzxid != d.GetSeenMzxid() || n.cversion != d.GetSeenCversion():
				return ZkOpResult{}, zkErr(ZkBadVersion, "%s changed since the TTL check", d.GetPath())
			case !n.ttlExpired(c.GetTimeMs()):
				return ZkOpResult{}, zkErr(ZkBadVersion, "%s has not expired at %d", d.GetPath(), c.GetTimeMs())
			}
			o.remove(d.GetPath(), parentPath, name, n, rev)
			return ZkOpResult{}, nil
		}
		if !ZkAllowed(parent.acl, ZkPermDelete, ids) {
			return ZkOpResult{}, zkErr(ZkNoAuth, "%s", d.GetPath())
		}
		if v := d.GetVersion(); v != -1 && v != n.version {
			return ZkOpResult{}, zkErr(ZkBadVersion, "%s", d.GetPath())
		}
		if o.childCount(d.GetPath(), n) > 0 {
			return ZkOpResult{}, zkErr(ZkNotEmpty, "%s", d.GetPath())
		}
		o.remove(d.GetPath(), parentPath, name, n, rev)
		return ZkOpResult{}, nil
	case op.GetSetData() != nil:
		sd := op.GetSetData()
		if err := ValidateZnodePath(sd.GetPath()); err != nil {
			return ZkOpResult{}, err.(*ZkError)
		}
		if len(sd.GetData()) > MaxZnodeData {
			return ZkOpResult{}, zkErr(ZkBadArguments, "data is %d bytes, jute.maxbuffer is %d", len(sd.GetData()), MaxZnodeData)
		}
		n := o.get(sd.GetPath())
		if n == nil {
			return ZkOpResult{}, zkErr(ZkNoNode, "%s", sd.GetPath())
		}
		if !ZkAllowed(n.acl, ZkPermWrite, ids) {
			return ZkOpResult{}, zkErr(ZkNoAuth, "%s", sd.GetPath())
		}
		if v := sd.GetVersion(); v != -1 && v != n.version {
			return ZkOpResult{}, zkErr(ZkBadVersion, "%s", sd.GetPath())
		}
		e := o.edit(sd.GetPath())
		o.bytes += int64(len(sd.GetData())) - int64(len(e.data))
		e.data = append([]byte(nil), sd.GetData()...)
		e.dataNull = sd.GetDataNull() && len(sd.GetData()) == 0
		e.version++
		e.mzxid, e.mtime = rev, c.GetTimeMs()
		o.event(ZnodeDataChanged, sd.GetPath())
		return ZkOpResult{Stat: o.stat(sd.GetPath(), e)}, nil
	case op.GetCheck() != nil:
		ck := op.GetCheck()
		if err := ValidateZnodePath(ck.GetPath()); err != nil {
			return ZkOpResult{}, err.(*ZkError)
		}
		n := o.get(ck.GetPath())
		if n == nil {
			return ZkOpResult{}, zkErr(ZkNoNode, "%s", ck.GetPath())
		}
		if !ZkAllowed(n.acl, ZkPermRead, ids) {
			return ZkOpResult{}, zkErr(ZkNoAuth, "%s", ck.GetPath())
		}
		if v := ck.GetVersion(); v != -1 && v != n.version {
			return ZkOpResult{}, zkErr(ZkBadVersion, "%s", ck.GetPath())
		}
		return ZkOpResult{}, nil
	case op.GetSetAcl() != nil:
		sa := op.GetSetAcl()
		if err := ValidateZnodePath(sa.GetPath()); err != nil {
			return ZkOpResult{}, err.(*ZkError)
		}
		n := o.get(sa.GetPath())
		if n == nil {
			return ZkOpResult{}, zkErr(ZkNoNode, "%s", sa.GetPath())
		}
		if !ZkAllowed(n.acl, ZkPermAdmin, ids) {
			return ZkOpResult{}, zkErr(ZkNoAuth, "%s", sa.GetPath())
		}
		acl, err := fixupZkACL(sa.GetAcl(), ids)
		if err != nil {
			return ZkOpResult{}, err
		}
		if v := sa.GetVersion(); v != -1 && v != n.aversion {
			return ZkOpResult{}, zkErr(ZkBadVersion, "%s", sa.GetPath())
		}
		e := o.edit(sa.GetPath())
		o.bytes += zkACLBytes(acl) - zkACLBytes(e.acl)
		e.acl = acl
		e.aversion++
		return ZkOpResult{Stat: o.stat(sa.GetPath(), e)}, nil
	}
	return ZkOpResult{}, zkErr(ZkUnimplemented, "unknown op")
}

func (o *zkOverlay) create(cr *fsmpb.ZkCreate, c *fsmpb.ZkTxn, rev uint64) (ZkOpResult, *ZkError) {
	flags := cr.GetFlags()
	if flags < ZkPersistent || flags > ZkPersistentSequentialWithTTL {
		return ZkOpResult{}, zkErr(ZkBadArguments, "create flags %d", flags)
	}
	// A TTL mode needs a TTL of 1 ms to MaxZnodeTTL, and only a TTL mode
	// takes one (ZooKeeper's EphemeralType.validateTTL, checked first).
	ttlMode := flags == ZkPersistentWithTTL || flags == ZkPersistentSequentialWithTTL
	if ttl := cr.GetTtlMs(); ttlMode && (ttl <= 0 || ttl > MaxZnodeTTL) {
		return ZkOpResult{}, zkErr(ZkBadArguments, "a TTL node's ttl is 1 to %d ms, not %d", int64(MaxZnodeTTL), ttl)
	} else if !ttlMode && ttl != 0 {
		return ZkOpResult{}, zkErr(ZkBadArguments, "create flags %d take no ttl", flags)
	}
	ephemeral := flags == ZkEphemeral || flags == ZkEphemeralSequential
	sequential := flags == ZkPersistentSequential || flags == ZkEphemeralSequential || flags == ZkPersistentSequentialWithTTL
	if ephemeral && c.GetSession() == 0 {
		return ZkOpResult{}, zkErr(ZkBadArguments, "an ephemeral node needs a session")
	}
	// ZooKeeper's order of checks (PrepRequestProcessor): a path without
	// a slash or with a NUL is refused, then the parent (what precedes the
	// last slash) must exist, and only then is the whole path validated:
	// "/a//x" and "/a/./x" have no parent (NoNode), "/a/" is refused.
	path := cr.GetPath()
	slash := strings.LastIndexByte(path, '/')
	if slash < 0 || strings.IndexByte(path, 0) >= 0 {
		return ZkOpResult{}, zkErr(ZkBadArguments, "path %q", path)
	}
	if len(cr.GetData()) > MaxZnodeData {
		return ZkOpResult{}, zkErr(ZkBadArguments, "data is %d bytes, jute.maxbuffer is %d", len(cr.GetData()), MaxZnodeData)
	}
	acl, aerr := fixupZkACL(cr.GetAcl(), c.GetIds())
	if aerr != nil {
		return ZkOpResult{}, aerr
	}
	parentPath := path[:slash]
	if parentPath == "" {
		parentPath = "/"
	}
	parent := o.get(parentPath)
	if parent == nil {
		return ZkOpResult{}, zkErr(ZkNoNode, "%s", parentPath)
	}
	if !ZkAllowed(parent.acl, ZkPermCreate, c.GetIds()) {
		return ZkOpResult{}, zkErr(ZkNoAuth, "%s", path)
	}
	if sequential {
		// The suffix is the count of the parent's child creations
		// (PrepRequestProcessor: its internal cversion, which a delete
		// leaves), so a deleted child's number is not reused.
		path = fmt.Sprintf("%s%010d", path, parent.cversion)
	}
	if err := ValidateZnodePath(path); err != nil {
		return ZkOpResult{}, err.(*ZkError)
	}
	if path == "/" || o.get(path) != nil {
		return ZkOpResult{}, zkErr(ZkNodeExists, "%s", path)
	}
	if parent.owner != 0 {
		return ZkOpResult{}, zkErr(ZkNoChildrenForEphemerals, "%s", path)
	}
	if o.childCount(parentPath, parent) >= MaxZnodeChildren {
		return ZkOpResult{}, zkErr(ZkQuotaExceeded, "%s has %d children, the limit", parentPath, MaxZnodeChildren)
	}
	_, name := ZnodeParent(path)
	p := o.edit(parentPath)
	o.addChild(parentPath, p, name)
	p.cversion++
	p.pzxid = rev
	n := &znode{data: append([]byte(nil), cr.GetData()...), acl: acl, czxid: rev, mzxid: rev, pzxid: rev,
		ctime: c.GetTimeMs(), mtime: c.GetTimeMs(), container: flags == ZkContainer, dataNull: cr.GetDataNull() && len(cr.GetData()) == 0,
		desc: &zcount{parent: p.desc}}
	if ttlMode {
		n.ttl = cr.GetTtlMs()
	}
	if ephemeral {
		n.owner = c.GetSession()
	}
	o.set(path, n)
	o.fresh[path] = true
	delete(o.kids, path)
	o.nodes++
	o.bytes += int64(len(path)+len(n.data)) + zkACLBytes(n.acl)
	o.event(ZnodeCreated, path)
	o.event(ZnodeChildrenChanged, parentPath)
	return ZkOpResult{Path: path, Stat: n.stat(0)}, nil
}

// remove deletes n (a leaf) at path from the overlay. A container parent
// left without children stays: the leader's container check removes it
// later (ZkDelete.container), as ZooKeeper's container manager does, so
// that a client that created it as the parent of a node it is about to
// create does not see it vanish in between.
func (o *zkOverlay) remove(path, parentPath, name string, n *znode, rev uint64) {
	o.set(path, nil)
	delete(o.fresh, path)
	delete(o.kids, path)
	o.nodes--
	o.bytes -= int64(len(path)+len(n.data)) + zkACLBytes(n.acl)
	p := o.edit(parentPath)
	o.removeChild(parentPath, p, name)
	p.pzxid = rev
	o.eventACL(ZnodeDeleted, path, n.acl)
	o.event(ZnodeChildrenChanged, parentPath)
}

// zkEndSession removes the ephemerals of a session that ends, in path
// order (deepest first within a path: an ephemeral has no children), at
// the revision of the command that ends it.
func (s *State) zkEndSession(id uint64, emit EventSink) {
	t := s.zk.ephemerals[id]
	if t == nil {
		return
	}
	paths := make([]string, 0, t.Len())
	t.Ascend(func(p string) bool {
		paths = append(paths, p)
		return true
	})
	rev := s.revision
	o := newOverlay(s)
	for _, p := range paths {
		n := o.get(p)
		if n == nil {
			continue
		}
		parentPath, name := ZnodeParent(p)
		o.remove(p, parentPath, name, n, rev)
	}
	o.commit()
	delete(s.zk.ephemerals, id)
	for _, e := range o.events {
		e.Revision = rev
		emit(e)
	}
}

// exportZnodes writes the tree, in path order, once the cluster version
// allows znodes (before it, the tree is always the initial one).
func (s *State) exportZnodes(snap *fsmpb.Snapshot) {
	if !s.at(3) {
		return
	}
	for _, p := range slices.Sorted(maps.Keys(s.zk.nodes)) {
		n := s.zk.nodes[p]
		snap.Znodes = append(snap.Znodes, &fsmpb.ZnodeState{Path: p, Data: n.data, Acl: n.acl, Czxid: n.czxid, Mzxid: n.mzxid, Pzxid: n.pzxid,
			Ctime: n.ctime, Mtime: n.mtime, Version: n.version, Cversion: n.cversion, Aversion: n.aversion, EphemeralOwner: n.owner, Container: n.container,
			DataNull: n.dataNull, TtlMs: n.ttl})
	}
	snap.ZkAddrs = exportEtcdURLs(s.zk.addrs)
}

// importZnodes rebuilds the tree of a snapshot (absent: the initial one).
func (s *State) importZnodes(snap *fsmpb.Snapshot) error {
	s.zk.addrs = importEtcdURLs(snap.GetZkAddrs())
	if len(snap.GetZnodes()) == 0 {
		return nil
	}
	z := znodeStore{nodes: make(map[string]*znode), ephemerals: make(map[uint64]*btree.BTreeG[string]), containers: make(map[string]struct{}),
		ttls: make(map[string]struct{}), addrs: s.zk.addrs}
	for _, zs := range snap.GetZnodes() {
		p := zs.GetPath()
		if err := ValidateZnodePath(p); err != nil {
			return fmt.Errorf("snapshot: znode %q: %w", p, err)
		}
		if _, dup := z.nodes[p]; dup {
			return fmt.Errorf("snapshot: znode %q twice", p)
		}
		z.nodes[p] = &znode{data: zs.GetData(), acl: zs.GetAcl(), czxid: zs.GetCzxid(), mzxid: zs.GetMzxid(), pzxid: zs.GetPzxid(),
			ctime: zs.GetCtime(), mtime: zs.GetMtime(), version: zs.GetVersion(), cversion: zs.GetCversion(), aversion: zs.GetAversion(),
			owner: zs.GetEphemeralOwner(), container: zs.GetContainer(), dataNull: zs.GetDataNull() && len(zs.GetData()) == 0, ttl: zs.GetTtlMs()}
		if t := zs.GetTtlMs(); t != 0 && (t < 0 || t > MaxZnodeTTL || zs.GetEphemeralOwner() != 0 || zs.GetContainer()) {
			return fmt.Errorf("snapshot: znode %q: a TTL of %d ms on a node that cannot have one", p, t)
		}
		z.bytes += uint64(int64(len(p)+len(zs.GetData())) + zkACLBytes(zs.GetAcl()))
	}
	if z.nodes["/"] == nil {
		return fmt.Errorf("snapshot: the znode tree has no root")
	}
	sorted := slices.Sorted(maps.Keys(z.nodes))
	for _, p := range sorted {
		n := z.nodes[p]
		if n.container {
			z.containers[p] = struct{}{}
		}
		if n.ttl != 0 {
			z.ttls[p] = struct{}{}
		}
		if n.owner != 0 {
			if _, ok := s.sessions[n.owner]; !ok {
				return fmt.Errorf("snapshot: ephemeral znode %q of session %d, which is not live", p, n.owner)
			}
			z.addEphemeral(n.owner, p)
		}
		if p == "/" {
			continue
		}
		pp, name := ZnodeParent(p)
		parent := z.nodes[pp]
		if parent == nil {
			return fmt.Errorf("snapshot: znode %q has no parent", p)
		}
		if parent.children == nil {
			parent.children = make(map[string]struct{})
		}
		parent.children[name] = struct{}{}
	}
	z.countDescendants(sorted)
	s.zk = z
	return nil
}
