package fsm_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// walkCounts counts every znode's descendants by walking the tree from
// the root, as ZooKeeper's getAllChildrenNumber scans its node map: the
// reference the kept counts are checked against.
func walkCounts(t *testing.T, st *fsm.State) map[string]int {
	t.Helper()
	out := make(map[string]int)
	var walk func(p string) int
	walk = func(p string) int {
		kids, ok := st.ZnodeChildren(p)
		if !ok {
			t.Fatalf("%s is listed as a child but does not exist", p)
		}
		n := 0
		for _, k := range kids {
			c := "/" + k
			if p != "/" {
				c = p + c
			}
			n += 1 + walk(c)
		}
		out[p] = n
		return n
	}
	walk("/")
	return out
}

// checkCounts fails unless every znode's kept count of descendants is
// what a walk counts, and the root's is every znode but itself.
func checkCounts(t *testing.T, st *fsm.State, when string) map[string]int {
	t.Helper()
	want := walkCounts(t, st)
	for p, w := range want {
		if got, ok := st.ZnodeDescendants(p); !ok || got != w {
			t.Fatalf("%s: getAllChildrenNumber(%s) = %d (%v), a walk counts %d", when, p, got, ok, w)
		}
	}
	if root, _ := st.ZnodeDescendants("/"); root != st.ZnodeCount()-1 {
		t.Fatalf("%s: the root counts %d descendants of %d znodes", when, root, st.ZnodeCount())
	}
	if _, ok := st.ZnodeDescendants("/no/such"); ok {
		t.Fatalf("%s: a missing znode has a count", when)
	}
	return want
}

// TestZnodeDescendantsKept: the count of descendants after creates,
// deletes, multis (a node deleted and created again, with children, in
// one multi; a failed multi), ephemerals removed with their session, and
// the leader's removals of containers and TTL nodes. A new tree's root
// counts /zookeeper and its two children, as ZooKeeper 3.8's
// DataTree.getAllChildrenNumber counts them (nodes.size() - 2).
func TestZnodeDescendantsKept(t *testing.T) {
	st := fsm.NewState()
	if n, _ := st.ZnodeDescendants("/"); n != 3 {
		t.Fatalf("a new tree's root counts %d, want 3 (/zookeeper, /zookeeper/quota, /zookeeper/config)", n)
	}
	if n, _ := st.ZnodeDescendants("/zookeeper"); n != 2 {
		t.Fatalf("/zookeeper counts %d, want 2", n)
	}
	sess := st.Apply(cmdCreate("zk", 10_000), nil).Session
	for _, p := range []string{"/a", "/a/b", "/a/b/c", "/a/b/d", "/x"} {
		apply(t, st, zkTxn(0, false, zkCreate(p, 0)))
	}
	apply(t, st, zkTxn(sess, false, zkCreate("/a/b/c/e", fsm.ZkEphemeral)))
	apply(t, st, zkTxn(sess, false, zkCreate("/x/s-", fsm.ZkEphemeralSequential)))
	counts := map[string]int{"/": 10, "/a": 4, "/a/b": 3, "/a/b/c": 1, "/x": 1, "/a/b/d": 0}
	for p, w := range counts {
		if n, _ := st.ZnodeDescendants(p); n != w {
			t.Fatalf("%s counts %d, want %d", p, n, w)
		}
	}
	checkCounts(t, st, "after creates")

	// One multi: the leaf /a/b/d deleted and created again with a child;
	// /y created with a child that is deleted again.
	r, _ := apply(t, st, zkTxn(0, true, zkDelete("/a/b/d", -1), zkCreate("/a/b/d", 0), zkCreate("/a/b/d/f", 0),
		zkCreate("/y", 0), zkCreate("/y/z", 0), zkDelete("/y/z", -1)))
	if r.Err != nil || failedOps(r) {
		t.Fatalf("multi: %+v %v", r.Zk, r.Err)
	}
	checkCounts(t, st, "after a multi")
	if n, _ := st.ZnodeDescendants("/a/b"); n != 4 {
		t.Fatalf("/a/b counts %d after the multi, want 4", n)
	}
	// A multi that deletes a subtree bottom up and creates it again.
	r, _ = apply(t, st, zkTxn(0, true, zkDelete("/a/b/d/f", -1), zkDelete("/a/b/d", -1), zkCreate("/a/b/d", 0), zkCreate("/a/b/d/g", 0),
		zkCreate("/a/b/d/g/h", 0)))
	if r.Err != nil || failedOps(r) {
		t.Fatalf("multi re-creating /a/b/d: %+v %v", r.Zk, r.Err)
	}
	if n, _ := st.ZnodeDescendants("/a/b/d"); n != 2 {
		t.Fatalf("/a/b/d counts %d, want 2", n)
	}
	checkCounts(t, st, "after a multi re-creating a subtree")
	// The same subtree again, node for node: a node and its parent
	// replaced in one multi.
	r, _ = apply(t, st, zkTxn(0, true, zkDelete("/a/b/d/g/h", -1), zkDelete("/a/b/d/g", -1), zkCreate("/a/b/d/g", 0), zkCreate("/a/b/d/g/h", 0)))
	if r.Err != nil || failedOps(r) {
		t.Fatalf("multi re-creating /a/b/d/g: %+v %v", r.Zk, r.Err)
	}
	if n, _ := st.ZnodeDescendants("/a/b/d/g"); n != 1 {
		t.Fatalf("/a/b/d/g counts %d after it and its child were created again, want 1", n)
	}
	checkCounts(t, st, "after a multi re-creating a node and its child")
	// A failed multi changes no count.
	before := checkCounts(t, st, "before a failed multi")
	r, _ = apply(t, st, zkTxn(0, true, zkCreate("/a/q", 0), zkDelete("/a/b/d/g/h", -1), zkDelete("/a", -1)))
	if !failedOps(r) {
		t.Fatalf("a multi deleting a parent with children passed: %+v", r.Zk)
	}
	for p, w := range before {
		if n, _ := st.ZnodeDescendants(p); n != w {
			t.Fatalf("a failed multi changed %s's count: %d, was %d", p, n, w)
		}
	}

	// The session's ephemerals go with it.
	apply(t, st, cmdClose(sess))
	if n, _ := st.ZnodeDescendants("/a/b/c"); n != 0 {
		t.Fatalf("/a/b/c counts %d after its ephemeral child's session closed", n)
	}
	checkCounts(t, st, "after the session closed")

	// The leader's container and TTL removals.
	apply(t, st, zkTxnAt(1000, zkCreate("/box", fsm.ZkContainer)))
	apply(t, st, zkTxnAt(1000, zkCreate("/box/in", 0)))
	apply(t, st, zkTxnAt(1000, zkDelete("/box/in", -1)))
	apply(t, st, zkTxnAt(1000, zkCreateTTL("/a/ttl", fsm.ZkPersistentWithTTL, 10)))
	checkCounts(t, st, "with a container and a TTL node")
	if r, _ := apply(t, st, zkDeleteContainer("/box")); r.Err != nil {
		t.Fatalf("container removal: %v", r.Err)
	}
	c := st.ZnodeTTLCandidates(5000, 10)
	if len(c) != 1 {
		t.Fatalf("TTL candidates %+v", c)
	}
	if r, _ := apply(t, st, zkRemoveTTL(5000, c[0])); r.Err != nil {
		t.Fatalf("TTL removal: %v", r.Err)
	}
	if n, _ := st.ZnodeDescendants("/a"); n != 5 {
		t.Fatalf("/a counts %d after its TTL child's removal, want 5", n)
	}
	checkCounts(t, st, "after the container and TTL removals")
}

// TestZnodeDescendantsRandom: a random sequence of creates (every mode),
// deletes, multis (some failing), sessions ending and the leader's
// removals; after each command every znode's kept count is what a walk
// of the tree counts, and a state restored from a snapshot taken midway
// that applies the rest of the log counts what the original counts.
func TestZnodeDescendantsRandom(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { randomCounts(t, seed) })
	}
}

func randomCounts(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 30))
	st := fsm.NewState()
	var log []*fsmpb.Command
	do := func(cmd *fsmpb.Command) fsm.Result {
		log = append(log, cmd)
		r, _ := apply(t, st, cmd)
		return r
	}
	paths := []string{"/"} // what may exist; some are gone
	var sessions []uint64
	pick := func() string { return paths[rng.IntN(len(paths))] }
	child := func(p string) string {
		name := fmt.Sprintf("n%d", rng.IntN(6))
		if p == "/" {
			return "/" + name
		}
		return p + "/" + name
	}
	createOp := func() (*fsmpb.ZkOp, uint64) {
		p := child(pick())
		var sess uint64
		flags := int32(rng.IntN(7))
		switch flags {
		case fsm.ZkEphemeral, fsm.ZkEphemeralSequential:
			if len(sessions) == 0 {
				flags = fsm.ZkPersistent
			} else {
				sess = sessions[rng.IntN(len(sessions))]
			}
		case fsm.ZkPersistentWithTTL, fsm.ZkPersistentSequentialWithTTL:
			return zkCreateTTL(p, flags, 1+rng.Int64N(50)), 0
		}
		return zkCreate(p, flags), sess
	}
	const steps = 600
	snapAt := steps / 2
	var restored *fsm.State
	var tail int
	for i := range steps {
		if i == snapAt {
			back, err := fsm.Import(st.Export())
			if err != nil {
				t.Fatal(err)
			}
			restored, tail = back, len(log)
			checkCounts(t, restored, "restored from a snapshot")
		}
		switch k := rng.IntN(20); {
		case k < 10:
			op, sess := createOp()
			r := do(zkTxn(sess, false, op))
			if r.Err == nil {
				paths = append(paths, r.Zk.Ops[0].Path)
			}
		case k < 12:
			do(zkTxn(0, false, zkDelete(pick(), -1)))
		case k < 16:
			var ops []*fsmpb.ZkOp
			var sess uint64
			for range 1 + rng.IntN(6) {
				if rng.IntN(3) > 0 {
					op, s := createOp()
					if s != 0 {
						sess = s
					}
					ops = append(ops, op)
				} else {
					ops = append(ops, zkDelete(pick(), -1))
				}
			}
			r := do(zkTxn(sess, true, ops...))
			for _, o := range r.Zk.Ops {
				if o.Path != "" {
					paths = append(paths, o.Path)
				}
			}
		case k < 17:
			sessions = append(sessions, do(cmdCreate("zk", 10_000)).Session)
		case k < 18:
			if len(sessions) > 0 {
				j := rng.IntN(len(sessions))
				if rng.IntN(2) == 0 {
					do(cmdClose(sessions[j]))
				} else {
					do(cmdExpire(sessions[j]))
				}
				sessions = append(sessions[:j], sessions[j+1:]...)
			}
		default:
			for _, c := range st.ZnodeContainerCandidates(5) {
				do(zkDeleteContainer(c))
			}
			now := int64(1000 + rng.IntN(100))
			for _, c := range st.ZnodeTTLCandidates(now, 5) {
				do(zkRemoveTTL(now, c))
			}
		}
		checkCounts(t, st, fmt.Sprintf("step %d", i))
	}
	for _, cmd := range log[tail:] {
		apply(t, restored, cmd)
	}
	want := checkCounts(t, st, "the end")
	got := checkCounts(t, restored, "the restored state at the end")
	if len(got) != len(want) {
		t.Fatalf("the restored state has %d znodes, the original %d", len(got), len(want))
	}
	for p, w := range want {
		if got[p] != w {
			t.Fatalf("%s: the restored state counts %d, the original %d", p, got[p], w)
		}
	}
	back, err := fsm.Import(st.Export())
	if err != nil {
		t.Fatal(err)
	}
	checkCounts(t, back, "restored at the end")
	t.Logf("%d commands, %d znodes left", len(log), st.ZnodeCount())
	if n := st.ZnodeCount(); n < 20 {
		t.Fatalf("the sequence left %d znodes: too few to test much", n)
	}
}

// BenchmarkZnodeDescendants is getAllChildrenNumber of the root and of
// a subtree on a tree of 100,000 znodes (100 parents of 1,000 children).
func BenchmarkZnodeDescendants(b *testing.B) {
	st := fsm.NewState()
	for i := range 100 {
		p := fmt.Sprintf("/p%03d", i)
		st.Apply(zkTxn(0, false, zkCreate(p, 0)), nil)
		var ops []*fsmpb.ZkOp
		for j := range 999 {
			ops = append(ops, zkCreate(fmt.Sprintf("%s/c%04d", p, j), 0))
		}
		if r := st.Apply(zkTxn(0, true, ops...), nil); r.Err != nil {
			b.Fatal(r.Err)
		}
	}
	if n, _ := st.ZnodeDescendants("/"); n != 100_000+3 {
		b.Fatalf("the root counts %d", n)
	}
	b.Run("root", func(b *testing.B) {
		for b.Loop() {
			st.ZnodeDescendants("/")
		}
	})
	b.Run("subtree", func(b *testing.B) {
		for b.Loop() {
			st.ZnodeDescendants("/p050")
		}
	})
}

// BenchmarkZnodeEphemerals is getEphemerals of one parent's 1,000
// ephemerals, of a session that has 100,000 (100 parents of 1,000).
func BenchmarkZnodeEphemerals(b *testing.B) {
	st := fsm.NewState()
	sess := st.Apply(cmdCreate("zk", 10_000), nil).Session
	for i := range 100 {
		p := fmt.Sprintf("/p%03d", i)
		st.Apply(zkTxn(0, false, zkCreate(p, 0)), nil)
		var ops []*fsmpb.ZkOp
		for j := range 1000 {
			ops = append(ops, zkCreate(fmt.Sprintf("%s/e%04d", p, j), fsm.ZkEphemeral))
		}
		if r := st.Apply(zkTxn(sess, true, ops...), nil); r.Err != nil {
			b.Fatal(r.Err)
		}
	}
	if n := len(st.ZnodeEphemerals(sess, "/p050/")); n != 1000 {
		b.Fatalf("%d ephemerals under /p050/", n)
	}
	for b.Loop() {
		st.ZnodeEphemerals(sess, "/p050/")
	}
}

// BenchmarkZnodeChildren is getChildren of a parent of 100,000 children,
// asked again with no change in between.
func BenchmarkZnodeChildren(b *testing.B) {
	st := fsm.NewState()
	st.Apply(zkTxn(0, false, zkCreate("/p", 0)), nil)
	for i := range 100 {
		var ops []*fsmpb.ZkOp
		for j := range 1000 {
			ops = append(ops, zkCreate(fmt.Sprintf("/p/c%06d", i*1000+j), 0))
		}
		if r := st.Apply(zkTxn(0, true, ops...), nil); r.Err != nil {
			b.Fatal(r.Err)
		}
	}
	for b.Loop() {
		st.ZnodeChildren("/p")
	}
}
