package fsm_test

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

func zkTxn(session uint64, multi bool, ops ...*fsmpb.ZkOp) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_ZkTxn{ZkTxn: &fsmpb.ZkTxn{Session: session, TimeMs: 1000, Ops: ops, Multi: multi}}}
}

func zkCreate(path string, flags int32) *fsmpb.ZkOp {
	return &fsmpb.ZkOp{Op: &fsmpb.ZkOp_Create{Create: &fsmpb.ZkCreate{Path: path, Data: []byte("d"), Flags: flags,
		Acl: []*fsmpb.ZnodeACL{{Perms: fsm.ZkPermAll, Scheme: "world", Id: "anyone"}}}}}
}

func zkDelete(path string, version int32) *fsmpb.ZkOp {
	return &fsmpb.ZkOp{Op: &fsmpb.ZkOp_Delete{Delete: &fsmpb.ZkDelete{Path: path, Version: version}}}
}

func zkCode(err error) fsm.ZkCode {
	var ze *fsm.ZkError
	if errors.As(err, &ze) {
		return ze.Code
	}
	return 1
}

// TestZnodeTxn: creates, sequential names, errors in ZooKeeper's codes,
// and a multi that fails at one op changing nothing (not even the
// revision).
func TestZnodeTxn(t *testing.T) {
	st := fsm.NewState()
	sess := st.Apply(cmdCreate("zk", 10_000), nil).Session
	if r, _ := apply(t, st, zkTxn(sess, false, zkCreate("/a", fsm.ZkPersistent))); r.Err != nil || r.Zk.Ops[0].Stat.Czxid != r.Revision {
		t.Fatalf("create /a: %+v", r)
	}
	cases := []struct {
		op   *fsmpb.ZkOp
		code fsm.ZkCode
	}{
		{zkCreate("/a", 0), fsm.ZkNodeExists},
		{zkCreate("/x/y", 0), fsm.ZkNoNode},
		{zkCreate("/a/", 0), fsm.ZkBadArguments},
		{zkCreate("/a/./b", 0), fsm.ZkNoNode}, // ZooKeeper looks the parent up first
		{zkCreate("/a//b", 0), fsm.ZkNoNode},
		{zkCreate("a", 0), fsm.ZkBadArguments},
		{zkDelete("/a", 3), fsm.ZkBadVersion},
		{zkDelete("/", -1), fsm.ZkBadArguments},
		{zkDelete("/nope", -1), fsm.ZkNoNode},
	}
	for _, c := range cases {
		rev := st.Revision()
		r, evs := apply(t, st, zkTxn(sess, false, c.op))
		if zkCode(r.Err) != c.code || st.Revision() != rev || len(evs) != 0 {
			t.Fatalf("%v: %v (revision %d -> %d, %d events), want code %d and nothing changed", c.op, r.Err, rev, st.Revision(), len(evs), c.code)
		}
	}
	for i, want := range []string{"/a/s-0000000000", "/a/s-0000000001"} {
		r, _ := apply(t, st, zkTxn(sess, false, zkCreate("/a/s-", fsm.ZkEphemeralSequential)))
		if r.Err != nil || r.Zk.Ops[0].Path != want {
			t.Fatalf("sequential %d: %+v, want %s", i, r, want)
		}
	}
	rev := st.Revision()
	r, evs := apply(t, st, zkTxn(sess, true, zkCreate("/b", 0), zkCreate("/b/c", 0), zkDelete("/a", -1)))
	if r.Err != nil || st.Revision() != rev || len(evs) != 0 {
		t.Fatalf("failed multi: %+v, revision %d -> %d, %d events", r, rev, st.Revision(), len(evs))
	}
	if got := []fsm.ZkCode{r.Zk.Ops[0].Code, r.Zk.Ops[1].Code, r.Zk.Ops[2].Code}; got[0] != fsm.ZkOK || got[1] != fsm.ZkOK || got[2] != fsm.ZkNotEmpty {
		t.Fatalf("failed multi's codes %v, want [0 0 NotEmpty]", got)
	}
	if _, _, _, ok := st.Znode("/b"); ok {
		t.Fatal("a failed multi created /b")
	}
	// The session's end removes its ephemerals, in the same command.
	r, evs = apply(t, st, &fsmpb.Command{Op: &fsmpb.Command_CloseSession{CloseSession: &fsmpb.CloseSession{Session: sess}}})
	kids, _ := st.ZnodeChildren("/a")
	if r.Err != nil || len(kids) != 0 {
		t.Fatalf("after the session closed: %v, children %v", r.Err, kids)
	}
	deleted := 0
	for _, e := range evs {
		if e.Kind == fsm.EventZnode && e.ZnodeType == fsm.ZnodeDeleted {
			deleted++
		}
	}
	if deleted != 2 {
		t.Fatalf("%d NodeDeleted events, want 2", deleted)
	}
	if r, _ := apply(t, st, zkTxn(sess, false, zkCreate("/e", fsm.ZkEphemeral))); zkCode(r.Err) != fsm.ZkSessionExpired {
		t.Fatalf("create by an ended session: %v, want SessionExpired", r.Err)
	}
}

func zkDeleteContainer(path string) *fsmpb.Command {
	return zkTxn(0, false, &fsmpb.ZkOp{Op: &fsmpb.ZkOp_Delete{Delete: &fsmpb.ZkDelete{Path: path, Version: -1, Container: true}}})
}

// TestZnodeContainerStaysAfterItsLastChild: deleting a container's last
// child leaves the container (ZooKeeper removes it later, from its
// container manager; removing it in the same command let a concurrent
// Curator client's create under it fail with NoNode), and the leader's
// container check lists it.
func TestZnodeContainerStaysAfterItsLastChild(t *testing.T) {
	st := fsm.NewState()
	sess := st.Apply(cmdCreate("zk", 10_000), nil).Session
	apply(t, st, zkTxn(0, false, zkCreate("/c", fsm.ZkContainer)))
	apply(t, st, zkTxn(0, false, zkCreate("/c/x", 0)))
	apply(t, st, zkTxn(0, false, zkCreate("/d", fsm.ZkContainer)))
	apply(t, st, zkTxn(sess, false, zkCreate("/d/e", fsm.ZkEphemeral)))
	if _, _, s, _ := st.Znode("/c"); s.EphemeralOwner != 0 {
		t.Fatalf("container stat %+v, want ephemeralOwner 0 (as ZooKeeper reports it)", s)
	}
	if got := st.ZnodeContainerCandidates(10); len(got) != 0 {
		t.Fatalf("candidates %q with every container holding a child", got)
	}
	if r, _ := apply(t, st, zkTxn(0, false, zkDelete("/c/x", -1))); r.Err != nil {
		t.Fatal(r.Err)
	}
	apply(t, st, &fsmpb.Command{Op: &fsmpb.Command_CloseSession{CloseSession: &fsmpb.CloseSession{Session: sess}}})
	for _, p := range []string{"/c", "/d"} {
		_, _, s, ok := st.Znode(p)
		if !ok {
			t.Fatalf("the container %s went with its last child", p)
		}
		if s.NumChildren != 0 || s.Cversion != 2 {
			t.Fatalf("%s stat %+v, want no children and cversion 2 (one create, one delete)", p, s)
		}
	}
	if got := st.ZnodeContainerCandidates(10); len(got) != 2 || got[0] != "/c" || got[1] != "/d" {
		t.Fatalf("candidates %q, want [/c /d]", got)
	}
	if got := st.ZnodeContainerCandidates(1); len(got) != 1 {
		t.Fatalf("candidates with a bound of 1: %q", got)
	}
}

// TestZnodeContainerDelete: the leader's container delete removes an
// empty container that had a child, with no ACL check, and fails,
// changing nothing, on a container that has a child again, on one that
// never had one, and on a node that is not a container.
func TestZnodeContainerDelete(t *testing.T) {
	st := fsm.NewState()
	apply(t, st, zkTxn(0, false, zkCreate("/c", fsm.ZkContainer)))
	apply(t, st, zkTxn(0, false, zkCreate("/c/x", 0)))
	apply(t, st, zkTxn(0, false, zkDelete("/c/x", -1)))
	apply(t, st, zkTxn(0, false, zkCreate("/never", fsm.ZkContainer)))
	apply(t, st, zkTxn(0, false, zkCreate("/plain", fsm.ZkPersistent)))
	apply(t, st, zkTxn(0, false, zkCreate("/plain/x", 0)))
	apply(t, st, zkTxn(0, false, zkDelete("/plain/x", -1)))
	// A child came back between the check and the delete.
	apply(t, st, zkTxn(0, false, zkCreate("/c/y", 0)))
	rev := st.Revision()
	if r, _ := apply(t, st, zkDeleteContainer("/c")); zkCode(r.Err) != fsm.ZkNotEmpty || st.Revision() != rev {
		t.Fatalf("container delete of a container with a child: %v (revision %d, was %d)", r.Err, st.Revision(), rev)
	}
	for _, p := range []string{"/never", "/plain"} {
		if r, _ := apply(t, st, zkDeleteContainer(p)); r.Err == nil || st.Revision() != rev {
			t.Fatalf("container delete of %s: %v", p, r.Err)
		}
		if _, _, _, ok := st.Znode(p); !ok {
			t.Fatalf("%s removed", p)
		}
	}
	apply(t, st, zkTxn(0, false, zkDelete("/c/y", -1)))
	// Only the ACL of the parent would allow a delete: the container
	// delete does not check it.
	apply(t, st, zkTxn(0, false, &fsmpb.ZkOp{Op: &fsmpb.ZkOp_SetAcl{SetAcl: &fsmpb.ZkSetACL{Path: "/", Version: -1,
		Acl: []*fsmpb.ZnodeACL{{Perms: fsm.ZkPermRead, Scheme: "world", Id: "anyone"}}}}}))
	if r, _ := apply(t, st, zkDeleteContainer("/c")); r.Err != nil {
		t.Fatalf("container delete of an emptied container: %v", r.Err)
	}
	if _, _, _, ok := st.Znode("/c"); ok {
		t.Fatal("the emptied container stayed")
	}
	if got := st.ZnodeContainerCandidates(10); len(got) != 0 {
		t.Fatalf("candidates %q after the delete", got)
	}
}

// TestZnodeSnapshot: the tree and each session's ephemerals survive a
// snapshot; an ephemeral of a live session still goes with it.
func TestZnodeSnapshot(t *testing.T) {
	st := fsm.NewState()
	sess := st.Apply(cmdCreate("zk", 10_000), nil).Session
	apply(t, st, zkTxn(0, false, zkCreate("/p", 0)))
	apply(t, st, zkTxn(sess, false, zkCreate("/p/e", fsm.ZkEphemeral)))
	snap := st.Export()
	back, err := fsm.Import(snap)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(back.Export(), snap) {
		t.Fatal("the snapshot does not round-trip")
	}
	apply(t, back, &fsmpb.Command{Op: &fsmpb.Command_CloseSession{CloseSession: &fsmpb.CloseSession{Session: sess}}})
	if _, _, _, ok := back.Znode("/p/e"); ok {
		t.Fatal("an ephemeral restored from a snapshot outlived its session")
	}
}

// TestZnodeGate: below cluster version 3 a ZkTxn is refused and changes
// nothing; the snapshot writes no znodes.
func TestZnodeGate(t *testing.T) {
	st := fsm.NewStateAt(2)
	r, _ := apply(t, st, zkTxn(0, false, zkCreate("/a", 0)))
	if !errors.Is(r.Err, fsm.ErrVersion) || st.Revision() != 0 {
		t.Fatalf("at version 2: %v, revision %d", r.Err, st.Revision())
	}
	if err := fsm.CheckVersion(zkTxn(0, false, zkCreate("/a", 0)), 2); !errors.Is(err, fsm.ErrVersion) {
		t.Fatalf("proposal gate at version 2: %v", err)
	}
	if n := len(st.Export().GetZnodes()); n != 0 {
		t.Fatalf("a version-2 snapshot holds %d znodes", n)
	}
}

// TestZnodeMultiChildren: a multi that adds and removes children of one
// parent leaves exactly its net change, and a failed one none (a txn
// shares the parent's children with the state until it commits).
func TestZnodeMultiChildren(t *testing.T) {
	st := fsm.NewState()
	apply(t, st, zkTxn(0, false, zkCreate("/m", 0)))
	apply(t, st, zkTxn(0, false, zkCreate("/m/x", 0)))
	r, _ := apply(t, st, zkTxn(0, true, zkCreate("/m/a", 0), zkDelete("/m/a", -1), zkCreate("/m/b", 0), zkDelete("/m/x", -1), zkCreate("/m/x", 0),
		&fsmpb.ZkOp{Op: &fsmpb.ZkOp_SetData{SetData: &fsmpb.ZkSetData{Path: "/m", Data: []byte("v"), Version: -1}}}))
	if r.Err != nil || failedOps(r) {
		t.Fatalf("multi: %+v", r.Zk)
	}
	if got := r.Zk.Ops[5].Stat.NumChildren; got != 2 {
		t.Fatalf("setData's stat in the multi: %d children, want 2", got)
	}
	kids, _ := st.ZnodeChildren("/m")
	if len(kids) != 2 || kids[0] != "b" || kids[1] != "x" {
		t.Fatalf("children %v, want [b x]", kids)
	}
	r, _ = apply(t, st, zkTxn(0, true, zkDelete("/m/b", -1), zkCreate("/m/c", 0), zkDelete("/m", -1)))
	if !failedOps(r) {
		t.Fatalf("multi deleting a parent with children passed: %+v", r.Zk)
	}
	kids, _ = st.ZnodeChildren("/m")
	if _, _, s, _ := st.Znode("/m"); len(kids) != 2 || s.NumChildren != 2 || kids[0] != "b" {
		t.Fatalf("after a failed multi: children %v, stat %+v", kids, s)
	}
}

func failedOps(r fsm.Result) bool {
	for _, o := range r.Zk.Ops {
		if o.Code != fsm.ZkOK {
			return true
		}
	}
	return false
}

// TestZnodeNullData: data created or set null reads as nil (getData
// answers it null), empty data as empty, through a snapshot too.
func TestZnodeNullData(t *testing.T) {
	st := fsm.NewState()
	null := zkCreate("/null", 0)
	null.GetCreate().Data, null.GetCreate().DataNull = nil, true
	apply(t, st, zkTxn(0, false, null))
	empty := zkCreate("/empty", 0)
	empty.GetCreate().Data = nil
	apply(t, st, zkTxn(0, false, empty))
	apply(t, st, zkTxn(0, false, zkCreate("/set", 0)))
	apply(t, st, zkTxn(0, false, &fsmpb.ZkOp{Op: &fsmpb.ZkOp_SetData{SetData: &fsmpb.ZkSetData{Path: "/set", Version: -1, DataNull: true}}}))
	back, err := fsm.Import(st.Export())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*fsm.State{st, back} {
		for _, c := range []struct {
			path string
			null bool
		}{{"/null", true}, {"/empty", false}, {"/set", true}} {
			data, _, stat, _ := s.Znode(c.path)
			if (data == nil) != c.null || len(data) != 0 || stat.DataLength != 0 {
				t.Fatalf("%s: data %q (nil %v), dataLength %d; want null %v", c.path, data, data == nil, stat.DataLength, c.null)
			}
		}
	}
}

// TestZnodeACLBytesCount: a znode's ACL counts against MaxZnodeBytes as
// its path and data do (a client chooses its ids, up to a request's
// size: uncounted, a million znodes could each hold a megabyte of ACL),
// through setACL, delete and a snapshot alike.
func TestZnodeACLBytesCount(t *testing.T) {
	st := fsm.NewState()
	base := st.ZnodeBytes()
	id := strings.Repeat("u", 10_000) + ":x"
	cr := zkCreate("/a", fsm.ZkPersistent)
	cr.GetCreate().Acl = []*fsmpb.ZnodeACL{{Perms: fsm.ZkPermAll, Scheme: "digest", Id: id}}
	if r, _ := apply(t, st, zkTxn(0, false, cr)); r.Err != nil {
		t.Fatal(r.Err)
	}
	want := base + uint64(len("/a")+len("d")+len("digest")+len(id))
	if got := st.ZnodeBytes(); got != want {
		t.Fatalf("after create: %d bytes counted, want %d", got, want)
	}
	back, err := fsm.Import(st.Export())
	if err != nil {
		t.Fatal(err)
	}
	if back.ZnodeBytes() != want {
		t.Fatalf("restored from a snapshot: %d bytes counted, want %d", back.ZnodeBytes(), want)
	}
	set := &fsmpb.ZkOp{Op: &fsmpb.ZkOp_SetAcl{SetAcl: &fsmpb.ZkSetACL{Path: "/a", Version: -1,
		Acl: []*fsmpb.ZnodeACL{{Perms: fsm.ZkPermAll, Scheme: "world", Id: "anyone"}}}}}
	ids := []*fsmpb.ZnodeACL{{Scheme: "digest", Id: id}}
	cmd := zkTxn(0, false, set)
	cmd.GetZkTxn().Ids = ids
	if r, _ := apply(t, st, cmd); r.Err != nil {
		t.Fatal(r.Err)
	}
	if got, want := st.ZnodeBytes(), base+uint64(len("/a")+len("d")+len("world")+len("anyone")); got != want {
		t.Fatalf("after setACL: %d bytes counted, want %d", got, want)
	}
	if r, _ := apply(t, st, zkTxn(0, false, zkDelete("/a", -1))); r.Err != nil {
		t.Fatal(r.Err)
	}
	if got := st.ZnodeBytes(); got != base {
		t.Fatalf("after delete: %d bytes counted, want %d", got, base)
	}
}
