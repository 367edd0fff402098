package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/store"
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
	stream := versionStream{&tcpStream{Listener: lis, advertise: lis.Addr()}}
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

// TestStartRefusedOnNewerFormats: a data directory holding a log entry or
// a snapshot of a newer format version than this build speaks (a
// downgrade below the cluster version) is refused at start with one line
// naming both versions; the node never starts on it.
func TestStartRefusedOnNewerFormats(t *testing.T) {
	newer := version.Protocol + 1
	want := []string{fmt.Sprintf("format version %d", newer), fmt.Sprintf("newer than this build speaks (up to %d)", version.Protocol)}
	t.Run("log entry", func(t *testing.T) {
		dir := t.TempDir()
		n := openRunning(t, Config{DataDir: dir})
		fill(t, n, 3)
		n.Close()
		stores, err := store.Open(filepath.Join(dir, "raft"), "", io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		last, err := stores.Log.LastIndex()
		if err != nil {
			t.Fatal(err)
		}
		data, err := fsm.EncodeEntryVersion(put("from-the-future"), newer, 0)
		if err != nil {
			t.Fatal(err)
		}
		var prev raft.Log
		if err := stores.Log.GetLog(last, &prev); err != nil {
			t.Fatal(err)
		}
		if err := stores.Log.StoreLog(&raft.Log{Index: last + 1, Term: prev.Term, Type: raft.LogCommand, Data: data}); err != nil {
			t.Fatal(err)
		}
		stores.Close()
		refused(t, dir, "", append(want, fmt.Sprintf("raft log entry %d", last+1))...)
	})
	t.Run("snapshot", func(t *testing.T) {
		dir, snap := snapshotted(t, "bolt")
		state := fsm.NewState().Export()
		state.FormatVersion, state.ClusterVersion = newer, newer
		b, err := proto.Marshal(state)
		if err != nil {
			t.Fatal(err)
		}
		replaceSnapshotState(t, snap, b)
		refused(t, dir, "bolt", append(want, "snapshot", snap)...)
	})
}
