package httpguard_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/guard/httpguard"
	"github.com/tenure-io/tenure/internal/testutil"
)

func dial(t *testing.T, addr string) *client.Client { return testutil.Dial(t, addr) }

// lock opens a session on c and takes the lock name.
func lock(t *testing.T, ctx context.Context, c *client.Client, name, owner string, ttl time.Duration) (*client.Session, *client.Hold) {
	t.Helper()
	s, err := c.NewSession(ctx, client.WithOwner(owner), client.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(cctx)
	})
	m, err := s.Mutex(name)
	if err != nil {
		t.Fatal(err)
	}
	h, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s, h
}

// effects records what the guarded handler applied, in order.
type effects struct {
	mu  sync.Mutex
	got []string
}

func (e *effects) handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, ok := httpguard.FromContext(r.Context())
		if !ok {
			http.Error(w, "no fence in context", http.StatusInternalServerError)
			return
		}
		body, _ := io.ReadAll(r.Body)
		e.mu.Lock()
		e.got = append(e.got, string(body)+"@"+strconv.FormatUint(f.Token, 10))
		e.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	})
}

func (e *effects) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.got...)
}

type reply struct {
	status int
	header http.Header
	body   map[string]any
}

// post sends body to url with the given headers (name → value; "" values
// are sent as empty headers).
func post(t *testing.T, url, body string, headers map[string]string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := reply{status: resp.StatusCode, header: resp.Header}
	raw, _ := io.ReadAll(resp.Body)
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			t.Fatalf("body %q: %v", raw, err)
		}
	}
	return r
}

func fenceHeaders(key string, token uint64) map[string]string {
	return map[string]string{httpguard.HeaderKey: key, httpguard.HeaderToken: strconv.FormatUint(token, 10)}
}

// TestRegisterStoreAcceptedAndStale: the late-write scenario against a real
// HTTP server whose high-water mark is a Tenure fenced register.
func TestRegisterStoreAcceptedAndStale(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := dial(t, srv.Addr())

	_, ha := lock(t, ctx, c, "shard-7", "A", 5*time.Second)
	tA := ha.Token()
	if err := ha.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	_, hb := lock(t, ctx, c, "shard-7", "B", 5*time.Second)
	tB := hb.Token()
	if tB <= tA {
		t.Fatalf("tokens %d then %d", tA, tB)
	}

	store, err := httpguard.NewRegisterStore(c, "")
	if err != nil {
		t.Fatal(err)
	}
	var staleSeen atomic.Uint64
	g, err := httpguard.New(httpguard.Config{
		Store:   store,
		OnStale: func(_ *http.Request, f httpguard.Fence, accepted uint64) { staleSeen.Store(accepted) },
	})
	if err != nil {
		t.Fatal(err)
	}
	var eff effects
	hs := httptest.NewServer(g.Wrap(eff.handler()))
	defer hs.Close()

	steps := []struct {
		name   string
		body   string
		token  uint64
		status int
	}{
		{"A writes under its grant", "v1", tA, http.StatusOK},
		{"B takes over", "v2", tB, http.StatusOK},
		{"B writes again with the same token", "v3", tB, http.StatusOK},
		{"A wakes up and writes late", "v1-late", tA, http.StatusConflict},
	}
	for _, st := range steps {
		r := post(t, hs.URL, st.body, fenceHeaders("shard-7", st.token))
		if r.status != st.status {
			t.Fatalf("%s: status %d, want %d (body %v)", st.name, r.status, st.status, r.body)
		}
	}
	r := post(t, hs.URL, "v1-late", fenceHeaders("shard-7", tA))
	want := map[string]any{"error": "stale fence token", "key": "shard-7", "token": float64(tA), "accepted_token": float64(tB)}
	if len(r.body) != len(want) {
		t.Fatalf("stale body %v, want %v", r.body, want)
	}
	for k, v := range want {
		if r.body[k] != v {
			t.Fatalf("stale body %v, want %v", r.body, want)
		}
	}
	if r.header.Get(httpguard.HeaderResult) != "stale" || r.header.Get(httpguard.HeaderAcceptedToken) != strconv.FormatUint(tB, 10) {
		t.Fatalf("stale headers %v", r.header)
	}
	if got := eff.list(); strings.Join(got, ",") != "v1@"+strconv.FormatUint(tA, 10)+",v2@"+strconv.FormatUint(tB, 10)+",v3@"+strconv.FormatUint(tB, 10) {
		t.Fatalf("effects %v: the late write must not reach the handler", got)
	}
	st := g.Stats()
	if st.Stale != 2 || st.Admitted != 3 || st.Invalid != 0 || st.StoreErrors != 0 {
		t.Fatalf("stats %+v", st)
	}
	if staleSeen.Load() != tB {
		t.Fatalf("OnStale saw accepted token %d, want %d", staleSeen.Load(), tB)
	}
	reg, err := c.FencedGet(ctx, store.Register("shard-7"))
	if err != nil || reg.Token != tB {
		t.Fatalf("register %+v %v, want token %d", reg, err, tB)
	}
}

func TestMissingOrInvalidHeadersAre400(t *testing.T) {
	g, err := httpguard.New(httpguard.Config{Store: newMemStore()})
	if err != nil {
		t.Fatal(err)
	}
	var eff effects
	hs := httptest.NewServer(g.Wrap(eff.handler()))
	defer hs.Close()
	cases := []struct {
		name    string
		headers map[string]string
		want    string // substring of the error message
	}{
		{"no headers", nil, "Tenure-Fence-Token header is missing"},
		{"no key", map[string]string{httpguard.HeaderToken: "5"}, "Tenure-Resource-Key header is missing"},
		{"empty token", map[string]string{httpguard.HeaderToken: "", httpguard.HeaderKey: "k"}, "Tenure-Fence-Token header is empty"},
		{"token not a number", map[string]string{httpguard.HeaderToken: "abc", httpguard.HeaderKey: "k"}, "want a decimal integer"},
		{"token zero", map[string]string{httpguard.HeaderToken: "0", httpguard.HeaderKey: "k"}, "want a decimal integer"},
		{"token negative", map[string]string{httpguard.HeaderToken: "-3", httpguard.HeaderKey: "k"}, "want a decimal integer"},
		{"token above 2^63-1", map[string]string{httpguard.HeaderToken: "9223372036854775808", httpguard.HeaderKey: "k"}, "want a decimal integer"},
		{"empty key", map[string]string{httpguard.HeaderToken: "5", httpguard.HeaderKey: ""}, "Tenure-Resource-Key header is empty"},
		{"long key", map[string]string{httpguard.HeaderToken: "5", httpguard.HeaderKey: strings.Repeat("k", 257)}, "the limit is 256"},
		{"empty operation id", map[string]string{httpguard.HeaderToken: "5", httpguard.HeaderKey: "k", httpguard.HeaderOperation: ""}, "Tenure-Operation-Id header is empty"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := post(t, hs.URL, "x", tc.headers)
			if r.status != http.StatusBadRequest {
				t.Fatalf("status %d, want 400", r.status)
			}
			msg, _ := r.body["error"].(string)
			if !strings.Contains(msg, tc.want) {
				t.Fatalf("error %q, want it to contain %q", msg, tc.want)
			}
		})
	}
	if got := eff.list(); len(got) != 0 {
		t.Fatalf("handler ran for invalid requests: %v", got)
	}
	if st := g.Stats(); st.Invalid != uint64(len(cases)) || st.Admitted != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestParseHeaders(t *testing.T) {
	cases := []struct {
		name    string
		h       http.Header
		want    httpguard.Fence
		errHdr  string
		errPart string
	}{
		{"valid", http.Header{"Tenure-Fence-Token": {"42"}, "Tenure-Resource-Key": {"shard-7"}}, httpguard.Fence{Key: "shard-7", Token: 42}, "", ""},
		{"valid with operation", http.Header{"Tenure-Fence-Token": {" 42 "}, "Tenure-Resource-Key": {"shard-7"}, "Tenure-Operation-Id": {"op-1"}}, httpguard.Fence{Key: "shard-7", Token: 42, OperationID: "op-1"}, "", ""},
		{"largest token", http.Header{"Tenure-Fence-Token": {"9223372036854775807"}, "Tenure-Resource-Key": {"k"}}, httpguard.Fence{Key: "k", Token: 1<<63 - 1}, "", ""},
		{"repeated token", http.Header{"Tenure-Fence-Token": {"1", "2"}, "Tenure-Resource-Key": {"k"}}, httpguard.Fence{}, httpguard.HeaderToken, "repeated"},
		{"repeated key", http.Header{"Tenure-Fence-Token": {"1"}, "Tenure-Resource-Key": {"a", "b"}}, httpguard.Fence{}, httpguard.HeaderKey, "repeated"},
		{"control character in key", http.Header{"Tenure-Fence-Token": {"1"}, "Tenure-Resource-Key": {"a\x01b"}}, httpguard.Fence{}, httpguard.HeaderKey, "printable"},
		{"long operation", http.Header{"Tenure-Fence-Token": {"1"}, "Tenure-Resource-Key": {"k"}, "Tenure-Operation-Id": {strings.Repeat("o", 257)}}, httpguard.Fence{}, httpguard.HeaderOperation, "limit"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := httpguard.ParseHeaders(tc.h)
			if tc.errHdr == "" {
				if err != nil || f != tc.want {
					t.Fatalf("got %+v, %v; want %+v", f, err, tc.want)
				}
				return
			}
			var he *httpguard.HeaderError
			if !errors.As(err, &he) || he.Header != tc.errHdr || !strings.Contains(he.Reason, tc.errPart) {
				t.Fatalf("error %v, want one about %s (%s)", err, tc.errHdr, tc.errPart)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	if _, err := httpguard.New(httpguard.Config{}); err == nil {
		t.Fatal("a guard with no check was accepted")
	}
	if _, err := httpguard.New(httpguard.Config{Store: newMemStore(), HandlerChecks: true}); err == nil {
		t.Fatal("a guard with two checks was accepted")
	}
	if _, err := httpguard.NewRegisterStore(nil, ""); err == nil {
		t.Fatal("nil registers accepted")
	}
	if _, err := httpguard.NewRegisterStore(&client.Client{}, strings.Repeat("p", 300)); err == nil {
		t.Fatal("a prefix leaving no room for keys was accepted")
	}
}

// failingStore fails every Advance.
type failingStore struct{}

func (failingStore) Advance(context.Context, string, uint64) (bool, uint64, error) {
	return false, 0, client.ErrUnknownOutcome
}

func TestStoreFailureIs503(t *testing.T) {
	var seen atomic.Value
	g, err := httpguard.New(httpguard.Config{Store: failingStore{}, OnError: func(_ *http.Request, _ httpguard.Fence, err error) { seen.Store(err) }})
	if err != nil {
		t.Fatal(err)
	}
	var eff effects
	hs := httptest.NewServer(g.Wrap(eff.handler()))
	defer hs.Close()
	r := post(t, hs.URL, "x", fenceHeaders("k", 3))
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503", r.status)
	}
	if len(eff.list()) != 0 {
		t.Fatal("handler ran although the fence could not be checked")
	}
	if err, _ := seen.Load().(error); !errors.Is(err, client.ErrUnknownOutcome) {
		t.Fatalf("OnError saw %v", err)
	}
	if st := g.Stats(); st.StoreErrors != 1 || st.Admitted != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestHandlerChecks: the middleware only parses; the handler checks in its
// own step and calls Reject.
func TestHandlerChecks(t *testing.T) {
	g, err := httpguard.New(httpguard.Config{HandlerChecks: true})
	if err != nil {
		t.Fatal(err)
	}
	store := newMemStore()
	var applied atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, _ := httpguard.FromContext(r.Context())
		// A real handler runs this in its database transaction together
		// with the effect (see pgstore.Store.AdvanceTx, pgguard.Do).
		ok, cur, _ := store.Advance(r.Context(), f.Key, f.Token)
		if !ok {
			g.Reject(w, r, f, cur)
			return
		}
		applied.Add(1)
	})
	hs := httptest.NewServer(g.Wrap(h))
	defer hs.Close()
	if r := post(t, hs.URL, "", fenceHeaders("k", 10)); r.status != http.StatusOK {
		t.Fatalf("status %d", r.status)
	}
	r := post(t, hs.URL, "", fenceHeaders("k", 9))
	if r.status != http.StatusConflict || r.body["accepted_token"] != float64(10) || r.body["token"] != float64(9) {
		t.Fatalf("stale answer %d %v", r.status, r.body)
	}
	if applied.Load() != 1 || g.Stats().Stale != 1 || g.Stats().Admitted != 2 {
		t.Fatalf("applied %d, stats %+v", applied.Load(), g.Stats())
	}
}

// TestTransport: the client side adds the headers from a hold, refuses to
// send once the hold is released, suspect or lost, and cancels a request
// in flight when the hold turns suspect.
func TestTransport(t *testing.T) {
	testutil.Slow(t)
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := dial(t, srv.Addr())
	store, err := httpguard.NewRegisterStore(c, "tx/")
	if err != nil {
		t.Fatal(err)
	}
	g, err := httpguard.New(httpguard.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	var (
		reached   atomic.Int64 // requests that reached the HTTP server at all
		eff       effects
		blockedIn = make(chan struct{}, 1)
		unblock   = make(chan struct{})
	)
	guarded := g.Wrap(eff.handler())
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		if r.URL.Path == "/slow" {
			blockedIn <- struct{}{}
			select {
			case <-unblock:
			case <-r.Context().Done():
			}
			return
		}
		if got := r.Header.Get(httpguard.HeaderOperation); r.URL.Path == "/op" && got != "op-7" {
			http.Error(w, "operation id not forwarded: "+got, http.StatusBadRequest)
			return
		}
		guarded.ServeHTTP(w, r)
	}))
	defer hs.Close()
	defer close(unblock)

	send := func(hc *http.Client, path string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+path, strings.NewReader("v"))
		if err != nil {
			t.Fatal(err)
		}
		if path == "/op" {
			httpguard.WithOperationID(req, "op-7")
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		resp.Body = io.NopCloser(bytes.NewReader(b))
		return resp, err
	}

	// A holds: its requests carry its token and are accepted.
	_, ha := lock(t, ctx, c, "res", "A", 5*time.Second)
	ta, err := httpguard.NewTransport(nil, ha, "res")
	if err != nil {
		t.Fatal(err)
	}
	hca := &http.Client{Transport: ta}
	for _, path := range []string{"/", "/op"} {
		resp, err := send(hca, path)
		if err != nil || resp.StatusCode != http.StatusOK || httpguard.CheckResponse(resp) != nil {
			t.Fatalf("A's request to %s: %v %v", path, resp, err)
		}
	}

	// Released: nothing is sent.
	if err := ha.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	before := reached.Load()
	if _, err := send(hca, "/"); !errors.Is(err, client.ErrNotHeld) {
		t.Fatalf("send after release: %v, want ErrNotHeld", err)
	}
	if reached.Load() != before {
		t.Fatal("a request was sent for a released hold")
	}

	// B holds next through a proxy that the test can stall.
	px := testutil.StartProxy(t, srv.Addr())
	cb := dial(t, px.Addr())
	_, hb := lock(t, ctx, cb, "res", "B", 2*time.Second)
	tb, err := httpguard.NewTransport(nil, hb, "res")
	if err != nil {
		t.Fatal(err)
	}
	hcb := &http.Client{Transport: tb}
	if resp, err := send(hcb, "/"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("B's request: %v %v", resp, err)
	}
	// A request in flight is cancelled when B's hold turns suspect.
	errc := make(chan error, 1)
	go func() {
		_, err := send(hcb, "/slow")
		errc <- err
	}()
	<-blockedIn
	px.Pause(true, true)
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), "hold stopped being held") {
			t.Fatalf("in-flight request ended with %v, want cancellation by the hold", err)
		}
	case <-ctx.Done():
		t.Fatal("in-flight request was not cancelled when the hold turned suspect")
	}
	// Suspect or lost: refused without sending.
	before = reached.Load()
	if _, err := send(hcb, "/"); !errors.Is(err, client.ErrNotHeld) {
		t.Fatalf("send while %v: %v, want ErrNotHeld", hb.State(), err)
	}
	select {
	case <-hb.Done():
	case <-ctx.Done():
		t.Fatal("hold never reached lost")
	}
	if hb.State() != client.Lost {
		t.Fatalf("state %v, want lost", hb.State())
	}
	if _, err := send(hcb, "/"); !errors.Is(err, client.ErrNotHeld) {
		t.Fatalf("send while lost: %v, want ErrNotHeld", err)
	}
	if reached.Load() != before {
		t.Fatal("a request was sent for a suspect or lost hold")
	}

	// C takes over; B's token, sent by a process that passed its own check
	// before pausing, is answered stale and CheckResponse says so.
	_, hc := lock(t, ctx, c, "res", "C", 5*time.Second)
	tc, err := httpguard.NewTransport(nil, hc, "res")
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := send(&http.Client{Transport: tc}, "/"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("C's request: %v %v", resp, err)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL, strings.NewReader("late"))
	httpguard.Fence{Key: "res", Token: hb.Token()}.SetHeaders(req.Header)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var se *httpguard.StaleError
	if err := httpguard.CheckResponse(resp); !errors.Is(err, client.ErrStale) || !errors.As(err, &se) || se.AcceptedToken != hc.Token() || se.Token != hb.Token() {
		t.Fatalf("CheckResponse: %v, want stale with accepted token %d", err, hc.Token())
	}
	if got := g.Stats(); got.Stale != 1 {
		t.Fatalf("stats %+v", got)
	}
}

func TestNewTransportValidates(t *testing.T) {
	h := fakeHold{token: 5, state: client.Held}
	if _, err := httpguard.NewTransport(nil, nil, "k"); err == nil {
		t.Fatal("nil hold accepted")
	}
	if _, err := httpguard.NewTransport(nil, h, ""); err == nil {
		t.Fatal("empty key accepted")
	}
	if _, err := httpguard.NewTransport(nil, fakeHold{token: 0, state: client.Held}, "k"); err == nil {
		t.Fatal("zero token accepted")
	}
}

type fakeHold struct {
	token uint64
	state client.State
}

func (h fakeHold) Token() uint64            { return h.token }
func (h fakeHold) State() client.State      { return h.state }
func (h fakeHold) Context() context.Context { return context.Background() }

// memStore is an in-memory Store for tests of the middleware alone.
type memStore struct {
	mu   sync.Mutex
	mark map[string]uint64
}

func newMemStore() *memStore { return &memStore{mark: make(map[string]uint64)} }

func (s *memStore) Advance(_ context.Context, key string, token uint64) (bool, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if token < s.mark[key] {
		return false, s.mark[key], nil
	}
	s.mark[key] = token
	return true, token, nil
}
