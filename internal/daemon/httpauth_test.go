package daemon_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/testutil"
	"github.com/tenure-io/tenure/internal/tlsconfig"
)

// httpNode is a node run with --auth and an HTTP listener (with pprof),
// bootstrapped, with a dead letter in queue "payments" (payload "4111
// 1111 1111 1111"), an election "db" whose value is a password, a lock
// "app/1" and a lock "ops/1" held.
type httpNode struct {
	t     *testing.T
	srv   *testutil.Server
	admin *client.Client
	mgmt  string // the management token's secret
	base  string
	n     atomic.Int64
	log   *logBuffer
}

func startHTTPNode(t *testing.T, cfg daemon.Config) *httpNode {
	t.Helper()
	cfg.Auth, cfg.HTTPListen, cfg.Pprof = true, "127.0.0.1:0", true
	h := &httpNode{t: t, log: &logBuffer{}}
	cfg.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(h.log, testLog{t}), nil))
	srv := testutil.StartConfig(t, cfg)
	h.srv, h.base = srv, "http://"+srv.HTTPAddr()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tok, err := testutil.Dial(t, srv.Addr()).BootstrapACL(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h.mgmt = tok.Secret
	h.admin = testutil.Dial(t, srv.Addr(), client.WithAuthToken(tok.Secret))
	s := testutil.Session(t, ctx, h.admin, client.WithOwner("db-primary"))
	e, _ := s.Election("db")
	if _, err := e.Campaign(ctx, []byte("password=hunter2")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"app/1", "ops/1"} {
		m, _ := s.Mutex(name)
		if _, err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	q := h.admin.Queue("payments")
	if _, err := q.Enqueue(ctx, []byte("4111 1111 1111 1111"), client.WithMaxAttempts(1)); err != nil {
		t.Fatal(err)
	}
	d, err := q.Dequeue(ctx, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Nack(ctx, d); err != nil {
		t.Fatal(err)
	}
	if _, err := h.admin.Queue("app-jobs").Enqueue(ctx, []byte("x")); err != nil {
		t.Fatal(err)
	}
	return h
}

// testLog passes a server's log on to the test's.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// token creates a token whose one policy has rules (KIND:PREFIX:ACCESS)
// and returns its secret.
func (h *httpNode) token(rules ...string) string {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := &pb.AclPolicy{Name: fmt.Sprintf("p%d", h.n.Add(1))}
	for _, s := range rules {
		r, err := fsm.ParseRule(s)
		if err != nil {
			h.t.Fatal(err)
		}
		p.Rules = append(p.Rules, &pb.AclRule{Kind: string(r.Kind), Prefix: r.Prefix, Access: r.Access.String()})
	}
	if err := h.admin.CreatePolicy(ctx, p, false); err != nil {
		h.t.Fatal(err)
	}
	tok, err := h.admin.CreateToken(ctx, []string{p.Name}, "http test")
	if err != nil {
		h.t.Fatal(err)
	}
	return tok.Secret
}

// do sends method path with the bearer token secret ("" none) and extra
// headers (name, value pairs); it returns the status, the body and the
// response's headers.
func (h *httpNode) do(method, path, secret, body string, headers ...string) (int, string, http.Header) {
	h.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	// A stream (/api/events) answered 200 would never end: read what
	// comes within a few seconds.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, h.base+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if strings.EqualFold(headers[i], "Host") {
			req.Host = headers[i+1]
			continue
		}
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body) // a stream's read ends with the context
	return resp.StatusCode, string(b), resp.Header
}

// deadCount is the number of dead letters of queue payments.
func (h *httpNode) deadCount() int {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := h.admin.Queue("payments").Stats(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	return st.Dead
}

// protectedPaths are the HTTP listener's paths that carry data or
// actions; every one needs a credential under --auth.
var protectedPaths = []string{
	"/api/cluster", "/api/sessions", "/api/locks", "/api/lock?name=app/1", "/api/elections",
	"/api/queues", "/api/dead?queue=payments", "/api/events", "/metrics", "/debug/pprof/",
	"/debug/pprof/cmdline", "/debug/pprof/heap",
}

// TestHTTPListenerNeedsACredential: on an --auth node, curl with no
// credential (or an unknown one) used to read sessions, locks, elections
// (a password), dead letters (a card number), /metrics and /debug/pprof,
// and requeue dead letters. Every one of them is now 401 and changes
// nothing; /healthz and /readyz stay open.
func TestHTTPListenerNeedsACredential(t *testing.T) {
	h := startHTTPNode(t, daemon.Config{})
	for _, secret := range []string{"", "not-a-token"} {
		for _, p := range protectedPaths {
			code, body, hdr := h.do(http.MethodGet, p, secret, "")
			if code != http.StatusUnauthorized {
				t.Errorf("GET %s with token %q: %d %.200q, want 401", p, secret, code, body)
			}
			if strings.Contains(body, "hunter2") || strings.Contains(body, "4111") {
				t.Errorf("GET %s with token %q leaked a secret: %.200q", p, secret, body)
			}
			if hdr.Get("WWW-Authenticate") == "" {
				t.Errorf("GET %s: 401 without WWW-Authenticate", p)
			}
		}
		code, body, _ := h.do(http.MethodPost, "/api/requeue", secret, `{"queue":"payments","ids":[]}`, "X-Tenure-Dashboard", "1", "Content-Type", "application/json")
		if code != http.StatusUnauthorized {
			t.Errorf("POST /api/requeue with token %q: %d %q, want 401", secret, code, body)
		}
	}
	if n := h.deadCount(); n != 1 {
		t.Fatalf("after the anonymous requeues: %d dead letters, want 1 (nothing requeued)", n)
	}
	// A header that is not a bearer token is no credential either.
	if code, _, _ := h.do(http.MethodGet, "/api/locks", "", "", "Authorization", "Basic dXNlcjpwYXNz"); code != http.StatusUnauthorized {
		t.Errorf("GET /api/locks with basic auth: %d, want 401", code)
	}
	for path, want := range map[string]string{"/healthz": "ok\n", "/readyz": "ready\n"} {
		if code, body, _ := h.do(http.MethodGet, path, "", ""); code != http.StatusOK || body != want {
			t.Errorf("GET %s anonymous: %d %q, want 200 %q", path, code, body, want)
		}
	}
	// The page itself holds no data: it loads, and asks for a token.
	if code, body, _ := h.do(http.MethodGet, "/", "", ""); code != http.StatusOK || !strings.Contains(body, "token") {
		t.Errorf("GET / anonymous: %d %.300q, want the page asking for a token", code, body)
	}
	// Management reads everything.
	for _, p := range protectedPaths {
		if p == "/api/events" || p == "/debug/pprof/heap" {
			continue // a stream; a profile (slow-ish): the others prove the door
		}
		if code, body, _ := h.do(http.MethodGet, p, h.mgmt, ""); code != http.StatusOK {
			t.Errorf("GET %s with the management token: %d %.200q", p, code, body)
		}
	}
	if code, body, _ := h.do(http.MethodGet, "/api/elections", h.mgmt, ""); !strings.Contains(body, "hunter2") {
		t.Errorf("elections with the management token: %d %q", code, body)
	}
}

// TestHTTPListenerChecksRights: a known token without the right is 403
// (logged as the gRPC API's refusals are); one with read rights on part
// of the names sees that part only; /metrics needs cluster read and
// /debug/pprof cluster write (the management policy's); a requeue is the
// API's QueueDeadRequeue, refused without queue write and counted.
// (The refusals checked in the log come first: the log takes at most 10
// refusals a second.)
func TestHTTPListenerChecksRights(t *testing.T) {
	h := startHTTPNode(t, daemon.Config{})
	// Requeue: read on the queue is not enough (403, nothing requeued);
	// write is, through the API's QueueDeadRequeue.
	payRead := h.token("queue:payments:read")
	requeue := func(secret string) (int, string) {
		code, body, _ := h.do(http.MethodPost, "/api/requeue", secret, `{"queue":"payments","ids":[]}`, "X-Tenure-Dashboard", "1", "Content-Type", "application/json")
		return code, body
	}
	if code, body := requeue(payRead); code != http.StatusForbidden {
		t.Errorf("requeue with queue read: %d %q, want 403", code, body)
	}
	if n := h.deadCount(); n != 1 {
		t.Fatalf("after a refused requeue: %d dead letters, want 1", n)
	}
	payWrite := h.token("queue:payments:write")
	if code, body := requeue(payWrite); code != http.StatusOK || !strings.Contains(body, `"requeued":1`) {
		t.Errorf("requeue with queue write: %d %q", code, body)
	}
	if n := h.deadCount(); n != 0 {
		t.Fatalf("after the requeue: %d dead letters, want 0", n)
	}
	kvOnly := h.token("kv::read")
	for _, p := range protectedPaths {
		if p == "/api/events" {
			continue // any known caller may follow the revision
		}
		code, body, _ := h.do(http.MethodGet, p, kvOnly, "")
		if code != http.StatusForbidden {
			t.Errorf("GET %s with a kv-only token: %d %.200q, want 403", p, code, body)
		}
		if strings.Contains(body, "hunter2") || strings.Contains(body, "4111") {
			t.Errorf("GET %s with a kv-only token leaked a secret: %.200q", p, body)
		}
	}
	reader := h.token("cluster::read")
	if code, _, _ := h.do(http.MethodGet, "/metrics", reader, ""); code != http.StatusOK {
		t.Errorf("/metrics with cluster read: %d", code)
	}
	if code, _, _ := h.do(http.MethodGet, "/debug/pprof/", reader, ""); code != http.StatusForbidden {
		t.Errorf("/debug/pprof/ with cluster read only: %d, want 403", code)
	}

	// Read rights on app/ only: the app/ lock, queue and no election.
	app := h.token("lock:app/:read", "queue:app-:read", "session::read")
	var locks struct {
		Locks []struct{ Name string } `json:"locks"`
	}
	h.getJSON("/api/locks", app, &locks)
	if len(locks.Locks) != 1 || locks.Locks[0].Name != "app/1" {
		t.Errorf("locks seen with lock:app/:read: %+v, want app/1 only", locks)
	}
	var el struct {
		Elections []struct{ Name, Value string } `json:"elections"`
	}
	h.getJSON("/api/elections", app, &el)
	if len(el.Elections) != 0 {
		t.Errorf("elections seen with lock:app/:read: %+v, want none", el)
	}
	var qs struct {
		Queues []struct{ Name string } `json:"queues"`
	}
	h.getJSON("/api/queues", app, &qs)
	if len(qs.Queues) != 1 || qs.Queues[0].Name != "app-jobs" {
		t.Errorf("queues seen with queue:app-:read: %+v, want app-jobs only", qs)
	}
	var ss struct {
		Sessions []struct {
			Owner string   `json:"owner"`
			Held  []string `json:"held"`
		} `json:"sessions"`
	}
	h.getJSON("/api/sessions", app, &ss)
	if len(ss.Sessions) != 1 || fmt.Sprint(ss.Sessions[0].Held) != "[app/1]" {
		t.Errorf("sessions seen with lock:app/:read: %+v, want one holding app/1 only", ss)
	}
	for _, p := range []string{"/api/lock?name=ops/1", "/api/dead?queue=payments", "/api/cluster"} {
		if code, body, _ := h.do(http.MethodGet, p, app, ""); code != http.StatusForbidden {
			t.Errorf("GET %s with app/ rights: %d %.200q, want 403", p, code, body)
		}
	}

	// Both went through the API's method: counted under its name, the
	// refusal logged as the API logs its refusals.
	code, body, _ := h.do(http.MethodGet, "/metrics", h.mgmt, "")
	if code != http.StatusOK || !strings.Contains(body, `tenure_rpc_requests_total{code="OK",method="QueueDeadRequeue"} 1`) ||
		!strings.Contains(body, `tenure_rpc_requests_total{code="PermissionDenied",method="QueueDeadRequeue"} 1`) {
		t.Errorf("the requeues are not counted as QueueDeadRequeue calls:\n%s", grepLines(body, "QueueDeadRequeue"))
	}
	h.log.mu.Lock()
	logged := h.log.b.String()
	h.log.mu.Unlock()
	for _, want := range []string{"method=QueueDeadRequeue code=PermissionDenied", `method="HTTP GET /debug/pprof/"`, `method="HTTP GET /api/locks"`} {
		if !strings.Contains(logged, want) {
			t.Errorf("the log has no refusal with %s", want)
		}
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// getJSON GETs path with secret, wants 200, and decodes the body into v.
func (h *httpNode) getJSON(path, secret string, v any) {
	h.t.Helper()
	code, body, _ := h.do(http.MethodGet, path, secret, "")
	if code != http.StatusOK {
		h.t.Fatalf("GET %s: %d %q", path, code, body)
	}
	if err := json.Unmarshal([]byte(body), v); err != nil {
		h.t.Fatalf("GET %s: %v in %q", path, err, body)
	}
}

// TestHTTPListenerHostAndHeaders: a request whose Host is not the
// listener's (DNS rebinding: a page of evil.example whose name now points
// at 127.0.0.1) is refused with one line, credential or not; every answer
// carries the CSP, frame and content-type headers.
func TestHTTPListenerHostAndHeaders(t *testing.T) {
	h := startHTTPNode(t, daemon.Config{HTTPAllowedHosts: []string{"tenure.internal"}})
	_, port, _ := strings.Cut(h.srv.HTTPAddr(), ":")
	for _, host := range []string{"evil.example", "evil.example:" + port, "127.0.0.1.evil.example:" + port} {
		code, body, _ := h.do(http.MethodGet, "/api/locks", h.mgmt, "", "Host", host)
		if code != http.StatusMisdirectedRequest || strings.Count(body, "\n") != 1 || !strings.Contains(body, "Host") || strings.Contains(body, "app/1") {
			t.Errorf("Host %s: %d %q, want 421 and one line", host, code, body)
		}
	}
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "[::1]:" + port, "LOCALHOST", "tenure.internal", "tenure.internal:" + port} {
		if code, body, _ := h.do(http.MethodGet, "/api/locks", h.mgmt, "", "Host", host); code != http.StatusOK {
			t.Errorf("Host %s: %d %q, want 200", host, code, body)
		}
	}
	for _, p := range []string{"/", "/static/app.js", "/healthz", "/api/locks", "/metrics", "/no-such-page"} {
		for _, secret := range []string{"", h.mgmt} {
			_, _, hdr := h.do(http.MethodGet, p, secret, "")
			csp := hdr.Get("Content-Security-Policy")
			if !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") ||
				hdr.Get("X-Frame-Options") != "DENY" || hdr.Get("X-Content-Type-Options") != "nosniff" {
				t.Errorf("GET %s (token %v): headers %v", p, secret != "", hdr)
			}
		}
	}
}

// TestHTTPListenerWithoutAuth: without --auth the listener serves as it
// did, anonymous, with the Host check and the headers.
func TestHTTPListenerWithoutAuth(t *testing.T) {
	srv := testutil.StartConfig(t, daemon.Config{HTTPListen: "127.0.0.1:0", Pprof: true})
	base := "http://" + srv.HTTPAddr()
	for _, p := range []string{"/api/locks", "/api/sessions", "/metrics", "/debug/pprof/"} {
		resp, err := http.Get(base + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Frame-Options") != "DENY" {
			t.Errorf("GET %s without --auth: %d %v", p, resp.StatusCode, resp.Header)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, base+"/api/locks", nil)
	req.Host = "evil.example"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("Host evil.example without --auth: %d, want 421", resp.StatusCode)
	}
}

// TestHTTPListenerTLSClientCertificate: on a TLS HTTP listener, a client
// certificate the client CA verifies identifies its caller as on the
// client API (its name bound to policies), without a token; a bearer
// token works over TLS too; neither is 401. A certificate is asked for
// but not required (a browser sends a token).
func TestHTTPListenerTLSClientCertificate(t *testing.T) {
	ca, err := tlsconfig.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue("127.0.0.1", []string{"127.0.0.1"}, tlsconfig.ServerAuth, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	serverCert, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	h := startHTTPNode(t, daemon.Config{HTTPTLS: &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientCAs: pool, ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12}})
	h.base = "https://" + h.srv.HTTPAddr()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.admin.CreatePolicy(ctx, &pb.AclPolicy{Name: "scraper", Rules: []*pb.AclRule{{Kind: "cluster", Access: "read"}}}, false); err != nil {
		t.Fatal(err)
	}
	if err := h.admin.BindIdentity(ctx, "prometheus", []string{"scraper"}); err != nil {
		t.Fatal(err)
	}
	clientLeaf, err := ca.Issue("prometheus", nil, tlsconfig.ClientAuth, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	clientCert, err := tls.X509KeyPair(clientLeaf.CertPEM, clientLeaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	get := func(path, secret string, certs ...tls.Certificate) int {
		t.Helper()
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: certs, MinVersion: tls.VersionTLS12}}
		defer tr.CloseIdleConnections()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, h.base+path, nil)
		if secret != "" {
			req.Header.Set("Authorization", "Bearer "+secret)
		}
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get("/metrics", "", clientCert); code != http.StatusOK {
		t.Errorf("/metrics with a bound client certificate: %d, want 200", code)
	}
	if code := get("/debug/pprof/", "", clientCert); code != http.StatusForbidden {
		t.Errorf("/debug/pprof/ with a certificate bound to cluster read: %d, want 403", code)
	}
	if code := get("/metrics", ""); code != http.StatusUnauthorized {
		t.Errorf("/metrics over TLS without a credential: %d, want 401", code)
	}
	if code := get("/metrics", h.mgmt); code != http.StatusOK {
		t.Errorf("/metrics over TLS with a token: %d, want 200", code)
	}
	// Plain HTTP to a TLS listener is no request at all.
	if resp, err := http.Get("http://" + h.srv.HTTPAddr() + "/metrics"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("plain HTTP to the TLS listener was served")
		}
	}
}

// TestHTTPEventsEndWhenTheTokenIsRevoked: the dashboard's change stream
// checks its caller again before every event: revoking the token ends it
// (the revocation is itself a change), and nothing is sent after.
func TestHTTPEventsEndWhenTheTokenIsRevoked(t *testing.T) {
	h := startHTTPNode(t, daemon.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tok, err := h.admin.CreateToken(ctx, []string{"management"}, "viewer")
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, h.base+"/api/events", nil)
	req.Header.Set("Authorization", "Bearer "+tok.Secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("events: %d", resp.StatusCode)
	}
	buf := make([]byte, 4096)
	n, err := resp.Body.Read(buf)
	if err != nil || !strings.HasPrefix(string(buf[:n]), "event: change") {
		t.Fatalf("first event: %q %v", buf[:n], err)
	}
	if err := h.admin.RevokeToken(ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(resp.Body) // ends when the server ends the stream
	if err != nil {
		t.Fatalf("the stream did not end after the revocation: %v (read %q)", err, rest)
	}
	if strings.Contains(string(rest), "event: change") {
		t.Fatalf("events after the revocation: %q", rest)
	}
}
