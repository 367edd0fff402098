package httpguard

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/testutil"
)

// markStore is an in-memory Store.
type markStore struct {
	mu   sync.Mutex
	mark map[string]uint64
}

func (s *markStore) Advance(_ context.Context, key string, token uint64) (bool, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if token < s.mark[key] {
		return false, s.mark[key], nil
	}
	s.mark[key] = token
	return true, token, nil
}

// waiters is how many requests use or wait for key's lock.
func (g *Guard) waiters(key string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if kl := g.keys[key]; kl != nil {
		return kl.refs
	}
	return 0
}

// TestSerializedPerKey: with a Store, a newer token's request waits until
// the older token's handler has returned, so its effect cannot be
// overtaken in this process; with Concurrent it is not held back.
func TestSerializedPerKey(t *testing.T) {
	for _, concurrent := range []bool{false, true} {
		t.Run("concurrent="+strconv.FormatBool(concurrent), func(t *testing.T) {
			g, err := New(Config{Store: &markStore{mark: make(map[string]uint64)}, Concurrent: concurrent})
			if err != nil {
				t.Fatal(err)
			}
			var (
				mu      sync.Mutex
				events  []string
				entered = make(chan uint64, 2)
				release = make(chan struct{})
			)
			record := func(e string) {
				mu.Lock()
				events = append(events, e)
				mu.Unlock()
			}
			hs := httptest.NewServer(g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				f, _ := FromContext(r.Context())
				record("start " + strconv.FormatUint(f.Token, 10))
				entered <- f.Token
				if f.Token == 41 {
					<-release
				}
				record("end " + strconv.FormatUint(f.Token, 10))
			})))
			defer hs.Close()
			send := func(token uint64, done chan<- int) {
				req, _ := http.NewRequest(http.MethodPost, hs.URL, nil)
				Fence{Key: "k", Token: token}.SetHeaders(req.Header)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					done <- 0
					return
				}
				resp.Body.Close()
				done <- resp.StatusCode
			}
			done41, done42 := make(chan int, 1), make(chan int, 1)
			go send(41, done41)
			if tok := <-entered; tok != 41 {
				t.Fatalf("entered %d first", tok)
			}
			go send(42, done42)
			if concurrent {
				// 42 overtakes 41: exactly the hazard the default prevents.
				if tok := <-entered; tok != 42 {
					t.Fatalf("entered %d", tok)
				}
				if st := <-done42; st != http.StatusOK {
					t.Fatalf("42: status %d", st)
				}
				close(release)
				<-done41
				return
			}
			testutil.WaitFor(t, "the request with token 42 to queue behind 41", 10*time.Second, func() bool { return g.waiters("k") == 2 })
			close(release)
			if st := <-done41; st != http.StatusOK {
				t.Fatalf("41: status %d", st)
			}
			if st := <-done42; st != http.StatusOK {
				t.Fatalf("42: status %d", st)
			}
			mu.Lock()
			defer mu.Unlock()
			want := []string{"start 41", "end 41", "start 42", "end 42"}
			for i := range want {
				if i >= len(events) || events[i] != want[i] {
					t.Fatalf("events %v, want %v", events, want)
				}
			}
			if n := g.waiters("k"); n != 0 {
				t.Fatalf("%d lock users left for an idle key", n)
			}
		})
	}
}

// TestWaitingRequestGivesUp: a request waiting for its key's turn leaves
// when its context ends, without running the handler.
func TestWaitingRequestGivesUp(t *testing.T) {
	g, err := New(Config{Store: &markStore{mark: make(map[string]uint64)}})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	h := g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
	}))
	first := httptest.NewRequest(http.MethodPost, "/", nil)
	Fence{Key: "k", Token: 1}.SetHeaders(first.Header)
	firstDone := make(chan struct{})
	go func() {
		h.ServeHTTP(httptest.NewRecorder(), first)
		close(firstDone)
	}()
	<-entered
	ctx, cancel := context.WithCancel(context.Background())
	second := httptest.NewRequest(http.MethodPost, "/", nil).WithContext(ctx)
	Fence{Key: "k", Token: 2}.SetHeaders(second.Header)
	rec := httptest.NewRecorder()
	secondDone := make(chan struct{})
	go func() {
		h.ServeHTTP(rec, second)
		close(secondDone)
	}()
	testutil.WaitFor(t, "the second request to queue", 10*time.Second, func() bool { return g.waiters("k") == 2 })
	cancel()
	<-secondDone
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503", rec.Code)
	}
	close(release)
	<-firstDone
	if n := g.waiters("k"); n != 0 {
		t.Fatalf("%d lock users left", n)
	}
}
