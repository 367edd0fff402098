package fsm_test

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// zkTxnAt is a ZkTxn proposed at timeMs (the proposer's clock).
func zkTxnAt(timeMs int64, ops ...*fsmpb.ZkOp) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_ZkTxn{ZkTxn: &fsmpb.ZkTxn{TimeMs: timeMs, Ops: ops}}}
}

func zkCreateTTL(path string, flags int32, ttl int64) *fsmpb.ZkOp {
	op := zkCreate(path, flags)
	op.GetCreate().TtlMs = ttl
	return op
}

// zkRemoveTTL is the leader's removal of an expired TTL node, at nowMs,
// of the node as the check read it.
func zkRemoveTTL(nowMs int64, c fsm.ZnodeTTLCandidate) *fsmpb.Command {
	return zkTxnAt(nowMs, &fsmpb.ZkOp{Op: &fsmpb.ZkOp_Delete{Delete: &fsmpb.ZkDelete{Path: c.Path, Version: -1,
		Ttl: true, SeenMzxid: c.Mzxid, SeenCversion: c.Cversion}}})
}

// TestZnodeTTLCreate: a TTL mode needs a TTL of 1 ms to 2^40 - 1 ms and
// only a TTL mode takes one (BadArguments otherwise, changing nothing);
// a TTL node is persistent (it may have children, ephemeral ones too),
// sequential with mode 6, and reports ephemeralOwner 0, as ZooKeeper
// reports it.
func TestZnodeTTLCreate(t *testing.T) {
	st := fsm.NewState()
	sess := st.Apply(cmdCreate("zk", 10_000), nil).Session
	bad := []*fsmpb.ZkOp{
		zkCreateTTL("/t", fsm.ZkPersistentWithTTL, 0),
		zkCreateTTL("/t", fsm.ZkPersistentWithTTL, -1),
		zkCreateTTL("/t", fsm.ZkPersistentWithTTL, fsm.MaxZnodeTTL+1),
		zkCreateTTL("/t", fsm.ZkPersistentSequentialWithTTL, 0),
		zkCreateTTL("/t", fsm.ZkPersistent, 1000),
		zkCreateTTL("/t", fsm.ZkEphemeral, 1000),
		zkCreateTTL("/t", fsm.ZkContainer, 1000),
		zkCreateTTL("/t", 7, 1000),
		// The TTL is checked before the parent, as ZooKeeper checks it.
		zkCreateTTL("/missing/t", fsm.ZkPersistentWithTTL, 0),
	}
	for _, op := range bad {
		rev := st.Revision()
		if r, evs := apply(t, st, zkTxn(sess, false, op)); zkCode(r.Err) != fsm.ZkBadArguments || st.Revision() != rev || len(evs) != 0 {
			t.Fatalf("%v: %v, want BadArguments and nothing changed", op, r.Err)
		}
	}
	r, _ := apply(t, st, zkTxn(sess, false, zkCreateTTL("/t", fsm.ZkPersistentWithTTL, fsm.MaxZnodeTTL)))
	if r.Err != nil || r.Zk.Ops[0].Path != "/t" || r.Zk.Ops[0].Stat.EphemeralOwner != 0 {
		t.Fatalf("create a TTL node: %+v %v", r.Zk, r.Err)
	}
	if _, _, s, _ := st.Znode("/t"); s.EphemeralOwner != 0 || s.Czxid != r.Revision {
		t.Fatalf("TTL node stat %+v, want ephemeralOwner 0", s)
	}
	for i, want := range []string{"/t/s-0000000000", "/t/s-0000000001"} {
		r, _ := apply(t, st, zkTxn(sess, false, zkCreateTTL("/t/s-", fsm.ZkPersistentSequentialWithTTL, 500)))
		if r.Err != nil || r.Zk.Ops[0].Path != want {
			t.Fatalf("sequential TTL node %d: %+v %v, want %s", i, r.Zk, r.Err, want)
		}
	}
	if r, _ := apply(t, st, zkTxn(sess, false, zkCreate("/t/e", fsm.ZkEphemeral))); r.Err != nil {
		t.Fatalf("an ephemeral under a TTL node: %v", r.Err)
	}
	// In a multi, a bad TTL is the failing op's code.
	r, _ = apply(t, st, zkTxn(sess, true, zkCreate("/m", 0), zkCreateTTL("/m/t", fsm.ZkPersistentWithTTL, 0), zkCreate("/n", 0)))
	if r.Err != nil || r.Zk.Ops[0].Code != fsm.ZkOK || r.Zk.Ops[1].Code != fsm.ZkBadArguments || r.Zk.Ops[2].Code != fsm.ZkRuntimeInconsistency {
		t.Fatalf("multi with a bad TTL: %+v %v", r.Zk, r.Err)
	}
}

// TestZnodeTTLRemoval: the check lists a TTL node with no children
// whose mtime is more than its TTL before now; the removal goes only if
// the node is still as read (not set, not given a child since), still
// childless and still expired at the command's time, otherwise nothing
// changes; a node that is not a TTL node is never removed this way.
func TestZnodeTTLRemoval(t *testing.T) {
	st := fsm.NewState()
	apply(t, st, zkTxnAt(1000, zkCreateTTL("/t", fsm.ZkPersistentWithTTL, 100)))
	apply(t, st, zkTxnAt(1000, zkCreateTTL("/u", fsm.ZkPersistentWithTTL, 100)))
	apply(t, st, zkTxnAt(1000, zkCreate("/plain", 0)))
	apply(t, st, zkTxnAt(1000, zkCreateTTL("/kids", fsm.ZkPersistentWithTTL, 100)))
	apply(t, st, zkTxnAt(1000, zkCreate("/kids/k", 0)))
	if got := st.ZnodeTTLCandidates(1100, 10); len(got) != 0 {
		t.Fatalf("candidates at exactly the TTL: %+v", got)
	}
	got := st.ZnodeTTLCandidates(1101, 10)
	if len(got) != 2 || got[0].Path != "/t" || got[1].Path != "/u" {
		t.Fatalf("candidates %+v, want /t and /u (not /plain, not /kids, which has a child)", got)
	}
	if one := st.ZnodeTTLCandidates(1101, 1); len(one) != 1 {
		t.Fatalf("candidates with a bound of 1: %+v", one)
	}
	seenT, seenU := got[0], got[1]

	// /t is set between the check and the removal: it stays.
	apply(t, st, zkTxnAt(1050, &fsmpb.ZkOp{Op: &fsmpb.ZkOp_SetData{SetData: &fsmpb.ZkSetData{Path: "/t", Data: []byte("v"), Version: -1}}}))
	rev := st.Revision()
	if r, evs := apply(t, st, zkRemoveTTL(5000, seenT)); zkCode(r.Err) != fsm.ZkBadVersion || st.Revision() != rev || len(evs) != 0 {
		t.Fatalf("removal of a node set since the check: %v", r.Err)
	}
	// /u is given a child, which is deleted again, in between: it stays.
	apply(t, st, zkTxnAt(1000, zkCreate("/u/c", 0)))
	if r, _ := apply(t, st, zkRemoveTTL(5000, seenU)); zkCode(r.Err) != fsm.ZkNotEmpty {
		t.Fatalf("removal of a node with a child: %v, want NotEmpty", r.Err)
	}
	apply(t, st, zkTxnAt(1000, zkDelete("/u/c", -1)))
	rev = st.Revision()
	if r, _ := apply(t, st, zkRemoveTTL(5000, seenU)); zkCode(r.Err) != fsm.ZkBadVersion || st.Revision() != rev {
		t.Fatalf("removal of a node given a child since the check: %v", r.Err)
	}
	for _, p := range []string{"/t", "/u"} {
		if _, _, _, ok := st.Znode(p); !ok {
			t.Fatalf("%s removed though it changed since the check", p)
		}
	}

	// Read again: /u (mtime 1000) is expired, /t (set at 1050) is not;
	// the command's time decides.
	now := st.ZnodeTTLCandidates(1101, 10)
	if len(now) != 1 || now[0].Path != "/u" {
		t.Fatalf("candidates %+v, want /u alone", now)
	}
	if r, _ := apply(t, st, zkRemoveTTL(1100, now[0])); zkCode(r.Err) != fsm.ZkBadVersion {
		t.Fatalf("removal at a time the node has not expired: %v", r.Err)
	}
	// Neither a plain node nor one that is gone is removed.
	if r, _ := apply(t, st, zkRemoveTTL(5000, fsm.ZnodeTTLCandidate{Path: "/plain", Mzxid: 3})); zkCode(r.Err) != fsm.ZkBadVersion {
		t.Fatalf("TTL removal of a plain node: %v", r.Err)
	}
	if r, _ := apply(t, st, zkRemoveTTL(5000, fsm.ZnodeTTLCandidate{Path: "/gone"})); zkCode(r.Err) != fsm.ZkNoNode {
		t.Fatalf("TTL removal of a missing node: %v", r.Err)
	}
	// The parent's ACL would refuse a delete: the removal checks none.
	apply(t, st, zkTxn(0, false, &fsmpb.ZkOp{Op: &fsmpb.ZkOp_SetAcl{SetAcl: &fsmpb.ZkSetACL{Path: "/", Version: -1,
		Acl: []*fsmpb.ZnodeACL{{Perms: fsm.ZkPermRead, Scheme: "world", Id: "anyone"}}}}}))
	r, evs := apply(t, st, zkRemoveTTL(1101, now[0]))
	if r.Err != nil {
		t.Fatalf("removal of an expired TTL node: %v", r.Err)
	}
	if _, _, _, ok := st.Znode("/u"); ok {
		t.Fatal("the expired TTL node stayed")
	}
	var deleted, changed bool
	for _, e := range evs {
		deleted = deleted || (e.ZnodeType == fsm.ZnodeDeleted && e.Name == "/u")
		changed = changed || (e.ZnodeType == fsm.ZnodeChildrenChanged && e.Name == "/")
	}
	if !deleted || !changed {
		t.Fatalf("events %+v, want NodeDeleted /u and NodeChildrenChanged /", evs)
	}
	if got := st.ZnodeTTLCandidates(1_000_000, 10); len(got) != 1 || got[0].Path != "/t" {
		t.Fatalf("candidates after the removal: %+v, want /t", got)
	}
}

// TestZnodeTTLSnapshot: a TTL node's TTL survives a snapshot (the
// restored state lists it as the original does), and a snapshot giving a
// TTL to an ephemeral, a container or an out-of-range value is refused.
func TestZnodeTTLSnapshot(t *testing.T) {
	st := fsm.NewState()
	apply(t, st, zkTxnAt(1000, zkCreateTTL("/t", fsm.ZkPersistentWithTTL, 100)))
	apply(t, st, zkTxnAt(1000, zkCreateTTL("/s-", fsm.ZkPersistentSequentialWithTTL, 5000)))
	snap := st.Export()
	back, err := fsm.Import(snap)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(back.Export(), snap) {
		t.Fatal("the snapshot does not round-trip")
	}
	for _, s := range []*fsm.State{st, back} {
		if got := s.ZnodeTTLCandidates(1101, 10); len(got) != 1 || got[0].Path != "/t" {
			t.Fatalf("candidates %+v, want /t", got)
		}
		if got := s.ZnodeTTLCandidates(6001, 10); len(got) != 2 {
			t.Fatalf("candidates %+v, want both", got)
		}
	}
	if r, _ := apply(t, back, zkRemoveTTL(1101, back.ZnodeTTLCandidates(1101, 1)[0])); r.Err != nil {
		t.Fatalf("removal in the restored state: %v", r.Err)
	}
	for _, mod := range []func(*fsmpb.ZnodeState){
		func(z *fsmpb.ZnodeState) { z.TtlMs = -1 },
		func(z *fsmpb.ZnodeState) { z.TtlMs = fsm.MaxZnodeTTL + 1 },
		func(z *fsmpb.ZnodeState) { z.Container = true },
	} {
		bad := proto.Clone(snap).(*fsmpb.Snapshot)
		for _, z := range bad.GetZnodes() {
			if z.GetPath() == "/t" {
				mod(z)
			}
		}
		if _, err := fsm.Import(bad); err == nil {
			t.Fatal("a snapshot with a bad TTL node was imported")
		}
	}
}

// TestZnodeTTLGate: below cluster version 3 a TTL create and a TTL
// removal are refused by the proposal gate and by Apply, changing
// nothing.
func TestZnodeTTLGate(t *testing.T) {
	for _, cmd := range []*fsmpb.Command{
		zkTxnAt(1000, zkCreateTTL("/t", fsm.ZkPersistentWithTTL, 100)),
		zkRemoveTTL(1000, fsm.ZnodeTTLCandidate{Path: "/t", Mzxid: 1}),
	} {
		if err := fsm.CheckVersion(cmd, 2); !errors.Is(err, fsm.ErrVersion) {
			t.Fatalf("proposal gate at version 2: %v", err)
		}
		st := fsm.NewStateAt(2)
		if r, _ := apply(t, st, cmd); !errors.Is(r.Err, fsm.ErrVersion) || st.Revision() != 0 {
			t.Fatalf("at version 2: %v, revision %d", r.Err, st.Revision())
		}
	}
}
