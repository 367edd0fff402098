package zkapi_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/testutil"
)

// ZooKeeper's opcodes the count tests send raw.
const (
	opCreateRaw         = 1
	opMultiRaw          = 14
	opGetEphemeralsRaw  = 103
	opGetAllChildrenRaw = 104
)

// createRaw is a create request body: an open ACL, flags.
func createRaw(path string, flags int32) jute {
	return jute{}.str(path).int(0).int(1).int(int32(zk.PermAll)).str("world").str("anyone").int(flags)
}

// allChildren asks getAllChildrenNumber of path on r.
func allChildren(t *testing.T, r *rawConn, xid int32, path string) int32 {
	t.Helper()
	code, body := r.call(t, xid, opGetAllChildrenRaw, jute{}.str(path))
	if code != 0 || len(body) != 4 {
		t.Fatalf("getAllChildrenNumber %s: code %d, body %x", path, code, body)
	}
	return int32(binary.BigEndian.Uint32(body))
}

// TestGetAllChildrenNumberCounts: getAllChildrenNumber answers the count
// of all descendants (the root's counts /zookeeper and its two
// children, as ZooKeeper 3.8's does) after creates, a multi, deletes and
// a session's end that removes its ephemerals.
func TestGetAllChildrenNumberCounts(t *testing.T) {
	_, addr := startNode(t, nil)
	c, _ := connect(t, []string{addr}, 5*time.Second)
	r := raw(t, addr)
	if got := r.connect(t, 0, make([]byte, 16), true); got.sessionID == 0 {
		t.Fatal("no session")
	}
	xid := int32(0)
	expect := func(when string, want map[string]int32) {
		t.Helper()
		for p, w := range want {
			xid++
			if got := allChildren(t, r, xid, p); got != w {
				t.Fatalf("%s: getAllChildrenNumber(%s) = %d, want %d", when, p, got, w)
			}
		}
	}
	expect("a new tree", map[string]int32{"/": 3, "/zookeeper": 2, "/zookeeper/config": 0})
	acl := zk.WorldACL(zk.PermAll)
	for _, p := range []string{"/a", "/a/b", "/a/b/c", "/x"} {
		if _, err := c.Create(p, nil, 0, acl); err != nil {
			t.Fatal(err)
		}
	}
	eph, _ := connect(t, []string{addr}, 5*time.Second)
	for _, p := range []string{"/a/b/e1", "/a/b/e2", "/x/e3"} {
		if _, err := eph.Create(p, nil, zk.FlagEphemeral, acl); err != nil {
			t.Fatal(err)
		}
	}
	expect("after creates", map[string]int32{"/": 10, "/a": 4, "/a/b": 3, "/a/b/c": 0, "/x": 1})
	if _, err := c.Multi(&zk.DeleteRequest{Path: "/a/b/c", Version: -1}, &zk.CreateRequest{Path: "/a/b/c", Acl: acl},
		&zk.CreateRequest{Path: "/a/b/c/d", Acl: acl}, &zk.CreateRequest{Path: "/y", Acl: acl}); err != nil {
		t.Fatal(err)
	}
	expect("after a multi", map[string]int32{"/": 12, "/a": 5, "/a/b": 4, "/a/b/c": 1})
	eph.Close()
	testutil.WaitFor(t, "the closed session's ephemerals uncounted", 10*time.Second, func() bool {
		xid++
		return allChildren(t, r, xid, "/") == 9
	})
	expect("after the session's end", map[string]int32{"/a": 3, "/a/b": 2, "/x": 0})
	if err := c.Delete("/a/b/c/d", -1); err != nil {
		t.Fatal(err)
	}
	expect("after a delete", map[string]int32{"/": 8, "/a": 2, "/a/b": 1, "/a/b/c": 0})
}

// TestGetEphemeralsPrefix: getEphemerals answers the session's own
// ephemerals under a prefix, sorted, read from its index; one whose
// answer would pass jute.maxbuffer closes the connection (as a client
// closes one that sends it a longer packet) and leaves the session,
// which a narrower prefix is still answered on.
func TestGetEphemeralsPrefix(t *testing.T) {
	_, addr := startNode(t, nil)
	c, _ := connect(t, []string{addr}, 5*time.Second)
	for _, p := range []string{"/e", "/f"} {
		if _, err := c.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
	}
	r := raw(t, addr)
	sess := r.connect(t, 0, make([]byte, 16), true)
	if sess.sessionID == 0 {
		t.Fatal("no session")
	}
	xid := int32(0)
	// 270 ephemerals of 4,000-byte paths under /e (an answer of about
	// 1,080,000 bytes, past jute.maxbuffer), in multis of 10; 3 under /f.
	long := strings.Repeat("n", 3990)
	for i := 0; i < 270; i += 10 {
		var m jute
		for j := i; j < i+10; j++ {
			m = m.int(opCreateRaw).bool(false).int(-1).append(createRaw(fmt.Sprintf("/e/%s%04d", long, j), 1))
		}
		m = m.int(-1).bool(true).int(-1)
		xid++
		if code, _ := r.call(t, xid, opMultiRaw, m); code != 0 {
			t.Fatalf("multi %d: code %d", i, code)
		}
	}
	for _, p := range []string{"/f/b", "/f/a", "/f/c"} {
		xid++
		if code, _ := r.call(t, xid, opCreateRaw, createRaw(p, 1)); code != 0 {
			t.Fatalf("create %s: code %d", p, code)
		}
	}
	xid++
	code, body := r.call(t, xid, opGetEphemeralsRaw, jute{}.str("/f/"))
	if want := (jute{}).strs("/f/a", "/f/b", "/f/c"); code != 0 || !bytes.Equal(body, want) {
		t.Fatalf("getEphemerals /f/: code %d, %q, want %q", code, body, want)
	}
	xid++
	code, body = r.call(t, xid, opGetEphemeralsRaw, jute{}.str("/e/"+long+"012"))
	want := jute{}.int(10)
	for j := 120; j < 130; j++ {
		want = want.str(fmt.Sprintf("/e/%s%04d", long, j))
	}
	if code != 0 || !bytes.Equal(body, want) {
		t.Fatalf("getEphemerals of a prefix matching 10: code %d, %d bytes, want %d", code, len(body), len(want))
	}
	xid++
	req := jute{}.int(0).int(xid).int(opGetEphemeralsRaw).str("/")
	binary.BigEndian.PutUint32(req, uint32(len(req)-4))
	if _, err := r.nc.Write(req); err != nil {
		t.Fatal(err)
	}
	if !r.closed(t) {
		t.Fatal("a getEphemerals answer past jute.maxbuffer did not close the connection")
	}
	r2 := raw(t, addr)
	if again := r2.connect(t, sess.sessionID, sess.passwd, true); again.sessionID != sess.sessionID {
		t.Fatalf("resuming the session: %+v", again)
	}
	code, body = r2.call(t, 1, opGetEphemeralsRaw, jute{}.str("/f"))
	if want := (jute{}).strs("/f/a", "/f/b", "/f/c"); code != 0 || !bytes.Equal(body, want) {
		t.Fatalf("getEphemerals /f on the resumed session: code %d, %q, want %q", code, body, want)
	}
}

// BenchmarkSetDataWhileCounting is a setData's latency on a tree of
// 100,000 znodes while 32 other connections ask getAllChildrenNumber of
// the root in a loop: the reads hold the state the writes are applied
// to, so what one costs, every write waits for. It reports the slowest
// setData (max-ms) and the reads answered per second (counts/s).
func BenchmarkSetDataWhileCounting(b *testing.B) {
	cfg := daemon.Config{NodeID: "n1", DataDir: filepath.Join(b.TempDir(), "n1"), Listen: "127.0.0.1:0", ZkListen: "127.0.0.1:0",
		ZkMaxClientCnxns: -1, LogOutput: io.Discard}
	d := runDaemon(b, cfg)
	// ctx stops the counting connections.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	<-d.Ready()
	c, _, err := zk.Connect([]string{d.ZkAddr()}, 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	acl := zk.WorldACL(zk.PermAll)
	for i := range 100 {
		p := fmt.Sprintf("/p%03d", i)
		if _, err := c.Create(p, nil, 0, acl); err != nil {
			b.Fatal(err)
		}
		ops := make([]any, 0, 999)
		for j := range 999 {
			ops = append(ops, &zk.CreateRequest{Path: fmt.Sprintf("%s/c%04d", p, j), Acl: acl})
		}
		if _, err := c.Multi(ops...); err != nil {
			b.Fatal(err)
		}
	}
	var counts atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		nc, err := net.Dial("tcp", d.ZkAddr())
		if err != nil {
			b.Fatal(err)
		}
		defer nc.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			read := func() error {
				var lenb [4]byte
				if _, err := io.ReadFull(nc, lenb[:]); err != nil {
					return err
				}
				_, err := io.CopyN(io.Discard, nc, int64(binary.BigEndian.Uint32(lenb[:])))
				return err
			}
			if _, err := nc.Write(connectPacket()); err != nil || read() != nil {
				return
			}
			for xid := int32(1); ctx.Err() == nil; xid++ {
				if _, err := nc.Write(frame(jute{}.int(xid).int(opGetAllChildrenRaw).str("/"))); err != nil || read() != nil {
					return
				}
				counts.Add(1)
			}
		}()
	}
	var slowest time.Duration
	start := time.Now()
	for b.Loop() {
		t0 := time.Now()
		if _, err := c.Set("/p000", []byte("v"), -1); err != nil {
			b.Fatal(err)
		}
		slowest = max(slowest, time.Since(t0))
	}
	b.ReportMetric(float64(slowest.Microseconds())/1000, "max-ms")
	b.ReportMetric(float64(counts.Load())/time.Since(start).Seconds(), "counts/s")
	cancel()
	c.Close()
	wg.Wait()
}
