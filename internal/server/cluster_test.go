package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/testutil"
)

// freePort returns a loopback address nothing listens on now, outside
// the ports the system hands out for outgoing connections.
func freePort(t testing.TB) string { return testutil.FreeAddr(t, 61000, 65000) }

// member is one in-process node of a test cluster.
type member struct {
	id, peer string
	root     string // its data directory is root/id
	d        *daemon.Daemon
	stop     func()
}

// startMember starts node id with peer address peer; bootstrap lists the
// initial voters (nil: a node that will be added).
func startMember(t testing.TB, root, id, peer string, bootstrap map[string]string) *member {
	t.Helper()
	return startMemberJoin(t, root, id, peer, bootstrap, false)
}

// startMemberJoin is startMember; with join, the node starts with --join
// and is returned at once: it is ready only once a leader adds it.
func startMemberJoin(t testing.TB, root, id, peer string, bootstrap map[string]string, join bool) *member {
	t.Helper()
	d, err := daemon.Start(daemon.Config{NodeID: id, DataDir: filepath.Join(root, id), Listen: "127.0.0.1:0", PeerListen: peer, BootstrapPeers: bootstrap, Join: join, LogOutput: testutil.LogWriter(t, id)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	m := &member{id: id, peer: peer, root: root, d: d}
	stopped := false
	m.stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(m.stop)
	if join {
		return m
	}
	select {
	case <-d.Ready():
	case err := <-done:
		t.Fatalf("%s stopped: %v", id, err)
	case <-time.After(30 * time.Second):
		t.Fatalf("%s not ready", id)
	}
	return m
}

// startCluster starts a cluster of n voters on loopback.
func startCluster(t testing.TB, n int) []*member {
	t.Helper()
	root := t.TempDir()
	peers := make(map[string]string)
	for i := 1; i <= n; i++ {
		peers[fmt.Sprint("n", i)] = freePort(t)
	}
	ms := make([]*member, n)
	started := make(chan *member, n)
	for i := range ms {
		id := fmt.Sprint("n", i+1)
		go func() { started <- startMember(t, root, id, peers[id], peers) }()
	}
	for i := range ms {
		ms[i] = <-started
	}
	return ms
}

func clusterClient(t *testing.T, ms []*member) *client.Client {
	t.Helper()
	var eps []string
	for _, m := range ms {
		eps = append(eps, m.d.Addr())
	}
	return testutil.Dial(t, strings.Join(eps, ","))
}

// voterIDs lists the voters c's member list names, and the leader.
func voterIDs(t *testing.T, ctx context.Context, c *client.Client) (voters []string, leader string) {
	t.Helper()
	resp, err := c.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range resp.GetMembers() {
		if m.GetVoter() {
			voters = append(voters, m.GetId())
		}
		if m.GetLeader() {
			leader = m.GetId()
		}
	}
	return voters, leader
}

// wantWrites waits until the cluster commits a write (it has a leader).
func wantWrites(t *testing.T, ctx context.Context, c *client.Client) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := c.Put(wctx, "probe", []byte("x"))
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster commits no write: %v", err)
		}
	}
}

// TestMemberAddRefusesAPeerThatNeverAnswered: adding a voter at an
// address where nothing listens (after waiting for it up to the request's
// deadline), or where something that is not a raft server listens (at
// once), is refused with INVALID_ARGUMENT even with force, saying that
// nothing was changed, and the configuration is unchanged.
func TestMemberAddRefusesAPeerThatNeverAnswered(t *testing.T) {
	testutil.Slow(t)
	ms := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := clusterClient(t, ms)

	silent, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		for {
			conn, err := silent.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
		}
	}()
	for _, addr := range []string{freePort(t), silent.Addr().String()} {
		began := time.Now()
		// Where nothing listens the leader waits for the peer until
		// shortly before the request's deadline.
		actx, acancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.AddMember(actx, "n4", addr, true)
		acancel()
		if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "did not answer") || !strings.Contains(err.Error(), "--peer-listen "+addr) || !strings.Contains(err.Error(), "nothing was changed") {
			t.Fatalf("add of a voter at %s that never answers: %v", addr, err)
		}
		t.Logf("refused after %v: %v", time.Since(began), err)
		if voters, _ := voterIDs(t, ctx, c); len(voters) != 3 {
			t.Fatalf("voters after a refused add: %v", voters)
		}
	}
	wantWrites(t, ctx, c)
}

// TestMemberRemoveKeepsAReachableMajority: removing one of three voters
// (the leader, here) needs --force (two is even) and leaves a cluster
// with a leader; removing a second is refused even with --force, since
// one voter is not a majority of two.
func TestMemberRemoveKeepsAReachableMajority(t *testing.T) {
	testutil.Slow(t)
	ms := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusterClient(t, ms)
	_, leader := voterIDs(t, ctx, c)

	if _, err := c.RemoveMember(ctx, leader, false); !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("remove to an even count without force: %v", err)
	}
	if _, err := c.RemoveMember(ctx, leader, true); err != nil {
		t.Fatalf("remove 1 of 3 (the leader) with force: %v", err)
	}
	wantWrites(t, ctx, c)
	voters, newLeader := voterIDs(t, ctx, c)
	if len(voters) != 2 || newLeader == "" || newLeader == leader {
		t.Fatalf("voters after removing the leader %s: %v, leader %q", leader, voters, newLeader)
	}
	for _, id := range voters {
		_, err := c.RemoveMember(ctx, id, true)
		if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "reachable voters") {
			t.Fatalf("removing %s of %v with force: %v, want a refusal", id, voters, err)
		}
		t.Logf("refused: %v", err)
	}
	if after, _ := voterIDs(t, ctx, c); len(after) != 2 {
		t.Fatalf("voters after the refused removals: %v", after)
	}
	wantWrites(t, ctx, c)
}

// TestMemberRemoveOfAnUnreachableVoterAllowed: with one of three voters
// down, removing it is allowed (the two left are a majority of three),
// while removing a reachable one is refused: it would leave one.
func TestMemberRemoveOfAnUnreachableVoterAllowed(t *testing.T) {
	ms := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusterClient(t, ms)
	_, leader := voterIDs(t, ctx, c)
	var down, other *member
	for _, m := range ms {
		switch {
		case m.id == leader:
		case down == nil:
			down = m
		default:
			other = m
		}
	}
	down.stop()
	if _, err := c.RemoveMember(ctx, other.id, true); !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "reachable voters") {
		t.Fatalf("removing the reachable %s while %s is down: %v", other.id, down.id, err)
	}
	if _, err := c.RemoveMember(ctx, down.id, true); err != nil {
		t.Fatalf("removing the unreachable %s: %v", down.id, err)
	}
	wantWrites(t, ctx, c)
}

// TestMemberAddJoinsAndCatchesUp: a new node started with --join is added
// (a non-voter first, promoted once it holds the log) and then has the
// cluster's state. (One that bootstrapped itself instead is another
// cluster, and refuses it: see node's TestForeignClusterNeverWritesIntoDirectory.)
func TestMemberAddJoinsAndCatchesUp(t *testing.T) {
	testutil.Slow(t)
	ms := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusterClient(t, ms)
	if _, err := c.Put(ctx, "before-join", []byte("v")); err != nil {
		t.Fatal(err)
	}
	n4 := startMemberJoin(t, t.TempDir(), "n4", freePort(t), nil, true)
	if _, err := c.AddMember(ctx, "n4", n4.peer, false); !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("add to an even count without force: %v", err)
	}
	if _, err := c.AddMember(ctx, "n4", n4.peer, true); err != nil {
		t.Fatalf("add n4: %v", err)
	}
	if voters, _ := voterIDs(t, ctx, c); len(voters) != 4 {
		t.Fatalf("voters after adding n4: %v", voters)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var found bool
		n4.d.Node.Read(func(s *fsm.State) { _, found = s.KVGet("before-join") })
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("n4 never received the cluster's state")
		}
		time.Sleep(20 * time.Millisecond) // polling n4's applied state
	}
	wantWrites(t, ctx, c)
}

// TestForcedRestoreInACluster: a forced restore of an older snapshot on a
// 3-node cluster continues above the revision the cluster had reached, on
// every replica alike (the leader rewrites the snapshot before raft
// replicates it), and a token issued before it is stale afterwards.
func TestForcedRestoreInACluster(t *testing.T) {
	testutil.Slow(t)
	ms := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clusterClient(t, ms)
	s := testutil.Session(t, ctx, c)
	mu, _ := s.Mutex("job")
	lockOnce := func() uint64 {
		h, err := mu.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		return h.Token()
	}
	lockOnce()
	var old bytes.Buffer
	if _, err := c.SaveSnapshot(ctx, &old); err != nil {
		t.Fatal(err)
	}
	var last uint64
	for i := 0; i < 10; i++ {
		last = lockOnce()
	}
	put, err := c.FencedPut(ctx, "ledger", []byte("v"), last, "")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.RestoreSnapshot(ctx, bytes.NewReader(old.Bytes()), true)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetRevision() < put.Revision {
		t.Fatalf("restored at revision %d, the cluster was at %d", resp.GetRevision(), put.Revision)
	}
	s2 := testutil.Session(t, ctx, c)
	m2, _ := s2.Mutex("job")
	h, err := m2.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h.Token() <= put.Revision {
		t.Fatalf("token %d after the restore; the cluster had reached revision %d", h.Token(), put.Revision)
	}
	if _, err := c.FencedPut(ctx, "ledger", []byte("v2"), last, ""); !errors.Is(err, client.ErrStale) {
		t.Fatalf("put with pre-restore token %d: %v, want stale", last, err)
	}
	// Every replica reaches the same revision and fence floor.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var revs, floors []uint64
		for _, m := range ms {
			m.d.Node.Read(func(st *fsm.State) { revs, floors = append(revs, st.Revision()), append(floors, st.FenceFloor()) })
		}
		if revs[0] == revs[1] && revs[1] == revs[2] && floors[0] == floors[1] && floors[1] == floors[2] && floors[0] >= put.Revision {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replicas at revisions %v, fence floors %v (the cluster was at %d)", revs, floors, put.Revision)
		}
		time.Sleep(20 * time.Millisecond) // polling the replicas' applied state
	}
}

// TestRemoveLastVoterRefused: a single node's only voter cannot be
// removed; the refusal says so plainly.
func TestRemoveLastVoterRefused(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	if _, err := c.RemoveMember(ctx, "n1", true); !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "only voter") {
		t.Fatalf("removing the last voter: %v", err)
	}
	if st, err := c.Status(ctx); err != nil || len(st.GetVoters()) != 1 {
		t.Fatalf("status after the refusal: %v %v", st, err)
	}
}

// TestFollowerNeverDeclaresASessionExpired: a resume that a node which is
// not the serving leader answers itself is answered "not the leader", whatever
// that node's own, possibly stale, state holds. A follower (or a new
// leader that has not applied what its predecessor committed) may not yet
// know a session; answering "expired" from there made clients give up
// live sessions, and their holds, across a fail-over.
func TestFollowerNeverDeclaresASessionExpired(t *testing.T) {
	ms := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := clusterClient(t, ms)
	_, leader := voterIDs(t, ctx, c)
	var follower *member
	for _, m := range ms {
		if m.id != leader {
			follower = m
			break
		}
	}
	// On the follower's forward door, where it answers itself (on its
	// client API it forwards the stream to the leader, which knows).
	var from *member
	for _, m := range ms {
		if m.id == leader {
			from = m
		}
	}
	testutil.WaitFor(t, "the follower to hold the cluster's signing keys (the forward door's handshake)", 30*time.Second, func() bool {
		return len(follower.d.Node.Security().Keys) > 0
	})
	raw, err := testutil.OpenRawSession(ctx, forwardAPI(t, from.d, follower.id))
	if err != nil {
		t.Fatal(err)
	}
	// A session id the follower's state does not hold (yet).
	if err := raw.Send(&pb.SessionRequest{Id: 1, Op: &pb.SessionRequest_Open{Open: &pb.OpenSession{SessionId: 1 << 40, Secret: make([]byte, fsm.SecretBytes), TtlMs: 5000}}}); err != nil {
		t.Fatal(err)
	}
	resp, err := raw.Recv()
	var reason pb.ErrorReason
	switch {
	case err != nil:
		st, _ := status.FromError(err)
		for _, d := range st.Details() {
			if e, ok := d.(*pb.Error); ok {
				reason = e.GetReason()
			}
		}
		if reason == 0 && st.Code() == codes.Unavailable {
			reason = pb.ErrorReason_ERROR_REASON_NOT_LEADER
		}
		t.Logf("stream ended: %v", err)
	case resp.GetError() != nil:
		reason = resp.GetError().GetReason()
		t.Logf("answered: %v", resp.GetError())
	default:
		t.Fatalf("a follower resumed a session it does not hold: %v", resp)
	}
	if reason != pb.ErrorReason_ERROR_REASON_NOT_LEADER {
		t.Fatalf("a follower answered a resume with %v, want not the leader", reason)
	}
}
