package zkapi_test

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TTL requests on the wire: opcode 21 (createTTL) is a CreateRequest
// followed by the ttl (a long).
const (
	opCreate    = 1
	opMulti     = 14
	opCreateTTL = 21
)

var (
	openACL  = jute{}.int(1).int(31).str("world").str("anyone")
	multiEnd = jute{}.int(-1).bool(true).int(-1)
)

func createTTLBody(path string, flags int32, ttl int64) jute {
	return jute{}.str(path).str("d").append(openACL).int(flags).append8(ttl)
}

// TestTTLNodesOffByDefault: without --zk-ttl-nodes a TTL create is
// answered Unimplemented, as ZooKeeper answers it without
// zookeeper.extendedTypesEnabled: createTTL, a create with a TTL mode,
// and a multi holding a createTTL; nothing is created.
func TestTTLNodesOffByDefault(t *testing.T) {
	_, addr := startNode(t, nil)
	c, _ := connect(t, []string{addr}, 5*time.Second)
	if _, err := c.CreateTTL("/t", nil, zk.FlagTTL, zk.WorldACL(zk.PermAll), time.Minute); err == nil {
		t.Fatal("createTTL passed")
	}
	r := raw(t, addr)
	r.connect(t, 0, make([]byte, 16), true)
	if code, _ := r.call(t, 3, opCreateTTL, createTTLBody("/t", 5, 1000)); code != -6 {
		t.Fatalf("createTTL: code %d, want Unimplemented (-6)", code)
	}
	if code, _ := r.call(t, 1, opCreate, jute{}.str("/t").str("d").append(openACL).int(5)); code != -6 {
		t.Fatalf("create with mode 5: code %d, want Unimplemented (-6)", code)
	}
	if code, _ := r.call(t, 2, opMulti, jute{}.int(opCreateTTL).bool(false).int(-1).append(createTTLBody("/t", 5, 1000)).append(multiEnd)); code != -6 {
		t.Fatalf("multi with a createTTL: code %d, want Unimplemented (-6)", code)
	}
	if ok, _, err := c.Exists("/t"); err != nil || ok {
		t.Fatalf("/t exists (%v, %v)", ok, err)
	}
}

// TestWireTTL: with --zk-ttl-nodes, TTL creates answer byte for byte as
// ZooKeeper 3.8 with extended types does: createTTL answers as a create2
// (path and stat, ephemeralOwner 0), mode 6 is sequential, the TTL is 1
// to 2^40 - 1 ms, a TTL mode without a ttl or a ttl with another mode is
// BadArguments; in a multi a createTTL answers as a create2, one with
// another mode is a plain create, and a create op with a TTL mode fails
// the multi with MarshallingError.
func TestWireTTL(t *testing.T) {
	_, addr := startNode(t, func(cfg *daemon.Config) { cfg.ZkTTLNodes = true })
	r := raw(t, addr)
	if got := r.connect(t, 0, make([]byte, 16), true); got.sessionID == 0 {
		t.Fatal("no session")
	}
	mop := func(op int32, body jute) jute { return jute{}.int(op).bool(false).int(-1).append(body) }
	cases := []struct {
		name     string
		op       int32
		body     jute
		code     int32
		wantHead jute // the answer starts with it; then a stat when stat
		stat     bool
	}{
		{"createTTL", opCreateTTL, createTTLBody("/t", 5, 60_000), 0, jute{}.str("/t"), true},
		{"createTTL sequential", opCreateTTL, createTTLBody("/t/s-", 6, 60_000), 0, jute{}.str("/t/s-0000000000"), true},
		{"the longest TTL", opCreateTTL, createTTLBody("/max", 5, 1<<40-1), 0, jute{}.str("/max"), true},
		{"a TTL over 2^40 - 1", opCreateTTL, createTTLBody("/over", 5, 1<<40), -8, nil, false},
		{"a TTL of 0", opCreateTTL, createTTLBody("/zero", 5, 0), -8, nil, false},
		{"a negative TTL", opCreateTTL, createTTLBody("/neg", 6, -1), -8, nil, false},
		{"createTTL with mode persistent", opCreateTTL, createTTLBody("/p", 0, 1000), -8, nil, false},
		{"createTTL with mode ephemeral", opCreateTTL, createTTLBody("/e", 1, 1000), -8, nil, false},
		{"create with a TTL mode", opCreate, jute{}.str("/c").str("d").append(openACL).int(5), -8, nil, false},
		{"createTTL under a missing parent", opCreateTTL, createTTLBody("/none/t", 5, 1000), -101, nil, false},
		{"createTTL in a multi", opMulti, jute{}.append(mop(opCreateTTL, createTTLBody("/m", 5, 1000))).append(multiEnd), 0,
			jute{}.int(15).bool(false).int(0).str("/m"), true},
		{"createTTL with mode persistent in a multi", opMulti, jute{}.append(mop(opCreateTTL, createTTLBody("/mp", 0, 1000))).append(multiEnd), 0,
			jute{}.int(1).bool(false).int(0).str("/mp").append(multiEnd), false},
		{"create with a TTL mode in a multi", opMulti, jute{}.append(mop(opCreate, jute{}.str("/mc").str("d").append(openACL).int(5))).append(multiEnd), -5, nil, false},
		{"a TTL of 0 in a multi", opMulti, jute{}.append(mop(opCreateTTL, createTTLBody("/m0", 5, 0))).append(multiEnd), 0,
			jute{}.int(-1).bool(false).int(-8).int(-8).append(multiEnd), false},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, body := r.call(t, int32(i+1), c.op, c.body)
			if code != c.code {
				t.Fatalf("code %d, want %d", code, c.code)
			}
			if c.wantHead == nil {
				return
			}
			if !bytes.HasPrefix(body, c.wantHead) {
				t.Fatalf("body %x, want it to start with %x", body, c.wantHead)
			}
			if !c.stat {
				if len(body) != len(c.wantHead) {
					t.Fatalf("body %x, want %x", body, c.wantHead)
				}
				return
			}
			if len(body) < len(c.wantHead)+68 {
				t.Fatalf("body %x has no stat", body)
			}
			if owner := binary.BigEndian.Uint64(body[len(c.wantHead)+44:]); owner != 0 {
				t.Fatalf("ephemeralOwner %#x, want 0 (as ZooKeeper reports a TTL node's)", owner)
			}
		})
	}
	c, _ := connect(t, []string{addr}, 5*time.Second)
	for _, p := range []string{"/over", "/zero", "/neg", "/p", "/e", "/c", "/mc", "/m0"} {
		if ok, _, err := c.Exists(p); err != nil || ok {
			t.Fatalf("%s was created (exists %v, %v)", p, ok, err)
		}
	}
}

// TestTTLNodeExpires: with a short --zk-container-check-interval the
// leader removes a TTL node that has no children once it was not changed
// for its TTL (an exists watch sees NodeDeleted); a TTL node kept set
// within its TTL stays, and so does one with a child until the child is
// deleted.
func TestTTLNodeExpires(t *testing.T) {
	_, addr := startNode(t, func(cfg *daemon.Config) {
		cfg.ZkTTLNodes = true
		cfg.ZkContainerCheckInterval = 50 * time.Millisecond
	})
	c, _ := connect(t, []string{addr}, 5*time.Second)
	acl := zk.WorldACL(zk.PermAll)
	const ttl = 400 * time.Millisecond
	// The node's mtime is taken on the leader after the request is sent, so
	// its TTL is counted from no earlier than this.
	created := time.Now()
	for _, p := range []string{"/idle", "/busy", "/parent"} {
		if _, err := c.CreateTTL(p, []byte("v"), zk.FlagTTL, acl, ttl); err != nil {
			t.Fatalf("createTTL %s: %v", p, err)
		}
	}
	if _, err := c.Create("/parent/child", nil, 0, acl); err != nil {
		t.Fatal(err)
	}
	_, _, ev, err := c.ExistsW("/idle")
	if err != nil {
		t.Fatal(err)
	}
	// /busy is set every ttl/4 until /idle is gone.
	deadline := time.Now().Add(15 * time.Second)
	for gone := false; !gone; {
		if time.Now().After(deadline) {
			t.Fatal("the idle TTL node was not removed within 15s")
		}
		if _, err := c.Set("/busy", []byte("v"), -1); err != nil {
			t.Fatalf("set /busy: %v", err)
		}
		select {
		case e := <-ev:
			if e.Type != zk.EventNodeDeleted || e.Path != "/idle" {
				t.Fatalf("event %+v, want NodeDeleted /idle", e)
			}
			gone = true
		case <-time.After(ttl / 4):
		}
	}
	if el := time.Since(created); el < ttl {
		t.Fatalf("the TTL node went after %v, before its TTL of %v", el, ttl)
	}
	// Two more TTLs: the others stay.
	for end := time.Now().Add(2 * ttl); time.Now().Before(end); {
		if _, err := c.Set("/busy", []byte("v"), -1); err != nil {
			t.Fatalf("set /busy: %v", err)
		}
		time.Sleep(ttl / 4) // the pace of a client's writes, not a synchronization
	}
	for _, p := range []string{"/busy", "/parent"} {
		if ok, _, err := c.Exists(p); err != nil || !ok {
			t.Fatalf("%s removed (exists %v, %v)", p, ok, err)
		}
	}
	if err := c.Delete("/parent/child", -1); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the TTL node removed once its child is gone", 10*time.Second, func() bool {
		ok, _, err := c.Exists("/parent")
		return err == nil && !ok
	})
}

// TestTTLNodeThroughAFollower: in a 3-node cluster with --zk-ttl-nodes,
// a client of a follower creates TTL nodes (the follower relays the
// createTTL to the leader) and reads them there at once; the leader's
// check removes the one left idle, and the follower's client sees it go
// (a watch event from the follower's applied state).
func TestTTLNodeThroughAFollower(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster")
	}
	cl := startZkCluster(t, func(_ string, cfg *daemon.Config) {
		cfg.ZkListen, cfg.ZkTTLNodes, cfg.ZkContainerCheckInterval = "127.0.0.1:0", true, 50*time.Millisecond
	})
	daemons, leader, follower := cl.daemons, cl.leader, cl.followers[0]
	testutil.WaitFor(t, "the leader's ZooKeeper address on the follower", 30*time.Second, func() bool {
		var addr string
		daemons[follower].Node.Read(func(st *fsm.State) { addr = st.ZkAddr(leader) })
		return addr == daemons[leader].ZkAddr()
	})
	c, _ := connect(t, []string{daemons[follower].ZkAddr()}, 10*time.Second)
	acl := zk.WorldACL(zk.PermAll)
	if _, err := c.CreateTTL("/keep", []byte("v"), zk.FlagTTL, acl, time.Hour); err != nil {
		t.Fatalf("createTTL through the follower: %v", err)
	}
	p, err := c.CreateTTL("/short-", []byte("v"), zk.FlagTTL+1, acl, 300*time.Millisecond)
	if err != nil || p != "/short-0000000001" {
		t.Fatalf("sequential createTTL through the follower: %q %v", p, err)
	}
	ok, st, ch, err := c.ExistsW(p)
	if err != nil || !ok || st.EphemeralOwner != 0 {
		t.Fatalf("exists %s on the follower: %v %+v %v", p, ok, st, err)
	}
	select {
	case e := <-ch:
		if e.Type != zk.EventNodeDeleted || e.Path != p {
			t.Fatalf("event %+v, want NodeDeleted %s", e, p)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the idle TTL node was not removed within 15s")
	}
	if ok, _, err := c.Exists("/keep"); err != nil || !ok {
		t.Fatalf("/keep removed (exists %v, %v)", ok, err)
	}
}
