package zkapi_test

import (
	"encoding/binary"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/testutil"
)

// frame prefixes b with its length, as a ZooKeeper packet.
func frame(b []byte) []byte { return append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...) }

// connectPacket is a ConnectRequest for a new session.
func connectPacket() []byte {
	var b jute
	b = b.int(0).append8(0).int(30000).append8(0).int(16)
	b = append(b, make([]byte, 16)...)
	return frame(append(b, 0))
}

// FuzzConnection: whatever bytes a client sends on a new connection
// (the handshake, then requests), the node neither panics nor stops
// serving: after each input a four-letter word is still answered.
func FuzzConnection(f *testing.F) {
	request := func(xid, op int32, body jute) []byte {
		return frame(append(jute{}.int(xid).int(op), body...))
	}
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 44, 0, 0})
	f.Add([]byte("ruok"))
	f.Add([]byte{0x7f, 0xff, 0xff, 0xff})
	f.Add(connectPacket())
	f.Add(append(connectPacket(), request(1, 1, jute{}.str("/a").int(-1).int(1).int(31).str("world").str("anyone").int(0))...))
	f.Add(append(connectPacket(), request(1, 14, jute{}.int(1).bool(false).int(-1).str("/m").int(0).int(0).int(0).int(-1).bool(true).int(-1))...))
	f.Add(append(connectPacket(), request(-8, 105, jute{}.append8(0).int(0x7fffffff))...))
	f.Add(append(connectPacket(), request(1, 22, jute{}.int(4).bool(false).int(-1).str("/").bool(false).int(-1).bool(true).int(-1))...))
	f.Add(append(connectPacket(), request(-4, 100, jute{}.int(0).str("digest").str("u:p"))...))
	f.Add(append(connectPacket(), request(1, 106, jute{}.str("/").int(1))...))
	f.Add(append(connectPacket(), request(1, -11, nil)...))

	cfg := daemon.Config{NodeID: "n1", DataDir: filepath.Join(f.TempDir(), "n1"), Listen: "127.0.0.1:0",
		ZkListen: "127.0.0.1:0", ZkMinSessionTimeout: time.Second, ZkMaxSessionTimeout: 20 * time.Second, LogOutput: io.Discard}
	d := runDaemon(f, cfg)
	select {
	case <-d.Ready():
	case <-time.After(30 * time.Second):
		f.Fatal("not ready")
	}
	addr := d.ZkAddr()
	f.Fuzz(func(t *testing.T, in []byte) {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = nc.SetDeadline(time.Now().Add(300 * time.Millisecond))
		_, _ = nc.Write(in)
		_, _ = io.Copy(io.Discard, nc)
		nc.Close()
		testutil.WaitFor(t, "the node still answering", 10*time.Second, func() bool {
			nc, err := net.Dial("tcp", addr)
			if err != nil {
				return false
			}
			defer nc.Close()
			_ = nc.SetDeadline(time.Now().Add(2 * time.Second))
			if _, err := nc.Write([]byte("ruok")); err != nil {
				return false
			}
			got, _ := io.ReadAll(nc)
			return string(got) == "imok"
		})
	})
}
