package zkapi_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/testutil"
)

// startNode runs a one-node Tenure with a ZooKeeper listener; it returns
// the daemon and the listener's address.
// runDaemon starts a node with cfg and runs it until the test ends.
func runDaemon(t testing.TB, cfg daemon.Config) *daemon.Daemon {
	t.Helper()
	d, err := daemon.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return d
}

func startNode(t *testing.T, mod func(*daemon.Config)) (*daemon.Daemon, string) {
	t.Helper()
	cfg := daemon.Config{NodeID: "n1", DataDir: filepath.Join(t.TempDir(), "n1"), Listen: "127.0.0.1:0",
		ZkListen: "127.0.0.1:0", ZkMinSessionTimeout: time.Second, ZkMaxSessionTimeout: 20 * time.Second, LogOutput: testutil.LogWriter(t, "n1")}
	if mod != nil {
		mod(&cfg)
	}
	d := runDaemon(t, cfg)
	select {
	case <-d.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("not ready")
	}
	return d, d.ZkAddr()
}

type testLogger struct{ t *testing.T }

func (l testLogger) Printf(format string, args ...any) { l.t.Logf("zk: "+format, args...) }

// connect opens a go-zookeeper client and waits for its session.
func connect(t *testing.T, addrs []string, timeout time.Duration) (*zk.Conn, <-chan zk.Event) {
	t.Helper()
	c, ev, err := zk.Connect(addrs, timeout, zk.WithLogger(testLogger{t}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	testutil.WaitFor(t, "a session", 10*time.Second, func() bool { return c.State() == zk.StateHasSession })
	return c, ev
}

// TestBasicOps: create, get, set, delete, exists and children answer as
// ZooKeeper does, errors included.
func TestBasicOps(t *testing.T) {
	d, addr := startNode(t, nil)
	c, _ := connect(t, []string{addr}, 5*time.Second)
	acl := zk.WorldACL(zk.PermAll)

	p, err := c.Create("/app", []byte("v1"), 0, acl)
	if err != nil || p != "/app" {
		t.Fatalf("create /app: %q, %v", p, err)
	}
	if _, err := c.Create("/app", nil, 0, acl); !errors.Is(err, zk.ErrNodeExists) {
		t.Fatalf("create /app again: %v, want NodeExists", err)
	}
	if _, err := c.Create("/missing/child", nil, 0, acl); !errors.Is(err, zk.ErrNoNode) {
		t.Fatalf("create under a missing parent: %v, want NoNode", err)
	}
	data, st, err := c.Get("/app")
	if err != nil || string(data) != "v1" || st.Version != 0 || st.Czxid == 0 || st.Czxid != st.Mzxid || st.DataLength != 2 {
		t.Fatalf("get /app: %q %+v %v", data, st, err)
	}
	czxid := st.Czxid
	if _, err := c.Set("/app", []byte("v2"), 5); !errors.Is(err, zk.ErrBadVersion) {
		t.Fatalf("set with a wrong version: %v, want BadVersion", err)
	}
	st, err = c.Set("/app", []byte("v2"), 0)
	if err != nil || st.Version != 1 || st.Mzxid <= czxid || st.Czxid != czxid {
		t.Fatalf("set: %+v %v", st, err)
	}
	if _, err := c.Create("/app/a", nil, 0, acl); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create("/app/b", []byte("x"), 0, acl); err != nil {
		t.Fatal(err)
	}
	children, st, err := c.Children("/app")
	if err != nil || !slices.Equal(children, []string{"a", "b"}) || st.NumChildren != 2 || st.Cversion != 2 {
		t.Fatalf("children: %v %+v %v", children, st, err)
	}
	if err := c.Delete("/app", -1); !errors.Is(err, zk.ErrNotEmpty) {
		t.Fatalf("delete a parent: %v, want NotEmpty", err)
	}
	if err := c.Delete("/app/a", 3); !errors.Is(err, zk.ErrBadVersion) {
		t.Fatalf("delete with a wrong version: %v, want BadVersion", err)
	}
	if err := c.Delete("/app/a", 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete("/app/a", -1); !errors.Is(err, zk.ErrNoNode) {
		t.Fatalf("delete again: %v, want NoNode", err)
	}
	ok, _, err := c.Exists("/app/a")
	if err != nil || ok {
		t.Fatalf("exists of a deleted node: %v %v", ok, err)
	}
	ok, st, err = c.Exists("/app/b")
	if err != nil || !ok || st.DataLength != 1 {
		t.Fatalf("exists /app/b: %v %+v %v", ok, st, err)
	}
	root, _, err := c.Children("/")
	if err != nil || !slices.Equal(root, []string{"app", "zookeeper"}) {
		t.Fatalf("children of /: %v %v", root, err)
	}
	if _, err := c.Create("/bad//path", nil, 0, acl); err == nil {
		t.Fatal("an invalid path was created")
	}
	if _, err := c.Create("/eph", nil, zk.FlagEphemeral, acl); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create("/eph/child", nil, 0, acl); !errors.Is(err, zk.ErrNoChildrenForEphemerals) {
		t.Fatalf("child of an ephemeral: %v, want NoChildrenForEphemerals", err)
	}
	_, st, _ = c.Get("/eph")
	if st.EphemeralOwner != c.SessionID() {
		t.Fatalf("ephemeralOwner %d, want the session %d", st.EphemeralOwner, c.SessionID())
	}
	// The answers count in the request metrics, by op and code.
	for _, want := range []struct{ method, code string }{{"zk.create", "OK"}, {"zk.create", "AlreadyExists"}, {"zk.delete", "FailedPrecondition"}, {"zk.getChildren2", "OK"}} {
		if n := requestCount(t, d, want.method, want.code); n < 1 {
			t.Errorf("tenure_rpc_requests_total{method=%q,code=%q} = %v", want.method, want.code, n)
		}
	}
}

// requestCount is tenure_rpc_requests_total{method, code} on d (0: none).
func requestCount(t *testing.T, d *daemon.Daemon, method, code string) float64 {
	t.Helper()
	v, _ := metricValue(t, d, "tenure_rpc_requests_total", "method", method, "code", code)
	return v
}

// metricValue is the value of the counter or gauge name whose labels
// include the given name, value pairs, on d; false when d exposes none.
func metricValue(t *testing.T, d *daemon.Daemon, name string, labelPairs ...string) (float64, bool) {
	t.Helper()
	mfs, err := d.Hub.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labelPairs); i += 2 {
				if labels[labelPairs[i]] != labelPairs[i+1] {
					continue metrics
				}
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue(), true
			}
			return m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

// TestSequentialNames: a sequential node's suffix is its parent's
// cversion, in 10 digits.
func TestSequentialNames(t *testing.T) {
	_, addr := startNode(t, nil)
	c, _ := connect(t, []string{addr}, 5*time.Second)
	acl := zk.WorldACL(zk.PermAll)
	if _, err := c.Create("/q", nil, 0, acl); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create("/q/other", nil, 0, acl); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		p, err := c.Create("/q/item-", nil, zk.FlagSequence, acl)
		want := fmt.Sprintf("/q/item-%010d", i)
		if err != nil || p != want {
			t.Fatalf("sequential create %d: %q %v, want %q", i, p, err, want)
		}
	}
}

// TestEphemeralsEndWithTheSession: closing the session removes its
// ephemerals, and a watcher on another session sees them go.
func TestEphemeralsEndWithTheSession(t *testing.T) {
	_, addr := startNode(t, nil)
	owner, _ := connect(t, []string{addr}, 5*time.Second)
	other, _ := connect(t, []string{addr}, 5*time.Second)
	acl := zk.WorldACL(zk.PermAll)
	if _, err := owner.Create("/lock", nil, 0, acl); err != nil {
		t.Fatal(err)
	}
	p, err := owner.Create("/lock/n-", nil, zk.FlagEphemeral|zk.FlagSequence, acl)
	if err != nil {
		t.Fatal(err)
	}
	ok, _, ch, err := other.ExistsW(p)
	if err != nil || !ok {
		t.Fatalf("exists: %v %v", ok, err)
	}
	owner.Close()
	select {
	case e := <-ch:
		if e.Type != zk.EventNodeDeleted || e.Path != p {
			t.Fatalf("event %+v, want NodeDeleted of %s", e, p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event for the ephemeral's removal")
	}
	if ok, _, _ := other.Exists(p); ok {
		t.Fatal("the ephemeral outlived its session")
	}
}

// TestResumeAndWrongPassword: a session resumes on a new connection with
// its id and password; a wrong password is refused as ZooKeeper refuses
// it (the client reports an expired session), and the session lives on.
func TestResumeAndWrongPassword(t *testing.T) {
	_, addr := startNode(t, nil)
	c, _ := connect(t, []string{addr}, 5*time.Second)
	id := c.SessionID()
	if _, err := c.Create("/e", []byte("x"), zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	good := raw(t, addr)
	// The raw client asks 30s: the resume renegotiates it, clamped to 20s.
	if got := good.connect(t, id, sessionPassword(t, c), true); got.sessionID != id || got.timeout != 20000 || !got.hasReadOnly {
		t.Fatalf("resume: %+v, want session %d, timeout 20000, readOnly flag", got, id)
	}
	bad := raw(t, addr)
	pw := make([]byte, 16)
	if got := bad.connect(t, id, pw, false); got.sessionID != 0 || got.timeout != 0 || got.hasReadOnly {
		t.Fatalf("wrong password: %+v, want session 0, timeout 0, no readOnly flag (old handshake)", got)
	}
	if !bad.closed(t) {
		t.Fatal("the refused connection stayed open")
	}
	if ok, _, err := c.Exists("/e"); err != nil || !ok {
		t.Fatalf("the session's ephemeral after a refused resume: %v %v", ok, err)
	}
}

// TestWatchEventsPrecedeReads: a data watch, a child watch and an exists
// watch each fire once, with ZooKeeper's event types, and the event
// reaches the client before the answer of a read that sees the change.
func TestWatchEventsPrecedeReads(t *testing.T) {
	_, addr := startNode(t, nil)
	watcher, _ := connect(t, []string{addr}, 5*time.Second)
	writer, _ := connect(t, []string{addr}, 5*time.Second)
	acl := zk.WorldACL(zk.PermAll)
	if _, err := writer.Create("/w", []byte("0"), 0, acl); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		_, _, data, err := watcher.GetW("/w")
		if err != nil {
			t.Fatal(err)
		}
		_, _, kids, err := watcher.ChildrenW("/w")
		if err != nil {
			t.Fatal(err)
		}
		child := fmt.Sprintf("/w/c%d", i)
		_, _, exist, err := watcher.ExistsW(child)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := writer.Set("/w", []byte(fmt.Sprint(i)), -1); err != nil {
			t.Fatal(err)
		}
		if _, err := writer.Create(child, nil, 0, acl); err != nil {
			t.Fatal(err)
		}
		// The watcher reads the change: its events were sent first.
		if ok, _, err := watcher.Exists(child); err != nil || !ok {
			t.Fatalf("exists %s: %v %v", child, ok, err)
		}
		for _, w := range []struct {
			ch   <-chan zk.Event
			typ  zk.EventType
			path string
		}{{data, zk.EventNodeDataChanged, "/w"}, {kids, zk.EventNodeChildrenChanged, "/w"}, {exist, zk.EventNodeCreated, child}} {
			select {
			case e := <-w.ch:
				if e.Type != w.typ || e.Path != w.path {
					t.Fatalf("round %d: event %+v, want %v of %s", i, e, w.typ, w.path)
				}
			default:
				t.Fatalf("round %d: no %v event of %s before the read that saw the change", i, w.typ, w.path)
			}
		}
	}
}

// TestMultiAllOrNothing: a multi that fails at one op changes nothing and
// answers ZooKeeper's per-op results; one that passes applies every op
// at one zxid.
func TestMultiAllOrNothing(t *testing.T) {
	_, addr := startNode(t, nil)
	c, _ := connect(t, []string{addr}, 5*time.Second)
	acl := zk.WorldACL(zk.PermAll)
	if _, err := c.Create("/m", nil, 0, acl); err != nil {
		t.Fatal(err)
	}
	res, err := c.Multi(&zk.CreateRequest{Path: "/m/a", Acl: acl}, &zk.SetDataRequest{Path: "/m", Data: []byte("x"), Version: 7}, &zk.CreateRequest{Path: "/m/b", Acl: acl})
	if !errors.Is(err, zk.ErrBadVersion) || len(res) != 3 || res[0].Error != nil || !errors.Is(res[1].Error, zk.ErrBadVersion) || res[2].Error == nil {
		t.Fatalf("failed multi: %+v %v, want [ok, BadVersion, RuntimeInconsistency]", res, err)
	}
	if ok, _, _ := c.Exists("/m/a"); ok {
		t.Fatal("a failed multi created /m/a")
	}
	res, err = c.Multi(&zk.CreateRequest{Path: "/m/a", Acl: acl}, &zk.SetDataRequest{Path: "/m", Data: []byte("x"), Version: 0}, &zk.CheckVersionRequest{Path: "/m", Version: 1}, &zk.DeleteRequest{Path: "/m/a", Version: 0})
	if err != nil || len(res) != 4 || res[0].String != "/m/a" {
		t.Fatalf("multi: %+v %v", res, err)
	}
	_, st, _ := c.Get("/m")
	if st.Version != 1 || st.Cversion != 2 || st.Pzxid != st.Mzxid {
		t.Fatalf("after the multi: %+v, want version 1, cversion 2, pzxid = mzxid (one zxid)", st)
	}
}
