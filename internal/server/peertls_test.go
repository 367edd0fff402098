package server_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/testutil"
	"github.com/tenure-io/tenure/internal/tlsconfig"
)

// peerFiles writes a peer certificate for 127.0.0.1 issued by ca, and the
// CA, into dir; it returns the files of a peer TLS configuration.
func peerFiles(t *testing.T, dir, name string, ca *tlsconfig.CA) tlsconfig.Files {
	t.Helper()
	leaf, err := ca.Issue(name, []string{"127.0.0.1"}, tlsconfig.ServerAuth|tlsconfig.ClientAuth, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f := tlsconfig.Files{Cert: filepath.Join(dir, name+".pem"), Key: filepath.Join(dir, name+"-key.pem"), CA: filepath.Join(dir, name+"-ca.pem")}
	for file, data := range map[string][]byte{f.Cert: leaf.CertPEM, f.Key: leaf.KeyPEM, f.CA: ca.PEM} {
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// startDaemon runs cfg until the test ends (without waiting for Ready).
func startDaemon(t *testing.T, cfg daemon.Config) *member {
	t.Helper()
	cfg.Listen, cfg.LogOutput = "127.0.0.1:0", testutil.LogWriter(t, cfg.NodeID)
	d, err := daemon.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	m := &member{id: cfg.NodeID, peer: cfg.PeerListen, d: d}
	stopped := false
	m.stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(m.stop)
	return m
}

// TestPeerMutualTLS: three members whose raft traffic is mutual TLS elect
// a leader and replicate; a member whose certificate comes from another
// CA, and one that speaks plaintext raft, cannot join: the leader's probe
// of them fails, and the configuration is unchanged.
func TestPeerMutualTLS(t *testing.T) {
	testutil.Slow(t)
	root := t.TempDir()
	ca, err := tlsconfig.NewCA("peers", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	peers := map[string]string{}
	for i := 1; i <= 3; i++ {
		peers[fmt.Sprint("n", i)] = freePort(t)
	}
	var ms []*member
	for i := 1; i <= 3; i++ {
		id := fmt.Sprint("n", i)
		r, err := tlsconfig.New(peerFiles(t, root, id, ca), tlsconfig.Peer, nil)
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, startDaemon(t, daemon.Config{NodeID: id, DataDir: filepath.Join(root, id), PeerListen: peers[id], BootstrapPeers: peers, PeerTLS: r.Config}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusterClient(t, ms)
	wantWrites(t, ctx, c)
	if _, err := c.Put(ctx, "replicated", []byte("v")); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms { // every member applied it: raft replicated over TLS
		local := testutil.Dial(t, m.d.Addr(), client.WithSerializableReads())
		deadline := time.Now().Add(30 * time.Second)
		for {
			kv, err := local.Get(ctx, "replicated")
			if err == nil && len(kv.KVs) == 1 && string(kv.KVs[0].Value) == "v" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never applied the write: %v %v", m.id, kv, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	otherCA, err := tlsconfig.NewCA("intruders", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := tlsconfig.New(peerFiles(t, root, "n4", otherCA), tlsconfig.Peer, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []daemon.Config{
		{NodeID: "n4", DataDir: filepath.Join(root, "n4"), PeerListen: freePort(t), PeerTLS: foreign.Config}, // another CA
		{NodeID: "n5", DataDir: filepath.Join(root, "n5"), PeerListen: freePort(t)},                          // plaintext
	} {
		m := startDaemon(t, cfg)
		<-m.d.Ready() // a standalone member of its own
		_, err := c.AddMember(ctx, cfg.NodeID, cfg.PeerListen, true)
		if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "did not answer") {
			t.Fatalf("add of %s: %v, want it refused: its raft traffic does not pass mutual TLS", cfg.NodeID, err)
		}
		if voters, _ := voterIDs(t, ctx, c); len(voters) != 3 {
			t.Fatalf("voters after a refused add: %v", voters)
		}
	}
	wantWrites(t, ctx, c)
}
