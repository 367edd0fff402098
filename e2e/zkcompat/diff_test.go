package zkcompat

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// The differential test: one sequence of requests, sent on the wire by
// two sessions, against ZooKeeper 3.8 and against Tenure; the transcripts
// (every reply's error code and body, every watch event, in order) must be
// equal once zxids and session ids are replaced by what is the same on
// both: a zxid by the order in which its value first appears in the
// transcript (so "created and modified by the same change" and "changed
// later" survive, the numbers do not), a session id by which of the test's
// sessions it is.

// transcript renders the answers of one run.
type transcript struct {
	zxids    map[int64]string
	sessions map[int64]string
	lines    []string
}

func (tr *transcript) zxid(v int64) string {
	if v == 0 {
		return "0"
	}
	if s, ok := tr.zxids[v]; ok {
		return s
	}
	s := fmt.Sprintf("z%d", len(tr.zxids)+1)
	tr.zxids[v] = s
	return s
}

func (tr *transcript) session(v int64) string {
	if v == 0 {
		return "-"
	}
	if s, ok := tr.sessions[v]; ok {
		return s
	}
	return fmt.Sprintf("not-a-session(%#x)", uint64(v))
}

func (tr *transcript) stat(s stat) string {
	return fmt.Sprintf("{czxid=%s mzxid=%s pzxid=%s version=%d cversion=%d aversion=%d owner=%s dataLength=%d numChildren=%d}",
		tr.zxid(s.Czxid), tr.zxid(s.Mzxid), tr.zxid(s.Pzxid), s.Version, s.Cversion, s.Aversion,
		tr.session(s.EphemeralOwner), s.DataLength, s.NumChildren)
}

// step is one request of the sequence: sent on session conn, its
// successful reply's body rendered by body.
type step struct {
	conn  int
	label string
	op    int32
	req   enc
	body  func(tr *transcript, d *dec) string
}

func noBody(*transcript, *dec) string { return "" }

func pathBody(_ *transcript, d *dec) string { return d.str() }

func statBody(tr *transcript, d *dec) string { return tr.stat(d.stat()) }

func dataStatBody(tr *transcript, d *dec) string {
	data := d.buf()
	return fmt.Sprintf("%q %s", data, tr.stat(d.stat()))
}

// sortedStrs renders a list of names sorted (ZooKeeper does not order
// children).
func sortedStrs(d *dec) string {
	ss := d.strs()
	sort.Strings(ss)
	return fmt.Sprintf("%q", ss)
}

func createStep(conn int, path, data string, flags int32) step {
	return step{conn, fmt.Sprintf("create %s %q flags=%d", path, data, flags), opCreate,
		enc{}.str(path).buf([]byte(data)).acls(openACL).i32(flags), pathBody}
}

func create2Step(conn int, op int32, path, data string, flags int32) step {
	return step{conn, fmt.Sprintf("create2(op %d) %s %q flags=%d", op, path, data, flags), op,
		enc{}.str(path).buf([]byte(data)).acls(openACL).i32(flags),
		func(tr *transcript, d *dec) string { return d.str() + " " + tr.stat(d.stat()) }}
}

func deleteStep(conn int, path string, version int32) step {
	return step{conn, fmt.Sprintf("delete %s version=%d", path, version), opDelete, enc{}.str(path).i32(version), noBody}
}

func setStep(conn int, path, data string, version int32) step {
	return step{conn, fmt.Sprintf("setData %s %q version=%d", path, data, version), opSetData,
		enc{}.str(path).buf([]byte(data)).i32(version), statBody}
}

func existsStep(conn int, path string, watch bool) step {
	return step{conn, fmt.Sprintf("exists %s watch=%v", path, watch), opExists, enc{}.str(path).boolean(watch), statBody}
}

func getStep(conn int, path string, watch bool) step {
	return step{conn, fmt.Sprintf("getData %s watch=%v", path, watch), opGetData, enc{}.str(path).boolean(watch), dataStatBody}
}

func childrenStep(conn int, path string, watch bool) step {
	return step{conn, fmt.Sprintf("getChildren %s watch=%v", path, watch), opGetChildren, enc{}.str(path).boolean(watch),
		func(_ *transcript, d *dec) string { return sortedStrs(d) }}
}

func children2Step(conn int, path string, watch bool) step {
	return step{conn, fmt.Sprintf("getChildren2 %s watch=%v", path, watch), opGetChildren2, enc{}.str(path).boolean(watch),
		func(tr *transcript, d *dec) string { s := sortedStrs(d); return s + " " + tr.stat(d.stat()) }}
}

// multiOp is one operation of a multi: its op code and record.
type multiOp struct {
	op  int32
	rec enc
}

func mCreate(path, data string, flags int32) multiOp {
	return multiOp{opCreate, enc{}.str(path).buf([]byte(data)).acls(openACL).i32(flags)}
}
func mCreate2(path, data string, flags int32) multiOp {
	return multiOp{opCreate2, enc{}.str(path).buf([]byte(data)).acls(openACL).i32(flags)}
}
func mDelete(path string, version int32) multiOp {
	return multiOp{opDelete, enc{}.str(path).i32(version)}
}
func mSet(path, data string, version int32) multiOp {
	return multiOp{opSetData, enc{}.str(path).buf([]byte(data)).i32(version)}
}
func mCheck(path string, version int32) multiOp {
	return multiOp{opCheck, enc{}.str(path).i32(version)}
}

func multiStep(conn int, label string, ops ...multiOp) step {
	req := enc{}
	for _, o := range ops {
		req = append(req.i32(o.op).boolean(false).i32(-1), o.rec...)
	}
	req = req.i32(-1).boolean(true).i32(-1)
	return step{conn, "multi " + label, opMulti, req, func(tr *transcript, d *dec) string {
		var out []string
		for i := 0; i < 64 && d.err == nil; i++ {
			typ, done, herr := d.i32(), d.boolean(), d.i32()
			if done {
				break
			}
			switch typ {
			case opCreate:
				out = append(out, "create:"+d.str())
			case opCreate2:
				out = append(out, "create2:"+d.str()+" "+tr.stat(d.stat()))
			case opDelete:
				out = append(out, "delete")
			case opSetData:
				out = append(out, "setData:"+tr.stat(d.stat()))
			case opCheck:
				out = append(out, "check")
			case opError:
				out = append(out, "error:"+errName(d.i32()))
			default:
				out = append(out, fmt.Sprintf("type(%d) err=%d", typ, herr))
			}
		}
		return "[" + strings.Join(out, ", ") + "]"
	}}
}

// The sequences, one test each, under a root of the test's own: session
// 0 acts and watches, session 1 owns ephemerals and fires the watches.

// seqPaths: creation, and the paths a server refuses or cannot find.
func seqPaths(r string) []step {
	return []step{
		createStep(0, r, "root", flagPersistent),
		createStep(0, r, "again", flagPersistent),
		createStep(0, r+"/missing/child", "", flagPersistent),
		createStep(0, r+"/", "", flagPersistent),
		createStep(0, r+"//x", "", flagPersistent),
		createStep(0, r+"/./x", "", flagPersistent),
		createStep(0, r+"/x/..", "", flagPersistent),
		createStep(0, r+"/ok", "", flagPersistent),
		getStep(0, r+"/ok/", false),
		childrenStep(0, r+"/nope", false),
	}
}

// seqVersions: reads, and setData and delete with version checks.
func seqVersions(r string) []step {
	return []step{
		createStep(0, r, "root", flagPersistent),
		createStep(0, r+"/a", "", flagPersistent),
		getStep(0, r, false),
		getStep(0, r+"/a", false),
		getStep(0, r+"/nope", false),
		existsStep(0, r+"/a", false),
		existsStep(0, r+"/nope", false),
		setStep(0, r+"/a", "one", 0),
		setStep(0, r+"/a", "two", 0),
		setStep(0, r+"/a", "three", -1),
		setStep(0, r+"/nope", "x", -1),
		deleteStep(0, r+"/a", 0),
		deleteStep(0, r+"/nope", -1),
		getStep(0, r+"/a", false),
		deleteStep(0, r, -1),
		deleteStep(0, r+"/a", 2),
		deleteStep(0, r, 0),
		existsStep(0, r, false),
	}
}

// seqSequential: sequential names after a child was created and deleted
// (ZooKeeper 3.8 numbers a child by the creations under its parent).
func seqSequential(r string) []step {
	return []step{
		createStep(0, r, "", flagPersistent),
		createStep(0, r+"/x", "", flagPersistent),
		deleteStep(0, r+"/x", -1),
		createStep(0, r+"/s-", "1", flagSequential),
		createStep(0, r+"/s-", "2", flagSequential),
		createStep(1, r+"/e-", "3", flagEphemeralSeq),
		createStep(0, r+"/", "4", flagSequential),
		children2Step(0, r, false),
		getStep(0, r, false),
		multiStep(0, "sequential", mCreate(r+"/m-", "", flagSequential), mCreate(r+"/m-", "", flagSequential)),
	}
}

// seqEphemerals: the owner, no children, listed per session, removed with
// the session.
func seqEphemerals(r string) []step {
	return []step{
		createStep(0, r, "", flagPersistent),
		createStep(0, r+"/q", "", flagPersistent),
		createStep(1, r+"/q/e", "", flagEphemeral),
		createStep(1, r+"/eph", "mine", flagEphemeral),
		getStep(0, r+"/eph", false),
		createStep(1, r+"/eph/child", "", flagPersistent),
		{1, "getEphemerals " + r, opGetEphemerals, enc{}.str(r), func(_ *transcript, d *dec) string { return sortedStrs(d) }},
		{1, "getEphemerals /", opGetEphemerals, enc{}.str("/"), func(_ *transcript, d *dec) string { return sortedStrs(d) }},
		{0, "getEphemerals " + r, opGetEphemerals, enc{}.str(r), func(_ *transcript, d *dec) string { return sortedStrs(d) }},
		{0, "getAllChildrenNumber " + r, opGetAllChildrenNumber, enc{}.str(r), func(_ *transcript, d *dec) string { return fmt.Sprint(d.i32()) }},
		deleteStep(0, r+"/q", -1),
		existsStep(0, r+"/eph", true),
		getStep(0, r+"/q/e", true),
		childrenStep(0, r+"/q", true),
		{1, "close session 1", opClose, nil, noBody},
		existsStep(0, r+"/eph", false),
		children2Step(0, r+"/q", false),
	}
}

// seqContainers: create2 and a container node.
func seqContainers(r string) []step {
	return []step{
		createStep(0, r, "", flagPersistent),
		create2Step(0, opCreate2, r+"/c2", "stat", flagPersistent),
		create2Step(0, opCreate2, r+"/c2", "stat", flagPersistent),
		create2Step(0, opCreateContainer, r+"/box", "", flagContainer),
		getStep(0, r+"/box", false),
	}
}

// seqWatches: one-shot data, exist and child watches, fired by the other
// session, each once.
func seqWatches(r string) []step {
	return []step{
		createStep(0, r, "", flagPersistent),
		createStep(0, r+"/c2", "x", flagPersistent),
		getStep(0, r+"/c2", true),
		existsStep(0, r+"/w", true),
		childrenStep(0, r, true),
		setStep(1, r+"/c2", "changed", -1),
		createStep(1, r+"/w", "", flagPersistent),
		setStep(1, r+"/c2", "again", -1), // the data watch fired once: no second event
		getStep(0, r+"/w", true),
		childrenStep(0, r+"/w", true),
		existsStep(0, r+"/w", true),
		deleteStep(1, r+"/w", -1),
		getStep(0, r+"/c2", true),
		getStep(1, r+"/c2", true),
		setStep(0, r+"/c2", "both see it", -1),
	}
}

// seqMulti: all or nothing, ZooKeeper's per-op results and errors.
func seqMulti(r string) []step {
	return []step{
		createStep(0, r, "", flagPersistent),
		createStep(0, r+"/c2", "", flagPersistent),
		setStep(0, r+"/c2", "v1", -1),
		getStep(1, r+"/c2", true),
		multiStep(0, "ok", mCheck(r+"/c2", 1), mCreate(r+"/m1", "a", flagPersistent), mCreate(r+"/m2", "b", flagPersistent),
			mSet(r+"/m1", "a2", 0), mDelete(r+"/m2", 0), mSet(r+"/c2", "v2", 1)),
		getStep(0, r+"/m1", false),
		getStep(0, r, false),
		multiStep(0, "fails at check", mCreate(r+"/m3", "", flagPersistent), mCheck(r+"/c2", 99), mSet(r+"/m1", "x", -1)),
		existsStep(0, r+"/m3", false),
		multiStep(0, "fails at create", mSet(r+"/m1", "y", -1), mCreate(r+"/m1", "", flagPersistent)),
		getStep(0, r+"/m1", false),
		multiStep(0, "fails at delete of a parent", mDelete(r, -1)),
		multiStep(0, "fails at a missing node", mCheck(r+"/nope", -1)),
		multiStep(0, "empty"),
	}
}

// seqMultiCreate2: a create2 inside a multi.
func seqMultiCreate2(r string) []step {
	return []step{
		createStep(0, r, "", flagPersistent),
		multiStep(0, "create2", mCreate2(r+"/m2", "b", flagPersistent), mDelete(r+"/m2", 0)),
	}
}

// seqACL: getACL, setACL with a version, and a read-only node refusing.
func seqACL(r string) []step {
	return []step{
		createStep(0, r, "", flagPersistent),
		createStep(0, r+"/m1", "a", flagPersistent),
		{0, "getACL " + r + "/m1", opGetACL, enc{}.str(r + "/m1"), func(tr *transcript, d *dec) string {
			return fmt.Sprintf("%v %s", d.acls(), tr.stat(d.stat()))
		}},
		{0, "setACL read-only, version 5", opSetACL, enc{}.str(r + "/m1").acls([]acl{{1, "world", "anyone"}}).i32(5), statBody},
		{0, "setACL read-only", opSetACL, enc{}.str(r + "/m1").acls([]acl{{1, "world", "anyone"}}).i32(0), statBody},
		{0, "getACL " + r + "/m1", opGetACL, enc{}.str(r + "/m1"), func(tr *transcript, d *dec) string {
			return fmt.Sprintf("%v %s", d.acls(), tr.stat(d.stat()))
		}},
		setStep(0, r+"/m1", "refused", -1),
		getStep(0, r+"/m1", false),
		createStep(0, r+"/m1/kid", "", flagPersistent),
		{0, "create with an empty ACL", opCreate, enc{}.str(r + "/noacl").buf(nil).acls(nil).i32(0), pathBody},
		{0, "sync " + r, opSync, enc{}.str(r), pathBody},
		{0, "whoAmI", opWhoAmI, nil, func(_ *transcript, d *dec) string {
			var out []string
			for n := d.i32(); n > 0 && d.err == nil; n-- {
				out = append(out, d.str()+":"+d.str())
			}
			return fmt.Sprintf("%q", out)
		}},
	}
}

// seqPersistentWatch: addWatch, recursive.
func seqPersistentWatch(r string) []step {
	return []step{
		createStep(0, r, "", flagPersistent),
		{0, "addWatch " + r + "/tree recursive", opAddWatch, enc{}.str(r + "/tree").i32(1),
			func(_ *transcript, d *dec) string { return fmt.Sprintf("err=%d", d.i32()) }},
		createStep(1, r+"/tree", "", flagPersistent),
		createStep(1, r+"/tree/x", "", flagPersistent),
		setStep(1, r+"/tree/x", "v", -1),
		deleteStep(1, r+"/tree/x", -1),
		{0, "addWatch " + r + " persistent", opAddWatch, enc{}.str(r).i32(0),
			func(_ *transcript, d *dec) string { return fmt.Sprintf("err=%d", d.i32()) }},
		setStep(1, r, "v", -1),
		createStep(1, r+"/y", "", flagPersistent),
		setStep(1, r, "w", -1),
	}
}

// record runs steps with session i connected to addrs[i] and returns the
// transcript; with resume, it also checks session resumption (resume) on
// s.
func record(t *testing.T, s *server, addrs []string, root string, steps []step, withResume bool) []string {
	t.Helper()
	tr := &transcript{zxids: map[int64]string{}, sessions: map[int64]string{}}
	var conns []*zkConn
	for i := 0; i < 2; i++ {
		c, err := dialZK(addrs[i], 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.close)
		tr.sessions[c.SessionID] = fmt.Sprintf("session%d", i)
		conns = append(conns, c)
	}
	closed := map[int]bool{}
	// redial replaces session i's connection after the server closed it
	// (the transcript says so, and goes on with a new session).
	redial := func(i int) {
		c, err := dialZK(addrs[i], 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.close)
		tr.sessions[c.SessionID] = fmt.Sprintf("session%d(new)", i)
		conns[i] = c
	}
	for _, st := range steps {
		r, err := conns[st.conn].call(st.op, st.req)
		if err != nil && st.op != opClose {
			// How the client learned of the close (a failed write, or
			// a read that met the end) depends on timing, not on the
			// server's answer: only the loss is compared.
			t.Logf("s%d %s: connection lost: %v", st.conn, st.label, err)
			tr.lines = append(tr.lines, fmt.Sprintf("s%d %s -> CONNECTION LOST", st.conn, st.label))
			redial(st.conn)
			continue
		}
		line := fmt.Sprintf("s%d %s -> %s", st.conn, st.label, errName(r.Err))
		if r.Err == 0 {
			d := &dec{b: r.Body}
			if b := st.body(tr, d); b != "" {
				line += " " + b
			}
			if d.err != nil {
				line += " [malformed: " + d.err.Error() + "]"
			} else if len(d.b) != 0 {
				line += fmt.Sprintf(" [%d bytes more]", len(d.b))
			}
		}
		tr.lines = append(tr.lines, line)
		if st.op == opClose {
			closed[st.conn] = true
		}
		// Whatever events each session has by the time it gets an answer to
		// a sync sent now (on a follower, sync catches up with the leader:
		// the change just made is applied there, its watches fired).
		for i, c := range conns {
			if closed[i] {
				continue
			}
			if _, err := c.call(opSync, enc{}.str("/")); err != nil {
				t.Logf("s%d: connection lost: %v", i, err)
				tr.lines = append(tr.lines, fmt.Sprintf("  s%d CONNECTION LOST", i))
				redial(i)
				continue
			}
			// One write's events, sorted: ZooKeeper does not order those of
			// one change (a closed session's ephemerals, say).
			var evs []string
			for _, e := range c.takeEvents() {
				evs = append(evs, fmt.Sprintf("  s%d event %s", i, strings.Replace(e.String(), root, "ROOT", 1)))
			}
			sort.Strings(evs)
			tr.lines = append(tr.lines, evs...)
		}
	}
	if withResume {
		resume(t, s, root, conns[0], tr)
	}
	for i := range tr.lines {
		tr.lines[i] = strings.ReplaceAll(tr.lines[i], root, "ROOT")
	}
	return tr.lines
}

// resume drops a session's connection (no closeSession), changes a node
// it watched while it is away, and comes back: with a wrong password (to
// be refused), then with its password (the same session, its ephemeral
// still there), re-registering its watch with setWatches.
func resume(t *testing.T, s *server, root string, other *zkConn, tr *transcript) {
	t.Helper()
	add := func(format string, args ...any) { tr.lines = append(tr.lines, fmt.Sprintf(format, args...)) }
	for _, ms := range []int{1000, 10000, 100000} {
		c, err := dialZK(s.Addr, time.Duration(ms)*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		add("connect asking %dms -> timeout %dms", ms, c.Timeout)
		c.close()
	}
	c, err := dialZK(s.Addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	tr.sessions[c.SessionID] = "session2"
	if _, code, err := c.create(root+"/e2", []byte("e2"), flagEphemeral); err != nil || code != 0 {
		t.Fatalf("create %s/e2: %s %v", root, errName(code), err)
	}
	for _, w := range []struct {
		op   int32
		path string
	}{{opGetData, root + "/c2"}, {opExists, root + "/born"}, {opGetChildren, root}} {
		if _, err := c.call(w.op, enc{}.str(w.path).boolean(true)); err != nil {
			t.Fatal(err)
		}
	}
	seen := c.seenZxid()
	c.drop()
	if _, err := other.call(opSetData, enc{}.str(root+"/c2").buf([]byte("while away")).i32(-1)); err != nil {
		t.Fatal(err)
	}
	if _, code, err := other.create(root+"/born", nil, flagPersistent); err != nil || code != 0 {
		t.Fatalf("create %s/born: %s %v", root, errName(code), err)
	}
	wrong := append([]byte{}, c.Passwd...)
	wrong[0] ^= 0xff
	if bad, err := dialSession(s.Addr, 10*time.Second, c.SessionID, wrong); err == nil {
		add("s2 reconnect with a wrong password -> accepted as %s", tr.session(bad.SessionID))
		bad.drop()
	} else {
		add("s2 reconnect with a wrong password -> %v", err)
	}
	back, err := dialSession(s.Addr, 10*time.Second, c.SessionID, c.Passwd)
	if err != nil {
		add("s2 reconnect with its password -> %v", err)
		return
	}
	t.Cleanup(back.close)
	add("s2 reconnect with its password -> %s timeout %dms", tr.session(back.SessionID), back.Timeout)
	r, err := back.call(opSetWatches, enc{}.i64(seen).strs([]string{root + "/c2"}).strs([]string{root + "/born"}).strs([]string{root}))
	if err != nil {
		t.Fatal(err)
	}
	add("s2 setWatches data=[ROOT/c2] exist=[ROOT/born] child=[ROOT] -> %s", errName(r.Err))
	if _, err := back.call(opExists, enc{}.str("/").boolean(false)); err != nil {
		t.Fatal(err)
	}
	var evs []string
	for _, e := range back.takeEvents() {
		evs = append(evs, "  s2 event "+strings.Replace(e.String(), root, "ROOT", 1))
	}
	sort.Strings(evs)
	for _, e := range evs {
		add("%s", e)
	}
	r, err = back.call(opExists, enc{}.str(root+"/e2").boolean(false))
	if err != nil {
		t.Fatal(err)
	}
	line := "s2 exists ROOT/e2 -> " + errName(r.Err)
	if r.Err == 0 {
		line += " " + tr.stat((&dec{b: r.Body}).stat())
	}
	add("%s", line)
}

// differential runs steps against ZooKeeper and, where Tenure is a
// target, against Tenure, and compares Tenure's transcript with
// ZooKeeper's.
func differential(t *testing.T, steps func(root string) []step, withResume bool) {
	var want []string
	eachTarget(t, func(t *testing.T, s *server, root string) {
		got := record(t, s, []string{s.Addr, s.Addr}, root, steps(root), withResume)
		if s.Name == zooKeeper {
			want = got
			t.Logf("ZooKeeper's transcript:\n%s", strings.Join(got, "\n"))
			return
		}
		if want == nil {
			t.Fatal("no ZooKeeper transcript to compare with")
		}
		if diff := diffLines(want, got); diff != "" {
			t.Errorf("Tenure's answers differ from ZooKeeper 3.8's (- ZooKeeper, + Tenure):\n%s", diff)
		}
	})
}

// seqEmptyPath: requests on the empty path, which ZooKeeper's clients do
// not send (they validate paths first) but a raw client can. The root's
// stat and children depend on the other tests, so only what is answered
// is compared.
func seqEmptyPath(r string) []step {
	answered := func(*transcript, *dec) string { return "answered" }
	hasZookeeper := func(_ *transcript, d *dec) string {
		return fmt.Sprintf("zookeeper among the children: %v", slices.Contains(d.strs(), "zookeeper"))
	}
	return []step{
		createStep(0, r, "", flagPersistent),
		{0, "getData \"\"", opGetData, enc{}.str("").boolean(false), func(_ *transcript, d *dec) string { return fmt.Sprintf("%q", d.buf()) }},
		{0, "exists \"\"", opExists, enc{}.str("").boolean(false), answered},
		{0, "getChildren \"\"", opGetChildren, enc{}.str("").boolean(false), hasZookeeper},
		{0, "getChildren2 \"\"", opGetChildren2, enc{}.str("").boolean(false), hasZookeeper},
		{0, "getACL \"\"", opGetACL, enc{}.str(""), answered},
		{0, "getAllChildrenNumber \"\"", opGetAllChildrenNumber, enc{}.str(""), answered},
		{0, "getEphemerals \"\"", opGetEphemerals, enc{}.str(""), answered},
		{0, "sync \"\"", opSync, enc{}.str(""), answered},
		createStep(0, "", "", flagPersistent),
		setStep(0, "", "x", -1),
		deleteStep(0, "", -1),
	}
}

func TestDiffEmptyPath(t *testing.T)       { differential(t, seqEmptyPath, false) }
func TestDiffPaths(t *testing.T)           { differential(t, seqPaths, false) }
func TestDiffVersions(t *testing.T)        { differential(t, seqVersions, false) }
func TestDiffSequential(t *testing.T)      { differential(t, seqSequential, false) }
func TestDiffEphemerals(t *testing.T)      { differential(t, seqEphemerals, false) }
func TestDiffContainers(t *testing.T)      { differential(t, seqContainers, false) }
func TestDiffWatches(t *testing.T)         { differential(t, seqWatches, false) }
func TestDiffMulti(t *testing.T)           { differential(t, seqMulti, false) }
func TestDiffMultiCreate2(t *testing.T)    { differential(t, seqMultiCreate2, false) }
func TestDiffACL(t *testing.T)             { differential(t, seqACL, false) }
func TestDiffPersistentWatch(t *testing.T) { differential(t, seqPersistentWatch, false) }

// seqLimits: data near and past jute.maxbuffer (1 MiB less one byte by
// default): a frame over it closes the connection.
func seqLimits(r string) []step {
	big := func(n int) string { return strings.Repeat("z", n) }
	lenBody := func(tr *transcript, d *dec) string {
		data := d.buf()
		return fmt.Sprintf("%d bytes %s", len(data), tr.stat(d.stat()))
	}
	return []step{
		createStep(0, r, "", flagPersistent),
		{0, "setData 1000000 bytes", opSetData, enc{}.str(r).buf([]byte(big(1000000))).i32(-1), statBody},
		{0, "getData", opGetData, enc{}.str(r).boolean(false), lenBody},
		{0, "setData 1048576 bytes", opSetData, enc{}.str(r).buf([]byte(big(1 << 20))).i32(-1), statBody},
		{0, "getData", opGetData, enc{}.str(r).boolean(false), lenBody},
		{0, "create with 1048576 bytes", opCreate, enc{}.str(r + "/big").buf([]byte(big(1 << 20))).acls(openACL).i32(0), pathBody},
		existsStep(0, r+"/big", false),
	}
}

func TestDiffLimits(t *testing.T) { differential(t, seqLimits, false) }

// seqNullData: data created or set null (jute's -1) reads back null,
// empty data empty, in getData and in a multi read.
func seqNullData(r string) []step {
	nullOrData := func(tr *transcript, d *dec) string {
		data := d.buf()
		if data == nil {
			return "null " + tr.stat(d.stat())
		}
		return fmt.Sprintf("%q %s", data, tr.stat(d.stat()))
	}
	return []step{
		createStep(0, r, "", flagPersistent),
		{0, "create with null data", opCreate, enc{}.str(r + "/null").buf(nil).acls(openACL).i32(0), pathBody},
		{0, "getData null", opGetData, enc{}.str(r + "/null").boolean(false), nullOrData},
		{0, "create with empty data", opCreate, enc{}.str(r + "/empty").buf([]byte{}).acls(openACL).i32(0), pathBody},
		{0, "getData empty", opGetData, enc{}.str(r + "/empty").boolean(false), nullOrData},
		{0, "setData null", opSetData, enc{}.str(r + "/empty").buf(nil).i32(-1), statBody},
		{0, "getData set null", opGetData, enc{}.str(r + "/empty").boolean(false), nullOrData},
	}
}

func TestDiffNullData(t *testing.T) { differential(t, seqNullData, false) }

// TestDiffFollowers: the versions, watches, multi, ACL and ephemerals
// sequences with the two sessions on two other members of a three-member
// cluster (a ZooKeeper ensemble, a Tenure cluster) than the first: writes
// reach the leader through them, reads and watches are served by them.
func TestDiffFollowers(t *testing.T) {
	var want []string
	for _, name := range targets(t) {
		t.Run(name, func(t *testing.T) {
			ms := startCluster(t, name)
			r := "/followers"
			steps := []step{createStep(0, r, "", flagPersistent)}
			for _, seq := range []struct {
				sub   string
				steps func(string) []step
			}{{"/v", seqVersions}, {"/w", seqWatches}, {"/m", seqMulti}, {"/a", seqACL}, {"/e", seqEphemerals}} {
				steps = append(steps, seq.steps(r+seq.sub)...)
			}
			got := record(t, &server{Name: name, Addr: ms[1].Addr, p: ms[1].p}, []string{ms[1].Addr, ms[2].Addr}, r, steps, false)
			if name == zooKeeper {
				want = got
				t.Logf("ZooKeeper's transcript:\n%s", strings.Join(got, "\n"))
				return
			}
			if want == nil {
				t.Fatal("no ZooKeeper transcript to compare with")
			}
			if diff := diffLines(want, got); diff != "" {
				t.Errorf("Tenure's answers differ from ZooKeeper 3.8's (- ZooKeeper, + Tenure):\n%s", diff)
			}
		})
	}
}

// TestDiffSessions: timeout negotiation, a wrong password refused, a
// session resumed on a new connection with its ephemeral and (through
// setWatches) its watch.
func TestDiffSessions(t *testing.T) {
	differential(t, func(r string) []step {
		return []step{createStep(0, r, "", flagPersistent), createStep(0, r+"/c2", "", flagPersistent)}
	}, true)
}

// diffLines shows the lines of a and b that differ, aligned by a longest
// common subsequence.
func diffLines(a, b []string) string {
	n, m := len(a), len(b)
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out []string
	changed := false
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && a[i] == b[j]:
			out = append(out, "  "+a[i])
			i, j = i+1, j+1
		case j < m && (i == n || lcs[i][j+1] >= lcs[i+1][j]):
			out = append(out, "+ "+b[j])
			j, changed = j+1, true
		default:
			out = append(out, "- "+a[i])
			i, changed = i+1, true
		}
	}
	if !changed {
		return ""
	}
	return strings.Join(out, "\n")
}
