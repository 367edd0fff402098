package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/testutil"
	"github.com/tenure-io/tenure/internal/version"
)

// baseRelease is the release before format versions: the one a rolling
// upgrade starts from. The test builds it from this repository's history.
const baseRelease = "cb865d7"

// buildBaseRelease builds `tenure` of baseRelease from the repository's
// own history (git archive of the commit, then go build) and returns its
// path. A clone without the commit (a shallow one) fails the test with
// what to do: the test is never skipped.
func buildBaseRelease(t *testing.T) string {
	t.Helper()
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("the rolling-upgrade test builds release %s from this repository's history, but this is no git checkout: %v", baseRelease, err)
	}
	root := strings.TrimSpace(string(top))
	if out, err := exec.Command("git", "-C", root, "cat-file", "-e", baseRelease+"^{commit}").CombinedOutput(); err != nil {
		t.Fatalf("commit %s (the release a rolling upgrade starts from) is not in this clone (a shallow clone? run `git fetch --unshallow`): %v %s", baseRelease, err, out)
	}
	full, err := exec.Command("git", "-C", root, "rev-parse", baseRelease+"^{commit}").Output()
	if err != nil {
		t.Fatalf("resolving %s: %v", baseRelease, err)
	}
	// The release's source is extracted once into a directory of its own,
	// named by its commit, beside Go's build cache: built from the same
	// path every time, every package of it is in the build cache after the
	// first run. An extraction is renamed into place only once complete.
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	src := filepath.Join(cache, "tenure-e2e", "release-"+strings.TrimSpace(string(full)))
	if _, err := os.Stat(filepath.Join(src, "go.mod")); err != nil {
		if err := os.MkdirAll(filepath.Dir(src), 0o755); err != nil {
			t.Fatal(err)
		}
		tmp, err := os.MkdirTemp(filepath.Dir(src), "extract-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(tmp) // left only if the rename below failed
		archive := exec.Command("sh", "-c", `git -C "$0" archive "$1" | tar -x -C "$2"`, root, baseRelease, tmp)
		if out, err := archive.CombinedOutput(); err != nil {
			t.Fatalf("extracting %s: %v %s", baseRelease, err, out)
		}
		if err := os.Rename(tmp, src); err != nil {
			if _, serr := os.Stat(filepath.Join(src, "go.mod")); serr != nil { // not another run's extraction
				t.Fatalf("extracting %s: %v", baseRelease, err)
			}
		}
	}
	bin := filepath.Join(t.TempDir(), "tenure-"+baseRelease)
	build := exec.Command("go", "build", "-o", bin, "./cmd/tenure")
	build.Dir = src
	build.Env = append(os.Environ(), "GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -buildvcs=false"))
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building release %s: %v\n%s", baseRelease, err, out)
	}
	return bin
}

// upgradeStatus is what the test reads of `tenure status -o json`.
type upgradeStatus struct {
	Node           string `json:"node"`
	Leader         string `json:"leader"`
	Ready          bool   `json:"ready"`
	Protocol       uint32 `json:"protocol"`
	ClusterVersion uint32 `json:"cluster_version"`
}

// TestRollingUpgradeFromBaseRelease: a 3-node cluster of the base release
// is upgraded to this build one node at a time, followers first, while a
// `tenure lock` of the base release holds a lock with its command running
// and a writer puts keys. The holder's token never changes and its
// command runs throughout; every acknowledged write reads back; while
// members of the base release remain, an upgraded node reports its
// protocol above the cluster version (1), and once all are upgraded the
// cluster version rises to the protocol. A member of the base release
// cannot join afterwards.
func TestRollingUpgradeFromBaseRelease(t *testing.T) {
	began := time.Now()
	old := buildBaseRelease(t)
	t.Logf("release %s built in %v", baseRelease, time.Since(began).Round(time.Millisecond))
	newBin := filepath.Join(binDir, "tenure")

	ms := make([]*member, 3)
	var peers []string
	for i := range ms {
		ms[i] = &member{id: fmt.Sprintf("n%d", i+1), addr: freeAddr(t), peer: freeAddr(t)}
		peers = append(peers, ms[i].id+"="+ms[i].peer)
	}
	root := t.TempDir()
	startNode := func(bin string, m *member) {
		t.Helper()
		m.p = startExec(t, m.id+"@"+filepath.Base(bin), m.addr, exec.Command(bin, "serve", "--http-listen", "127.0.0.1:0", "--node-id", m.id,
			"--listen", m.addr, "--peer-listen", m.peer, "--data-dir", filepath.Join(root, m.id), "--bootstrap-peers", strings.Join(peers, ",")))
	}
	waitReady := func(m *member) {
		t.Helper()
		testutil.WaitFor(t, m.id+"'s ready line", 30*time.Second, func() bool {
			if m.p.exited() {
				t.Fatalf("%s exited with %d: %s", m.id, m.p.status, m.p.stderr())
			}
			return strings.HasPrefix(m.p.stdout(), "tenure: serving on "+m.addr)
		})
	}
	for _, m := range ms {
		startNode(old, m)
	}
	for _, m := range ms {
		waitReady(m)
	}
	eps := endpoints(ms)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// The holder: a `tenure lock` of the base release, its command
	// recording the token it was given and running on.
	tokenFile := filepath.Join(t.TempDir(), "token")
	holderProc := startExec(t, "holder", eps, exec.Command(old, "lock", "upgrade-lock", "--ttl", "10s", "--", "sh", "-c", `echo "$TENURE_FENCE_TOKEN" > "$0"; exec sleep 600`, tokenFile))
	token, err := strconv.ParseUint(readFile(t, tokenFile, 30*time.Second), 10, 64)
	if err != nil || token == 0 {
		t.Fatalf("the holder's token: %v", err)
	}
	holderToken := func() uint64 {
		t.Helper()
		var st statusOut
		tenureJSON(t, eps, 0, &st, "lock", "status", "upgrade-lock")
		if st.Holder == nil {
			t.Fatal("upgrade-lock has no holder")
		}
		return st.Holder.Token
	}
	if got := holderToken(); got != token {
		t.Fatalf("lock status says token %d, the holder's command got %d", got, token)
	}

	// The writer: puts keys through the whole upgrade; those it saw
	// acknowledged must read back at the end.
	c := dial(t, ctx, eps)
	var mu sync.Mutex
	acked := map[string]string{}
	stopWriter := make(chan struct{})
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		pace := time.NewTicker(20 * time.Millisecond)
		defer pace.Stop()
		for i := 0; ; i++ {
			select {
			case <-stopWriter:
				return
			case <-pace.C:
			}
			key, value := fmt.Sprintf("upgrade/%05d", i), fmt.Sprintf("v%d", i)
			pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
			_, err := c.Put(pctx, key, []byte(value))
			pcancel()
			if err == nil {
				mu.Lock()
				acked[key] = value
				mu.Unlock()
			}
		}
	}()
	ackedCount := func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }
	progress := func(what string) { // the writer gets writes through
		t.Helper()
		n := ackedCount()
		testutil.WaitFor(t, "writes acknowledged "+what, 30*time.Second, func() bool { return ackedCount() >= n+5 })
	}
	progress("before the upgrade")

	status := func(m *member) upgradeStatus {
		t.Helper()
		var st upgradeStatus
		tenureJSON(t, m.addr, 0, &st, "status", "--wait", "15s")
		return st
	}
	leaderID := func() string {
		t.Helper()
		var id string
		testutil.WaitFor(t, "a leader", 30*time.Second, func() bool {
			r := tenure(t, eps, "status", "-o", "json")
			var st upgradeStatus
			if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil {
				return false
			}
			id = st.Leader
			return id != ""
		})
		return id
	}
	upgrade := func(m *member) {
		t.Helper()
		m.p.signal(syscall.SIGTERM)
		if code := m.p.wait(30 * time.Second); code != 0 {
			t.Fatalf("%s of release %s exited %d on SIGTERM: %s", m.id, baseRelease, code, m.p.stderr())
		}
		startNode(newBin, m)
		waitReady(m)
	}

	leader := leaderID()
	var order []*member
	for _, m := range ms {
		if m.id != leader {
			order = append(order, m)
		}
	}
	for _, m := range ms {
		if m.id == leader {
			order = append(order, m) // the leader last
		}
	}
	for i, m := range order[:2] {
		upgrade(m)
		st := status(m)
		if st.Protocol != version.Protocol || st.ClusterVersion != 1 {
			t.Fatalf("%s upgraded while %d members of release %s remain: protocol %d, cluster_version %d; want %d and 1", m.id, 2-i, baseRelease, st.Protocol, st.ClusterVersion, version.Protocol)
		}
		progress("after upgrading " + m.id)
	}
	// A member list asked of an upgraded node tells the members apart.
	var list struct {
		Members []struct {
			ID       string `json:"id"`
			Protocol uint32 `json:"protocol"`
		} `json:"members"`
	}
	// (what members reported is reused for a few seconds).
	testutil.WaitFor(t, "the member list to show n1, n2 and n3's versions", 20*time.Second, func() bool {
		tenureJSON(t, order[0].addr, 0, &list, "member", "list")
		for _, m := range list.Members {
			want := version.Protocol
			if m.ID == order[2].id {
				want = 1
			}
			if m.Protocol != want {
				return false
			}
		}
		return len(list.Members) == 3
	})
	upgrade(order[2])
	progress("after upgrading the old leader " + order[2].id)

	for _, m := range ms {
		testutil.WaitFor(t, m.id+"'s cluster version "+strconv.Itoa(int(version.Protocol)), 30*time.Second, func() bool {
			st := status(m)
			return st.Protocol == version.Protocol && st.ClusterVersion == version.Protocol
		})
	}
	progress("at the new cluster version")

	// A member of the base release can no longer join: it would skip what
	// it does not know.
	n4 := &member{id: "n4", addr: freeAddr(t), peer: freeAddr(t)}
	n4.p = startExec(t, "n4@"+baseRelease, n4.addr, exec.Command(old, "serve", "--http-listen", "127.0.0.1:0", "--node-id", n4.id,
		"--listen", n4.addr, "--peer-listen", n4.peer, "--data-dir", filepath.Join(root, n4.id), "--join"))
	testutil.WaitFor(t, "n4's peer listener", 30*time.Second, func() bool {
		c, err := net.Dial("tcp", n4.peer)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	r := tenure(t, eps, "member", "add", n4.id, n4.peer, "--force")
	if want := fmt.Sprintf("n4 speaks format version 1, the cluster is at version %d", version.Protocol); r.code == 0 || !strings.Contains(r.stderr, want) {
		t.Fatalf("member add of a base-release member: exit %d, stderr %q; want a refusal saying %q", r.code, r.stderr, want)
	}
	tenureJSON(t, eps, 0, &list, "member", "list")
	if len(list.Members) != 3 {
		t.Fatalf("after the refused add: %+v", list)
	}
	close(stopWriter)
	<-writerDone

	if holderProc.exited() {
		t.Fatalf("the holder exited (%d) during the upgrade: %s", holderProc.status, holderProc.stderr())
	}
	if got := holderToken(); got != token {
		t.Fatalf("the holder's token changed during the upgrade: %d, then %d", token, got)
	}
	mu.Lock()
	defer mu.Unlock()
	for key, want := range acked {
		got, err := c.Get(ctx, key)
		if err != nil || len(got.KVs) != 1 || string(got.KVs[0].Value) != want {
			t.Fatalf("acknowledged write %s=%s reads back %+v, %v", key, want, got, err)
		}
	}
	t.Logf("rolling upgrade of 3 nodes from %s to protocol %d: %d acknowledged writes read back, token %d held throughout, %v in all",
		baseRelease, version.Protocol, len(acked), token, time.Since(began).Round(time.Millisecond))
}

// TestLeadershipHandedOn: `tenure member transfer-leadership ID` makes ID
// the leader, and a leader stopped with SIGTERM hands leadership on
// before it exits, so the others have a leader at once, not after an
// election timeout.
func TestLeadershipHandedOn(t *testing.T) {
	ms := startCluster(t, 3)
	eps := endpoints(ms)
	var st upgradeStatus
	testutil.WaitFor(t, "a leader", 30*time.Second, func() bool {
		r := tenure(t, eps, "status", "-o", "json")
		return r.code == 0 && json.Unmarshal([]byte(r.stdout), &st) == nil && st.Leader != ""
	})
	target := ms[0]
	if target.id == st.Leader {
		target = ms[1]
	}
	var moved struct {
		Leader string `json:"leader"`
	}
	tenureJSON(t, eps, 0, &moved, "member", "transfer-leadership", target.id)
	if moved.Leader != target.id {
		t.Fatalf("transfer-leadership %s: leader %q", target.id, moved.Leader)
	}
	stopped := time.Now()
	target.p.signal(syscall.SIGTERM)
	if code := target.p.wait(30 * time.Second); code != 0 {
		t.Fatalf("the leader exited %d on SIGTERM: %s", code, target.p.stderr())
	}
	if !strings.Contains(target.p.stderr(), "stopping: leadership transferred") {
		t.Fatalf("the leader did not hand leadership on before it stopped: %s", target.p.stderr())
	}
	var rest []*member
	for _, m := range ms {
		if m != target {
			rest = append(rest, m)
		}
	}
	testutil.WaitFor(t, "a new leader", 10*time.Second, func() bool {
		r := tenure(t, endpoints(rest), "status", "-o", "json")
		return r.code == 0 && json.Unmarshal([]byte(r.stdout), &st) == nil && st.Leader != "" && st.Leader != target.id
	})
	t.Logf("a leader stopped with SIGTERM: %s leads %v after the signal", st.Leader, time.Since(stopped).Round(time.Millisecond))
}
