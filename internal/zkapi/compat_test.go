package zkapi_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestSequentialNumbersSurviveDeletes: a sequential suffix counts the
// children ever created under the parent, which a delete leaves (as
// ZooKeeper 3.8 numbers them), inside a multi too; the reported cversion
// counts creations and deletions.
func TestSequentialNumbersSurviveDeletes(t *testing.T) {
	_, addr := startNode(t, nil)
	c, _ := connect(t, []string{addr}, 5*time.Second)
	acl := zk.WorldACL(zk.PermAll)
	for _, p := range []string{"/q", "/q/x"} {
		if _, err := c.Create(p, nil, 0, acl); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Delete("/q/x", -1); err != nil {
		t.Fatal(err)
	}
	p, err := c.Create("/q/s-", nil, zk.FlagSequence, acl)
	if err != nil || p != "/q/s-0000000001" {
		t.Fatalf("sequential create after a delete: %q %v, want /q/s-0000000001", p, err)
	}
	_, st, err := c.Children("/q")
	// Two creations, one deletion: ZooKeeper reports 2*2 - 1 children.
	if err != nil || st.Cversion != 3 || st.NumChildren != 1 {
		t.Fatalf("children stat %+v %v, want cversion 3, numChildren 1", st, err)
	}
	res, err := c.Multi(&zk.CreateRequest{Path: "/q/m-", Acl: acl, Flags: zk.FlagSequence}, &zk.CreateRequest{Path: "/q/m-", Acl: acl, Flags: zk.FlagSequence})
	if err != nil || len(res) != 2 || res[0].String != "/q/m-0000000002" || res[1].String != "/q/m-0000000003" {
		t.Fatalf("sequential creates in a multi: %+v %v, want m-0000000002 and m-0000000003", res, err)
	}
	if err := c.Delete("/q/m-0000000003", -1); err != nil {
		t.Fatal(err)
	}
	if _, st, err = c.Exists("/q"); err != nil || st.Cversion != 2*4-2 {
		t.Fatalf("stat after 4 creations and 2 deletions: %+v %v, want cversion 6", st, err)
	}
	// The root's first sequential child is numbered from the root's
	// creations (none: /zookeeper is not created by a client).
	p, err = c.Create("/r-", nil, zk.FlagSequence, acl)
	if err != nil || p != "/r-0000000001" {
		t.Fatalf("sequential create under / after /q: %q %v, want /r-0000000001", p, err)
	}
}

// TestContainerOwnerIsZero: a container reports ephemeralOwner 0, as
// ZooKeeper 3.8 reports it.
func TestContainerOwnerIsZero(t *testing.T) {
	_, addr := startNode(t, nil)
	c, _ := connect(t, []string{addr}, 5*time.Second)
	if _, err := c.CreateContainer("/box", nil, zk.FlagContainer, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	_, st, err := c.Get("/box")
	if err != nil || st.EphemeralOwner != 0 {
		t.Fatalf("container stat %+v %v, want ephemeralOwner 0", st, err)
	}
}

// TestWireCreates: create and multi answers, byte for byte as ZooKeeper
// 3.8 gives them: a path is checked in ZooKeeper's order (the parent's
// existence before the path's validity), and a create2 in a multi
// answers as a create (its path alone).
func TestWireCreates(t *testing.T) {
	_, addr := startNode(t, nil)
	r := raw(t, addr)
	if got := r.connect(t, 0, make([]byte, 16), true); got.sessionID == 0 {
		t.Fatal("no session")
	}
	open := jute{}.int(1).int(31).str("world").str("anyone")
	create := func(path string) jute { return jute{}.str(path).int(-1).append(open).int(0) }
	mcreate := func(op int32, path string, flags int32) jute {
		return jute{}.int(op).bool(false).int(-1).str(path).str("d").append(open).int(flags)
	}
	end := jute{}.int(-1).bool(true).int(-1)
	cases := []struct {
		name string
		op   int32
		body jute
		code int32
		want []byte // nil: not checked
	}{
		{"create /r", 1, create("/r"), 0, jute{}.str("/r")},
		{"create /r/ is BadArguments", 1, create("/r/"), -8, []byte{}},
		{"create /r//x has no parent /r/", 1, create("/r//x"), -101, []byte{}},
		{"create /r/./x has no parent /r/.", 1, create("/r/./x"), -101, []byte{}},
		{"create /r/x/.. has no parent /r/x", 1, create("/r/x/.."), -101, []byte{}},
		{"create without a slash", 1, create("r"), -8, []byte{}},
		{"create with a NUL", 1, create("/r/\x00"), -8, []byte{}},
		{"create / exists", 1, create("/"), -110, []byte{}},
		{"create /r/ok", 1, create("/r/ok"), 0, jute{}.str("/r/ok")},
		{"getData /r/ok/ is NoNode", 4, jute{}.str("/r/ok/").bool(false), -101, []byte{}},
		{"a create2 in a multi answers as a create", 14, jute{}.append(mcreate(15, "/r/m2", 0)).append(end), 0,
			jute{}.int(1).bool(false).int(0).str("/r/m2").append(end)},
		{"a create in a multi", 14, jute{}.append(mcreate(1, "/r/m1", 0)).append(end), 0,
			jute{}.int(1).bool(false).int(0).str("/r/m1").append(end)},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, body := r.call(t, int32(i+1), c.op, c.body)
			if code != c.code {
				t.Fatalf("code %d, want %d", code, c.code)
			}
			if c.want != nil && !bytes.Equal(body, c.want) {
				t.Fatalf("body %x, want %x", body, c.want)
			}
		})
	}
	// A container in a multi answers as a create2: its path and stat
	// (68 bytes), with ephemeralOwner 0.
	code, body := r.call(t, 100, 14, jute{}.append(mcreate(19, "/r/box", 4)).append(end))
	head := jute{}.int(15).bool(false).int(0).str("/r/box")
	if code != 0 || len(body) != len(head)+68+len(end) || !bytes.Equal(body[:len(head)], head) {
		t.Fatalf("container in a multi: code %d body %x", code, body)
	}
	if owner := binary.BigEndian.Uint64(body[len(head)+44:]); owner != 0 {
		t.Fatalf("container in a multi: ephemeralOwner %#x, want 0", owner)
	}
}

// TestOversizePacketKeepsTheSession: a request packet over
// jute.maxbuffer (1 MiB - 1), as a setData of 1 MiB is, closes the
// connection, as ZooKeeper closes it; the session stays, and resumes on
// another connection with its data unchanged.
func TestOversizePacketKeepsTheSession(t *testing.T) {
	_, addr := startNode(t, nil)
	r := raw(t, addr)
	got := r.connect(t, 0, make([]byte, 16), true)
	if got.sessionID == 0 {
		t.Fatal("no session")
	}
	if code, _ := r.call(t, 1, 1, jute{}.str("/big").int(1).append([]byte("a")).int(1).int(31).str("world").str("anyone").int(1)); code != 0 {
		t.Fatalf("create /big (ephemeral): code %d", code)
	}
	big := make([]byte, 1<<20)
	body := jute{}.str("/big").int(int32(len(big))).append(big).int(-1)
	var b []byte
	b = binary.BigEndian.AppendUint32(b, uint32(len(body)+8))
	b = binary.BigEndian.AppendUint32(b, 2)
	b = binary.BigEndian.AppendUint32(b, 5)
	// The server closes with the packet unread: the write may fail, and
	// the read sees EOF or a reset, never an answer or a timeout.
	_, _ = r.nc.Write(append(b, body...))
	_ = r.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := r.nc.Read(make([]byte, 1))
	var ne net.Error
	if n > 0 || err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("a setData of 1 MiB did not close the connection: read %d bytes, %v", n, err)
	}
	r2 := raw(t, addr)
	again := r2.connect(t, got.sessionID, got.passwd, true)
	if again.sessionID != got.sessionID || again.timeout <= 0 {
		t.Fatalf("resuming the session: %+v, want session %#x", again, got.sessionID)
	}
	code, resp := r2.call(t, 1, 4, jute{}.str("/big").bool(false))
	if code != 0 || !bytes.HasPrefix(resp, jute{}.str("a")) {
		t.Fatalf("getData /big after the closed connection: code %d %x, want the session's ephemeral with data a", code, resp)
	}
}

func (j jute) append(b []byte) jute { return append(j, b...) }

// TestContainerStaysUntilTheCheck: a container whose last child is
// deleted stays until the leader's container check, so a client may
// still create under it (Curator's lock recipes create the parent, then
// their node: removing the parent with another client's last child made
// that create fail with NoNode).
func TestContainerStaysUntilTheCheck(t *testing.T) {
	_, addr := startNode(t, func(cfg *daemon.Config) { cfg.ZkContainerCheckInterval = time.Hour })
	c, _ := connect(t, []string{addr}, 5*time.Second)
	if _, err := c.CreateContainer("/lock", nil, zk.FlagContainer, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		node := fmt.Sprintf("/lock/n%d", i)
		if _, err := c.Create(node, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatalf("create %s after the last child went: %v", node, err)
		}
		if err := c.Delete(node, -1); err != nil {
			t.Fatal(err)
		}
	}
	if ok, _, err := c.Exists("/lock"); err != nil || !ok {
		t.Fatalf("the emptied container is gone before the check (exists %v, %v)", ok, err)
	}
}

// TestContainerCheck: with a short --zk-container-check-interval the
// leader removes an emptied container; one that never had a child stays,
// and so does one that got a new child before the check.
func TestContainerCheck(t *testing.T) {
	_, addr := startNode(t, func(cfg *daemon.Config) { cfg.ZkContainerCheckInterval = 100 * time.Millisecond })
	c, _ := connect(t, []string{addr}, 5*time.Second)
	for _, p := range []string{"/used", "/never", "/refilled"} {
		if _, err := c.CreateContainer(p, nil, zk.FlagContainer, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"/used/x", "/refilled/x"} {
		if _, err := c.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
	}
	// /refilled's last child is replaced in one multi: no check sees it
	// empty.
	if _, err := c.Multi(&zk.DeleteRequest{Path: "/refilled/x", Version: -1},
		&zk.CreateRequest{Path: "/refilled/y", Acl: zk.WorldACL(zk.PermAll)}); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete("/used/x", -1); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the emptied container removed", 10*time.Second, func() bool {
		ok, _, err := c.Exists("/used")
		return err == nil && !ok
	})
	for _, p := range []string{"/never", "/refilled"} {
		if ok, _, err := c.Exists(p); err != nil || !ok {
			t.Fatalf("%s removed too (exists %v, %v)", p, ok, err)
		}
	}
}

// TestWireNullData: a znode created or set with null data (length -1)
// answers getData with null data, as ZooKeeper 3.8 does; one with empty
// data with an empty buffer. The stat's dataLength is 0 for both.
func TestWireNullData(t *testing.T) {
	_, addr := startNode(t, nil)
	r := raw(t, addr)
	if got := r.connect(t, 0, make([]byte, 16), true); got.sessionID == 0 {
		t.Fatal("no session")
	}
	open := jute{}.int(1).int(31).str("world").str("anyone")
	getData := func(xid int32, path string) (length int32, dataLength int32) {
		t.Helper()
		code, body := r.call(t, xid, 4, jute{}.str(path).bool(false))
		if code != 0 || len(body) < 4 {
			t.Fatalf("getData %s: code %d body %x", path, code, body)
		}
		length = int32(binary.BigEndian.Uint32(body))
		stat := body[4+max(length, 0):]
		return length, int32(binary.BigEndian.Uint32(stat[52:])) // after the zxids, times, versions and owner
	}
	steps := []struct {
		name string
		op   int32
		body jute
	}{
		{"create /null with null data", 1, jute{}.str("/null").int(-1).append(open).int(0)},
		{"create /empty with empty data", 1, jute{}.str("/empty").int(0).append(open).int(0)},
		{"create /set with data", 1, jute{}.str("/set").str("x").append(open).int(0)},
		{"setData /set to null", 5, jute{}.str("/set").int(-1).int(-1)},
	}
	for i, s := range steps {
		if code, body := r.call(t, int32(i+1), s.op, s.body); code != 0 {
			t.Fatalf("%s: code %d body %x", s.name, code, body)
		}
	}
	for i, c := range []struct {
		path string
		want int32
	}{{"/null", -1}, {"/empty", 0}, {"/set", -1}} {
		if length, dl := getData(int32(10+i), c.path); length != c.want || dl != 0 {
			t.Fatalf("getData %s: data length %d, stat dataLength %d; want %d and 0", c.path, length, dl, c.want)
		}
	}
}
