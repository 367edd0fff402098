package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/testutil"
)

// chromium finds a Chromium to drive; without one the test is skipped,
// except in CI (.ci/run installs Debian's chromium), where it fails.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if testing.Short() {
		t.Skip("-short: no chromium on PATH, and the quick gate needs none")
	}
	t.Fatal("no chromium on PATH: the dashboard's browser test needs it (.ci/run installs Debian's chromium)")
	return ""
}

// browser starts a headless Chromium with a fresh profile; it is stopped
// when the test ends.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 860),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("starting chromium: %v", err)
	}
	return ctx
}

// lockRow is what the locks page shows of one lock.
type lockRow struct {
	Holders []string `json:"holders"`
	Waiters []string `json:"waiters"`
	Marker  int      `json:"marker"`
}

const readRow = `(() => {
	const r = document.querySelector('[data-testid=lock][data-name="shard-7"]');
	if (!r) return {holders: [], waiters: [], marker: window.noReload || 0};
	const text = sel => [...r.querySelectorAll(sel)].map(e => e.textContent);
	return {holders: text('[data-testid=holder]'), waiters: text('[data-testid=waiter]'), marker: window.noReload || 0};
})()`

// waitRow polls the page until the row's holders and waiters start with
// the owners given, in order.
func waitRow(t *testing.T, ctx context.Context, holders, waiters []string) lockRow {
	t.Helper()
	match := func(got, want []string) bool {
		if len(got) != len(want) {
			return false
		}
		for i := range want {
			if !strings.HasPrefix(got[i], want[i]+" ") {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		row, err := chromedp.Run(ctx, chromedp.Evaluate[lockRow](readRow))
		if err != nil {
			t.Fatal(err)
		}
		if match(row.Holders, holders) && match(row.Waiters, waiters) {
			return row
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page shows holders %q and waiters %q, want %v and %v", row.Holders, row.Waiters, holders, waiters)
		}
		if err := chromedp.Do(ctx, chromedp.Sleep(50*time.Millisecond)); err != nil { // the page's next redraw
			t.Fatal(err)
		}
	}
}

// TestDashboardShowsHandOffLive: in a real headless Chromium, the locks
// page shows a lock's holder and its two waiters in FIFO order; when the
// holder releases, the hand-off appears without a reload; the lock's
// timeline shows both grants. Screenshots of both pages are saved in the
// test's temp dir (or $TENURE_SCREENSHOT_DIR).
func TestDashboardShowsHandOffLive(t *testing.T) {
	testutil.Slow(t)
	ctx := browser(t)
	srv := testutil.StartConfig(t, daemon.Config{HTTPListen: "127.0.0.1:0"})
	cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	holds := make(chan *client.Hold, 3)
	queue := func(owner string) {
		s := testutil.Session(t, cctx, c, client.WithOwner(owner))
		m, _ := s.Mutex("shard-7")
		queued := make(chan struct{})
		go func() {
			h, err := m.Lock(cctx, client.OnQueued(func(int) { close(queued) }))
			if err != nil {
				if cctx.Err() == nil { // not the end of the test
					t.Error(err)
				}
				return
			}
			holds <- h
		}()
		<-queued
	}
	alice := testutil.Session(t, cctx, c, client.WithOwner("alice"))
	m, _ := alice.Mutex("shard-7")
	ha, err := m.Lock(cctx)
	if err != nil {
		t.Fatal(err)
	}
	queue("bob")
	queue("carol")

	base := "http://" + srv.HTTPAddr()
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/#locks")); err != nil {
		t.Fatal(err)
	}
	waitRow(t, ctx, []string{"alice"}, []string{"bob", "carol"})
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`window.noReload = 42`)); err != nil {
		t.Fatal(err)
	}
	if err := ha.Unlock(cctx); err != nil {
		t.Fatal(err)
	}
	row := waitRow(t, ctx, []string{"bob"}, []string{"carol"})
	if row.Marker != 42 {
		t.Fatal("the page was reloaded to show the hand-off")
	}
	dir := os.Getenv("TENURE_SCREENSHOT_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	shot := func(name string) {
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", path)
	}
	shot("dashboard-locks.png")

	// The cluster page: this node as the one member, leader and reachable,
	// and the summary of the state (bob holds the lock, carol waits).
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	err = chromedp.Do(wctx, chromedp.Navigate(base+"/#cluster"), chromedp.WaitVisible(chromedp.CSS(`[data-testid=member]`)))
	wcancel()
	if err != nil {
		t.Fatalf("the cluster page shows no member: %v", err)
	}
	members, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('[data-testid=member]')].map(r => r.textContent)`))
	if err != nil {
		t.Fatal(err)
	}
	summary, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('[data-testid=summary]').textContent`))
	if err != nil {
		t.Fatal(err)
	}
	if len(members) != 1 || !strings.Contains(members[0], "n1") || !strings.Contains(members[0], "leader") || !strings.Contains(members[0], "reachable") ||
		!strings.Contains(summary, "locks held1") || !strings.Contains(summary, "waiters1") {
		t.Fatalf("cluster page: members %q, summary %q", members, summary)
	}
	shot("dashboard-cluster.png")

	// The lock's timeline: alice's grant released, bob's held.
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/#lock/shard-7"), chromedp.WaitVisible(chromedp.CSS(`[data-testid=timeline]`))); err != nil {
		t.Fatal(err)
	}
	bars, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('[data-testid=bar]').length`))
	if err != nil {
		t.Fatal(err)
	}
	grants, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('[data-testid=grant]')].map(r => r.textContent)`))
	if err != nil {
		t.Fatal(err)
	}
	if bars != 2 || len(grants) != 2 || !strings.Contains(grants[0], "bob") || !strings.HasSuffix(grants[0], "held") || !strings.Contains(grants[1], "alice") || !strings.HasSuffix(grants[1], "released") {
		t.Fatalf("timeline: %d bars, grants %q", bars, grants)
	}
	shot("dashboard-timeline.png")
}

// TestDashboardAPI: the pages' JSON, and the requeue's guard.
func TestDashboardAPI(t *testing.T) {
	srv := testutil.StartConfig(t, daemon.Config{HTTPListen: "127.0.0.1:0"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	s := testutil.Session(t, ctx, c, client.WithOwner("leader-1"))
	e, _ := s.Election("primary")
	if _, err := e.Campaign(ctx, []byte("10.0.0.7:5432")); err != nil {
		t.Fatal(err)
	}
	q := c.Queue("jobs")
	if _, err := q.Enqueue(ctx, []byte("payload"), client.WithMaxAttempts(1)); err != nil {
		t.Fatal(err)
	}
	d, err := q.Dequeue(ctx, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Nack(ctx, d); err != nil {
		t.Fatal(err)
	}
	base := "http://" + srv.HTTPAddr()
	getJSON := func(path string, v any) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("%s: %s %s", path, resp.Status, b)
		}
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatal(err)
		}
	}
	var cl struct {
		Leader  string `json:"leader"`
		Ready   bool   `json:"ready"`
		View    string `json:"view"`
		Members []struct {
			ID        string `json:"id"`
			Leader    bool   `json:"leader"`
			Reachable bool   `json:"reachable"`
		} `json:"members"`
		Summary struct {
			Held     int `json:"held"`
			Sessions int `json:"sessions"`
		} `json:"summary"`
	}
	getJSON("/api/cluster", &cl)
	if cl.Leader != "n1" || !cl.Ready {
		t.Fatalf("cluster %+v", cl)
	}
	// The members with their health (the leader's view: this node's), and
	// the summary of the state (the election's leader holds its lock).
	if cl.View != "n1" || len(cl.Members) != 1 || cl.Members[0].ID != "n1" || !cl.Members[0].Leader || !cl.Members[0].Reachable || cl.Summary.Held == 0 || cl.Summary.Sessions == 0 {
		t.Fatalf("cluster members and summary %+v", cl)
	}
	var el struct {
		Elections []struct{ Name, Leader, Value string } `json:"elections"`
	}
	getJSON("/api/elections", &el)
	if len(el.Elections) != 1 || el.Elections[0].Leader != "leader-1" || el.Elections[0].Value != "10.0.0.7:5432" {
		t.Fatalf("elections %+v", el)
	}
	var ss struct {
		Sessions []struct {
			Owner      string `json:"owner"`
			TimeLeftMs int64  `json:"time_left_ms"`
			Held       []string
		} `json:"sessions"`
	}
	getJSON("/api/sessions", &ss)
	if len(ss.Sessions) != 1 || ss.Sessions[0].TimeLeftMs <= 0 || fmt.Sprint(ss.Sessions[0].Held) != "[primary]" {
		t.Fatalf("sessions %+v", ss)
	}
	var dead struct {
		Items []struct {
			ID      uint64 `json:"id"`
			Preview string `json:"preview"`
		} `json:"items"`
	}
	getJSON("/api/dead?queue=jobs", &dead)
	if len(dead.Items) != 1 || dead.Items[0].Preview != "payload" {
		t.Fatalf("dead letters %+v", dead)
	}
	body := fmt.Sprintf(`{"queue":"jobs","ids":["%d"]}`, dead.Items[0].ID)
	resp, err := http.Post(base+"/api/requeue", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a requeue without the dashboard's header: %s", resp.Status)
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/api/requeue", strings.NewReader(body))
	req.Header.Set("X-Tenure-Dashboard", "1")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"requeued":1`) {
		t.Fatalf("requeue: %s %s", resp.Status, b)
	}
	if st, _ := q.Stats(ctx); st.Queued != 1 || st.Dead != 0 {
		t.Fatalf("after the requeue: %+v", st)
	}
}

// TestDashboardUnderAuth: on a node run with --auth, the page loads (it
// holds no data) and asks for a token; with a token whose policy reads
// locks it shows the lock's holder and waiter, and then the hand-off live,
// without a reload: the change stream carries the token (fetch, not
// EventSource). The token is kept in the tab's session storage only, and
// never appears in a URL the page requested.
func TestDashboardUnderAuth(t *testing.T) {
	testutil.Slow(t)
	ctx := browser(t)
	srv := testutil.StartConfig(t, daemon.Config{HTTPListen: "127.0.0.1:0", Auth: true})
	cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	boot, err := testutil.Dial(t, srv.Addr()).BootstrapACL(cctx)
	if err != nil {
		t.Fatal(err)
	}
	admin := testutil.Dial(t, srv.Addr(), client.WithAuthToken(boot.Secret))
	if err := admin.CreatePolicy(cctx, &pb.AclPolicy{Name: "viewer", Rules: []*pb.AclRule{{Kind: "lock", Prefix: "shard-", Access: "read"}}}, false); err != nil {
		t.Fatal(err)
	}
	viewer, err := admin.CreateToken(cctx, []string{"viewer"}, "dashboard")
	if err != nil {
		t.Fatal(err)
	}
	// Long TTLs: a loaded machine (a browser, -race) must not expire them.
	alice := testutil.Session(t, cctx, admin, client.WithOwner("alice"), client.WithTTL(time.Minute))
	m, _ := alice.Mutex("shard-7")
	ha, err := m.Lock(cctx)
	if err != nil {
		t.Fatal(err)
	}
	bob := testutil.Session(t, cctx, admin, client.WithOwner("bob"), client.WithTTL(time.Minute))
	mb, _ := bob.Mutex("shard-7")
	queued := make(chan struct{})
	go func() {
		if _, err := mb.Lock(cctx, client.OnQueued(func(int) { close(queued) })); err != nil && cctx.Err() == nil {
			t.Error(err)
		}
	}()
	<-queued

	base := "http://" + srv.HTTPAddr()
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/#locks"), chromedp.WaitVisible(chromedp.CSS(`[data-testid=need-token]`))); err != nil {
		t.Fatalf("the page without a token: %v", err)
	}
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS(`[data-testid=token]`), viewer.Secret),
		chromedp.Click(chromedp.CSS(`[data-testid=use-token]`))); err != nil {
		t.Fatal(err)
	}
	waitRow(t, ctx, []string{"alice"}, []string{"bob"})
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`window.noReload = 42`)); err != nil {
		t.Fatal(err)
	}
	if err := ha.Unlock(cctx); err != nil {
		t.Fatal(err)
	}
	if row := waitRow(t, ctx, []string{"bob"}, nil); row.Marker != 42 {
		t.Fatal("the page was reloaded to show the hand-off")
	}
	stored, err := chromedp.Run(ctx, chromedp.Evaluate[string](`sessionStorage.getItem("tenure-token") + "|" + localStorage.length`))
	if err != nil {
		t.Fatal(err)
	}
	if stored != viewer.Secret+"|0" {
		t.Fatalf("session storage %q, want the token (and nothing in local storage)", stored)
	}
	urls, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[location.href, ...performance.getEntriesByType("resource").map(e => e.name)]`))
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range urls {
		if strings.Contains(u, viewer.Secret) {
			t.Fatalf("the token is in a URL: %s", u)
		}
	}
	// The viewer may not see the cluster's view: the page says so.
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/#cluster"), chromedp.WaitVisible(chromedp.CSS(`[data-testid=error]`))); err != nil {
		t.Fatalf("the cluster page with a lock viewer's token: %v", err)
	}
}
