package etcdapi_test

import (
	"context"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestStreamsThatRequireALeaderEndWithoutOne: on a node that loses its
// leader (the other voter of two stops), a watch opened with
// clientv3.WithRequireLeader (the hasleader metadata) ends with etcd's
// "no leader", so that its client goes on at another endpoint, as etcd
// does; a watch without it stays open. The node's /health turns from
// healthy to etcd's "RAFT NO LEADER".
func TestStreamsThatRequireALeaderEndWithoutOne(t *testing.T) {
	root := t.TempDir()
	peers := map[string]string{"n1": testutil.FreeAddr(t, 61000, 65000), "n2": testutil.FreeAddr(t, 61000, 65000)}
	daemons := map[string]*daemon.Daemon{}
	stops := map[string]func(){}
	for _, id := range []string{"n1", "n2"} {
		d, err := daemon.Start(daemon.Config{NodeID: id, DataDir: filepath.Join(root, id), Listen: "127.0.0.1:0", HTTPListen: "",
			EtcdListen: "127.0.0.1:0", PeerListen: peers[id], BootstrapPeers: peers, LogOutput: testutil.LogWriter(t, id)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		stopped := false
		stops[id] = func() {
			if !stopped {
				stopped = true
				cancel()
				<-done
			}
		}
		t.Cleanup(stops[id])
		daemons[id] = d
	}
	for id, d := range daemons {
		select {
		case <-d.Ready():
		case <-time.After(30 * time.Second):
			t.Fatalf("%s not ready", id)
		}
	}
	leader, follower := "n1", "n2"
	if daemons["n2"].Node.IsLeader() {
		leader, follower = "n2", "n1"
	}
	conn, err := grpc.NewClient(daemons[follower].EtcdAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	watch := func(ctx context.Context) <-chan error {
		w, err := pb.NewWatchClient(conn).Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		create(t, w, &pb.WatchCreateRequest{Key: []byte("k")})
		ended := make(chan error, 1)
		go func() {
			for {
				if _, err := w.Recv(); err != nil {
					ended <- err
					return
				}
			}
		}()
		return ended
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	required := watch(metadata.AppendToOutgoingContext(ctx, rpctypes.MetadataRequireLeaderKey, rpctypes.MetadataHasLeader))
	plain := watch(ctx)

	// /health on the follower: healthy once the leader answers it (its
	// etcd address published).
	health := http1(daemons[follower].EtcdAddr())
	testutil.WaitFor(t, "/health on the follower: healthy", 20*time.Second, func() bool {
		resp, b := health.do(t, http.MethodGet, "/health", nil)
		return resp.StatusCode == http.StatusOK && sameJSON(b, `{"health":"true","reason":""}`)
	})

	stops[leader]()
	// Then unhealthy, as etcd: 503 and "RAFT NO LEADER" once the follower
	// knows no leader; ?serializable=true only asks whether it answers.
	testutil.WaitFor(t, "/health: RAFT NO LEADER", 20*time.Second, func() bool {
		resp, b := health.do(t, http.MethodGet, "/health", nil)
		return resp.StatusCode == http.StatusServiceUnavailable && sameJSON(b, `{"health":"false","reason":"RAFT NO LEADER"}`)
	})
	if resp, b := health.do(t, http.MethodGet, "/health?serializable=true", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("/health?serializable=true without a leader: %d %s", resp.StatusCode, b)
	}
	select {
	case err := <-required:
		wantErr(t, err, rpctypes.ErrGRPCNoLeader)
	case <-time.After(20 * time.Second):
		t.Fatal("the watch that requires a leader was still open 20 s after the leader stopped")
	}
	select {
	case err := <-plain:
		t.Fatalf("the watch that does not require a leader ended: %v", err)
	default:
	}
}
