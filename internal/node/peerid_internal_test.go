package node

import (
	"errors"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// answerHeartbeats answers every AppendEntries t receives with success.
func answerHeartbeats(t *testing.T, trans raft.Transport) {
	go func() {
		for rpc := range trans.Consumer() {
			rpc.Respond(&raft.AppendEntriesResponse{Success: true, LastLog: 7}, nil)
		}
	}()
}

func identityTransport(t *testing.T, node string, cluster []byte) (*raft.NetworkTransport, *[]error) {
	t.Helper()
	id := &identity{path: filepath.Join(t.TempDir(), identityFile), node: node, cluster: cluster, kick: make(chan struct{}, 1)}
	stream, err := newTCPStream("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	var refused []error
	nt := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  newIdentityStream(stream, id, func(err error, _ bool) { refused = append(refused, err) }),
		MaxPool: 2, Timeout: 5 * time.Second, Logger: hclog.New(&hclog.LoggerOptions{Output: io.Discard}),
	})
	t.Cleanup(func() { nt.Close() })
	return nt, &refused
}

func heartbeat(from, to *raft.NetworkTransport) error {
	var resp raft.AppendEntriesResponse
	err := from.AppendEntries("peer", to.LocalAddr(), &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("x"), Addr: []byte(from.LocalAddr())}, Term: 1}, &resp)
	if err == nil && resp.LastLog != 7 {
		err = errors.New("no answer")
	}
	return err
}

// TestIdentityHandshakeBesidePreviousRelease: a node with the handshake
// and one of a release without it (raft's plain TCP transport) talk in
// both directions, as a rolling upgrade needs; two nodes with the
// handshake talk when their cluster is the same or one does not know it
// yet, and are refused otherwise.
func TestIdentityHandshakeBesidePreviousRelease(t *testing.T) {
	old, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, 5*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { old.Close() })
	answerHeartbeats(t, old)
	a, _ := identityTransport(t, "a", []byte("cluster-A-000000"))
	answerHeartbeats(t, a)
	for range 2 { // the second dial goes without the hello at once
		if err := heartbeat(a, old); err != nil {
			t.Fatalf("new to previous release: %v", err)
		}
	}
	if err := heartbeat(old, a); err != nil {
		t.Fatalf("previous release to new: %v", err)
	}

	b, refusedB := identityTransport(t, "b", []byte("cluster-B-000000"))
	answerHeartbeats(t, b)
	if err := heartbeat(a, b); !errors.Is(err, ErrOtherCluster) {
		t.Fatalf("cluster A to cluster B: %v, want ErrOtherCluster", err)
	}
	if len(*refusedB) != 1 || !errors.Is((*refusedB)[0], ErrOtherCluster) {
		t.Fatalf("cluster B's refusals: %v", *refusedB)
	}
	a2, _ := identityTransport(t, "a2", []byte("cluster-A-000000"))
	answerHeartbeats(t, a2)
	if err := heartbeat(a, a2); err != nil {
		t.Fatalf("within cluster A: %v", err)
	}
	fresh, _ := identityTransport(t, "new", nil)
	answerHeartbeats(t, fresh)
	if err := heartbeat(a, fresh); err != nil {
		t.Fatalf("cluster A to a new node: %v", err)
	}
	if err := heartbeat(b, fresh); !errors.Is(err, ErrOtherCluster) {
		t.Fatalf("cluster B to a node that learned cluster A: %v, want ErrOtherCluster", err)
	}
}
