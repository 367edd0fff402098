package node

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/version"
)

// TestVersionProbe: a member's peer listener answers a version probe with
// its protocol and hands every other connection to raft byte for byte; a
// listener of a release before versions, which closes the connection at
// the unknown first byte, counts as version 1; nothing listening is no
// answer at all (the version is not raised past it).
func TestVersionProbe(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stream := versionStream{&plainStream{Listener: lis, advertise: lis.Addr()}}
	defer stream.Close()
	raftSaw := make(chan []byte, 4)
	go func() { // raft's side: read each connection until it ends
		for {
			c, err := stream.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b, _ := io.ReadAll(c)
				raftSaw <- b
			}()
		}
	}()
	n := &Node{cfg: Config{NodeID: "a"}, peerStream: stream}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	v, err := n.probeVersion(ctx, "b", lis.Addr().String())
	if err != nil || v.Protocol != version.Protocol || v.MinProtocol != version.MinProtocol || v.Release != version.String() {
		t.Fatalf("probe of a member of this build: %+v, %v", v, err)
	}
	if b := <-raftSaw; len(b) != 0 {
		t.Fatalf("raft saw %q of a version probe", b)
	}
	// Raft's own traffic passes untouched.
	c, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte{0, 1, 2, 'T'})
	c.Close()
	if b := <-raftSaw; string(b) != "\x00\x01\x02T" {
		t.Fatalf("raft saw %q, want the bytes sent", b)
	}

	// A release before versions: raft reads the unknown RPC type and
	// closes the connection.
	old, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	go func() {
		for {
			c, err := old.Accept()
			if err != nil {
				return
			}
			var b [1]byte
			c.Read(b[:])
			c.Close()
		}
	}()
	if v, err := n.probeVersion(ctx, "c", old.Addr().String()); err != nil || v.Protocol != 1 {
		t.Fatalf("probe of a release before versions: %+v, %v, want protocol 1", v, err)
	}

	// Nothing listening: no version.
	gone := old.Addr().String()
	old.Close()
	if v, err := n.probeVersion(ctx, "d", gone); !errors.Is(err, ErrPeerUnreachable) {
		t.Fatalf("probe of nothing: %+v, %v, want ErrPeerUnreachable", v, err)
	}
	vs := n.MemberVersions(ctx, []Member{{ID: "a"}, {ID: "b", PeerAddr: lis.Addr().String()}, {ID: "d", PeerAddr: gone}})
	if vs["a"].Protocol != version.Protocol || vs["b"].Protocol != version.Protocol || len(vs) != 2 {
		t.Fatalf("MemberVersions: %+v", vs)
	}
}
