package zkapi_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
)

// TestWireAnswers: requests the Go client does not send, answered byte
// for byte as ZooKeeper 3.8 answers them (FinalRequestProcessor).
func TestWireAnswers(t *testing.T) {
	_, addr := startNode(t, nil)
	setup, _ := connect(t, []string{addr}, 5*time.Second)
	if err := setup.AddAuth("digest", []byte("alice:pw")); err != nil {
		t.Fatal(err)
	}
	if _, err := setup.Create("/p", []byte("d"), 0, append(zk.DigestACL(zk.PermAll, "alice", "pw"), zk.WorldACL(zk.PermRead)...)); err != nil {
		t.Fatal(err)
	}
	if _, err := setup.Create("/p/a", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if _, err := setup.Create("/p/a/b", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	r := raw(t, addr)
	if got := r.connect(t, 0, make([]byte, 16), true); got.sessionID == 0 {
		t.Fatal("no session")
	}
	u32 := func(v int32) []byte { return binary.BigEndian.AppendUint32(nil, uint32(v)) }
	cases := []struct {
		name string
		op   int32
		body jute
		code int32
		want []byte // nil: not checked
	}{
		{"addWatch answers an ErrorResponse of 0", 106, jute{}.str("/p").int(1), 0, u32(0)},
		{"getAllChildrenNumber counts descendants", 104, jute{}.str("/p"), 0, u32(2)},
		{"getAllChildrenNumber of nothing", 104, jute{}.str("/nope"), -101, []byte{}},
		{"getEphemerals of a session without any", 103, jute{}.str("/"), 0, u32(0)},
		{"whoAmI names the ip", 107, jute{}, 0, append(append(u32(1), jute{}.str("ip")...), jute{}.str("127.0.0.1")...)},
		{"getACL masks digest ids without admin", 6, jute{}.str("/p"), 0, nil},
		{"exists of a path with NUL", 3, jute{}.str("/a\x00").bool(false), -8, []byte{}},
		{"getData of an invalid path is NoNode", 4, jute{}.str("/a/").bool(false), -101, []byte{}},
		{"createTTL is unimplemented", 21, jute{}.str("/t").int(0).int(0).int(5).append8(1000), -6, []byte{}},
		{"an unknown opcode", 77, jute{}, -6, []byte{}},
		{"sync answers its path", 9, jute{}.str("/p"), 0, jute{}.str("/p")},
		{"checkWatches finds the persistent watch", 17, jute{}.str("/p").int(3), 0, []byte{}},
		{"checkWatches without one", 17, jute{}.str("/p/a").int(3), -121, []byte{}},
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
			if c.op == 6 && !bytes.Contains(body, []byte("alice:x")) {
				t.Fatalf("getACL body %q does not mask alice's digest", body)
			}
		})
	}
	// A packet over jute.maxbuffer closes the connection.
	if _, err := r.nc.Write(binary.BigEndian.AppendUint32(nil, 8<<20)); err != nil {
		t.Fatal(err)
	}
	if !r.closed(t) {
		t.Fatal("a packet over jute.maxbuffer did not close the connection")
	}
}

// TestFourLetterWords: ruok, isro and srvr are answered, the others
// refused as ZooKeeper's default whitelist refuses them.
func TestFourLetterWords(t *testing.T) {
	_, addr := startNode(t, nil)
	for cmd, want := range map[string]string{"ruok": "imok", "isro": "rw", "srvr": "Mode: leader", "stat": "stat is not executed because it is not in the whitelist."} {
		r := raw(t, addr)
		if _, err := r.nc.Write([]byte(cmd)); err != nil {
			t.Fatal(err)
		}
		_ = r.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		got, _ := io.ReadAll(r.nc)
		if !bytes.Contains(got, []byte(want)) {
			t.Fatalf("%s: %q, want it to contain %q", cmd, got, want)
		}
	}
}

// TestCloseSessionIsAnswered: closeSession is answered before the
// connection closes (the session's end must not close the connection
// that asked for it first), on the leader and through a relay alike.
func TestCloseSessionIsAnswered(t *testing.T) {
	_, addr := startNode(t, nil)
	for i := range 5 {
		r := raw(t, addr)
		if got := r.connect(t, 0, make([]byte, 16), true); got.sessionID == 0 {
			t.Fatal("no session")
		}
		if code, _ := r.call(t, int32(i+1), -11, nil); code != 0 {
			t.Fatalf("closeSession: code %d", code)
		}
		if !r.closed(t) {
			t.Fatal("the connection stayed open after closeSession")
		}
	}
}
