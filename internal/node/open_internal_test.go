package node

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// TestWorkStartsInRun: Open starts none of the node's own goroutines; a
// proposal made before Run is queued, not committed, and is committed
// once Run starts; one still queued when Close comes without Run is
// answered ErrClosed (ProposeAsync's then is called exactly once).
func TestWorkStartsInRun(t *testing.T) {
	n, err := Open(Config{DataDir: t.TempDir(), LogOutput: io.Discard}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); n.raft.State() != raft.Leader; {
		if time.Now().After(deadline) {
			t.Fatal("no leadership")
		}
		time.Sleep(10 * time.Millisecond) // a poller with a deadline
	}
	put := &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: "k"}}}
	answered := make(chan error, 1)
	n.ProposeAsync(put, func(_ fsm.Result, err error) { answered <- err })
	if n.workStarted {
		t.Fatal("Open started the node's goroutines")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(ctx); close(done) }()
	select {
	case err := <-answered:
		if err != nil {
			t.Fatalf("a proposal queued before Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a proposal queued before Run was not committed once Run started")
	}
	cancel()
	<-done
	n.Close()

	n, err = Open(Config{DataDir: t.TempDir(), LogOutput: io.Discard}, nil)
	if err != nil {
		t.Fatal(err)
	}
	n.ProposeAsync(put, func(_ fsm.Result, err error) { answered <- err })
	n.Close()
	select {
	case err := <-answered:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("a proposal queued when Close came without Run: %v, want ErrClosed", err)
		}
	default:
		t.Fatal("a proposal queued when Close came without Run was never answered")
	}
}

// TestConfigValidate: every configuration that cannot work is refused by
// Validate, and by Open before it creates or opens anything (the data
// directory does not exist afterwards).
func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
		want string // "" valid
	}{
		{"defaults", Config{}, ""},
		{"cluster", Config{NodeID: "a", PeerAddr: "127.0.0.1:1", BootstrapPeers: map[string]string{"a": "127.0.0.1:1", "b": "127.0.0.1:2"}}, ""},
		{"join", Config{PeerAddr: "127.0.0.1:1", Join: true}, ""},
		{"lock history", Config{LockHistory: fsm.MaxHistoryLimit + 1}, "lock history"},
		{"op memory", Config{RegisterOpMemory: -1}, "operation memory"},
		{"join standalone", Config{Join: true}, "joining a cluster needs a peer address"},
		{"join bootstrap", Config{NodeID: "a", PeerAddr: "127.0.0.1:1", Join: true, BootstrapPeers: map[string]string{"a": "127.0.0.1:1"}}, "joining a cluster needs a peer address and no bootstrap peers"},
		{"bootstrap standalone", Config{NodeID: "a", BootstrapPeers: map[string]string{"a": "127.0.0.1:1"}}, "need a peer address"},
		{"bootstrap without self", Config{NodeID: "c", PeerAddr: "127.0.0.1:1", BootstrapPeers: map[string]string{"a": "127.0.0.1:1", "b": "127.0.0.1:2"}}, "does not name this node (c)"},
		{"bootstrap without default self", Config{PeerAddr: "127.0.0.1:1", BootstrapPeers: map[string]string{"a": "127.0.0.1:1"}}, "does not name this node (n1)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Validate()
			if c.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Validate: %v, want %q", err, c.want)
			}
			cfg := c.cfg
			cfg.DataDir, cfg.LogOutput = filepath.Join(t.TempDir(), "data"), io.Discard
			if n, err := Open(cfg, nil); err == nil {
				n.Close()
				t.Fatal("Open accepted it")
			} else if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Open: %v, want %q", err, c.want)
			}
			if _, err := os.Stat(cfg.DataDir); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("Open refused the configuration after creating the data directory (%v)", err)
			}
		})
	}
}

// TestFailedOpenReleasesPeerListener: an Open that fails after it bound
// the peer address (here raft's restore of a snapshot that does not
// decode) closes the listener as well as the stores: the address can be
// bound again, and the data directory opened again.
func TestFailedOpenReleasesPeerListener(t *testing.T) {
	dir, snap := snapshotted(t, "bolt")
	undecodable(t, snap)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	if _, err := Open(Config{DataDir: dir, LogStore: "bolt", PeerAddr: addr, LogOutput: io.Discard}, nil); err == nil || !strings.Contains(err.Error(), "does not decode") {
		t.Fatalf("Open: %v, want the snapshot refused", err)
	}
	l, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the peer address is still bound after a failed Open: %v", err)
	}
	l.Close()
	if err := openErr(dir, "bolt"); err == nil || !strings.Contains(err.Error(), "does not decode") {
		t.Fatalf("second Open: %v, want the snapshot refused again (stores closed)", err)
	}
}
