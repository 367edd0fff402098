package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
	"github.com/tenure-io/tenure/internal/tlsconfig"
)

// TestHTTPListenerUnderAuth: issue 26's first row, tried again the same
// way against a real `tenure serve --auth` whose HTTP listener has TLS
// (--http-tls-cert, client certificates verified against --tls-client-ca)
// and --pprof. curl with no credential used to read elections (a
// password), dead letters (a card number), /metrics and /debug/pprof, and
// to requeue; each is now 401 and changes nothing. The management token
// reads them; the development client certificate, bound to a policy that
// reads locks only, reads the elections but not the dead letters (403);
// a foreign Host is 421.
func TestHTTPListenerUnderAuth(t *testing.T) {
	root := t.TempDir()
	certs := filepath.Join(root, "certs")
	if r := tenure(t, "127.0.0.1:1", "cert", "dev", "--dir", certs); r.code != 0 {
		t.Fatalf("cert dev: exit %d, %s", r.code, r.stderr)
	}
	f := func(n string) string { return filepath.Join(certs, n) }
	addr, httpAddr := freeAddr(t), freeAddr(t)
	p := start(t, "server", addr, "serve", "--listen", addr, "--data-dir", filepath.Join(root, "d"), "--auth", "--pprof",
		"--tls-cert", f("server.pem"), "--tls-key", f("server-key.pem"), "--tls-client-ca", f("ca.pem"),
		"--http-listen", httpAddr, "--http-tls-cert", f("server.pem"), "--http-tls-key", f("server-key.pem"))
	testutil.WaitFor(t, "the server's ready line", 30*time.Second, func() bool {
		if p.exited() {
			t.Fatalf("server exited with %d: %s", p.status, p.stderr())
		}
		return strings.HasPrefix(p.stdout(), "tenure: serving on "+addr)
	})
	tlsCfg, err := tlsconfig.ClientConfig(f("ca.pem"), f("client.pem"), f("client-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	boot, err := dial(t, ctx, addr, client.WithTLS(tlsCfg)).BootstrapACL(ctx)
	if err != nil {
		t.Fatal(err)
	}
	admin := dial(t, ctx, addr, client.WithTLS(tlsCfg), client.WithAuthToken(boot.Secret))
	if err := admin.CreatePolicy(ctx, &pb.AclPolicy{Name: "lock-viewer", Rules: []*pb.AclRule{{Kind: "lock", Access: "read"}}}, false); err != nil {
		t.Fatal(err)
	}
	if err := admin.BindIdentity(ctx, tlsconfig.DevClientName, []string{"lock-viewer"}); err != nil {
		t.Fatal(err)
	}
	// A password in an election's value, a card number in a dead letter.
	s, err := admin.NewSession(ctx, client.WithOwner("db-primary"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	e, _ := s.Election("db")
	if _, err := e.Campaign(ctx, []byte("password=hunter2")); err != nil {
		t.Fatal(err)
	}
	q := admin.Queue("payments")
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

	ca, err := os.ReadFile(f("ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	clientCert, err := tls.LoadX509KeyPair(f("client.pem"), f("client-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	do := func(method, path, secret, host string, certs ...tls.Certificate) (int, string) {
		t.Helper()
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: certs, MinVersion: tls.VersionTLS12}}
		defer tr.CloseIdleConnections()
		var body io.Reader
		if method == http.MethodPost {
			body = strings.NewReader(`{"queue":"payments","ids":[]}`)
		}
		req, err := http.NewRequest(method, "https://"+httpAddr+path, body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Tenure-Dashboard", "1")
		if secret != "" {
			req.Header.Set("Authorization", "Bearer "+secret)
		}
		if host != "" {
			req.Host = host
		}
		resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, path := range []string{"/api/sessions", "/api/locks", "/api/elections", "/api/dead?queue=payments", "/metrics", "/debug/pprof/"} {
		if code, body := do(http.MethodGet, path, "", ""); code != http.StatusUnauthorized || strings.Contains(body, "4111") || strings.Contains(body, "hunter2") {
			t.Errorf("anonymous GET %s: %d %.200q, want 401", path, code, body)
		}
		if code, body := do(http.MethodGet, path, boot.Secret, ""); code != http.StatusOK {
			t.Errorf("GET %s with the management token: %d %.200q, want 200", path, code, body)
		}
	}
	if code, body := do(http.MethodPost, "/api/requeue", "", ""); code != http.StatusUnauthorized {
		t.Errorf("anonymous requeue: %d %q, want 401", code, body)
	}
	if st, err := q.Stats(ctx); err != nil || st.Dead != 1 {
		t.Fatalf("after the anonymous requeue: %+v %v, want the dead letter still dead", st, err)
	}
	if code, body := do(http.MethodGet, "/api/elections", "", "", clientCert); code != http.StatusOK || !strings.Contains(body, "hunter2") {
		t.Errorf("elections with the bound client certificate: %d %.200q, want 200", code, body)
	}
	if code, body := do(http.MethodGet, "/api/dead?queue=payments", "", "", clientCert); code != http.StatusForbidden || strings.Contains(body, "4111") {
		t.Errorf("dead letters with a certificate that reads locks only: %d %.200q, want 403", code, body)
	}
	if code, _ := do(http.MethodGet, "/api/locks", boot.Secret, "rebound.example:"+strings.Split(httpAddr, ":")[1]); code != http.StatusMisdirectedRequest {
		t.Errorf("a foreign Host with the management token: %d, want 421", code)
	}
	if code, body := do(http.MethodGet, "/healthz", "", ""); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
}
