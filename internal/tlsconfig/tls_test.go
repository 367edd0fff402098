package tlsconfig_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/testutil"
	"github.com/tenure-io/tenure/internal/tlsconfig"
)

// pki is a CA with a server and a client certificate issued by it,
// written to dir.
type pki struct {
	ca                    *tlsconfig.CA
	caFile                string
	serverCert, serverKey string
	clientCert, clientKey string
}

func newPKI(t *testing.T, dir, name string) *pki {
	t.Helper()
	ca, err := tlsconfig.NewCA(name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p := &pki{ca: ca, caFile: filepath.Join(dir, name+"-ca.pem")}
	write(t, p.caFile, ca.PEM)
	srv, err := ca.Issue("server", []string{"127.0.0.1"}, tlsconfig.ServerAuth, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p.serverCert, p.serverKey = filepath.Join(dir, name+"-server.pem"), filepath.Join(dir, name+"-server-key.pem")
	write(t, p.serverCert, srv.CertPEM)
	write(t, p.serverKey, srv.KeyPEM)
	cl, err := ca.Issue("client-of-"+name, nil, tlsconfig.ClientAuth, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p.clientCert, p.clientKey = filepath.Join(dir, name+"-client.pem"), filepath.Join(dir, name+"-client-key.pem")
	write(t, p.clientCert, cl.CertPEM)
	write(t, p.clientKey, cl.KeyPEM)
	return p
}

func write(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	// Through a rename, as certificate managers replace files.
	write(t, to+".tmp", b)
	if err := os.Rename(to+".tmp", to); err != nil {
		t.Fatal(err)
	}
}

func pool(t *testing.T, file string) *x509.CertPool {
	t.Helper()
	p, err := tlsconfig.LoadPool(file)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// status makes one request with opts and returns its error.
func status(t *testing.T, addr string, opts ...client.Option) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Status(ctx)
	return err
}

func startTLS(t *testing.T, files tlsconfig.Files) *testutil.Server {
	t.Helper()
	r, err := tlsconfig.New(files, tlsconfig.Server, nil)
	if err != nil {
		t.Fatal(err)
	}
	return testutil.StartConfig(t, daemon.Config{TLS: r.ServerConfig()})
}

// TestTLSRefusesWrongCAAndPlaintext: a client that trusts another CA, or
// speaks plaintext, gets nothing from a TLS server; one that trusts its
// CA does.
func TestTLSRefusesWrongCAAndPlaintext(t *testing.T) {
	dir := t.TempDir()
	good, other := newPKI(t, dir, "good"), newPKI(t, dir, "other")
	s := startTLS(t, tlsconfig.Files{Cert: good.serverCert, Key: good.serverKey})

	if err := status(t, s.Addr(), client.WithTLS(&tls.Config{RootCAs: pool(t, good.caFile)})); err != nil {
		t.Fatalf("client trusting the server's CA: %v", err)
	}
	if err := status(t, s.Addr(), client.WithTLS(&tls.Config{RootCAs: pool(t, other.caFile)})); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("client trusting another CA: got %v, want it refused (unavailable)", err)
	}
	if err := status(t, s.Addr()); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("plaintext client: got %v, want it refused (unavailable)", err)
	}
}

// TestTLSClientCertificateRequired: with a client CA, a client without a
// certificate, or with one from another CA, is refused.
func TestTLSClientCertificateRequired(t *testing.T) {
	dir := t.TempDir()
	good, other := newPKI(t, dir, "good"), newPKI(t, dir, "other")
	s := startTLS(t, tlsconfig.Files{Cert: good.serverCert, Key: good.serverKey, CA: good.caFile})
	cfg := func(certFile, keyFile string) client.Option {
		c, err := tlsconfig.ClientConfig(good.caFile, certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		return client.WithTLS(c)
	}
	if err := status(t, s.Addr(), cfg(good.clientCert, good.clientKey)); err != nil {
		t.Fatalf("client with a certificate of the client CA: %v", err)
	}
	if err := status(t, s.Addr(), cfg("", "")); err == nil {
		t.Fatal("client without a certificate was served")
	}
	if err := status(t, s.Addr(), cfg(other.clientCert, other.clientKey)); err == nil {
		t.Fatal("client with a certificate of another CA was served")
	}
}

// TestTLSRotationWithoutRestart: replacing the certificate files makes
// the running server present the new certificate to new connections.
func TestTLSRotationWithoutRestart(t *testing.T) {
	dir := t.TempDir()
	oldPKI, newer := newPKI(t, dir, "old"), newPKI(t, dir, "new")
	cert, key := filepath.Join(dir, "live.pem"), filepath.Join(dir, "live-key.pem")
	copyFile(t, oldPKI.serverCert, cert)
	copyFile(t, oldPKI.serverKey, key)
	s := startTLS(t, tlsconfig.Files{Cert: cert, Key: key})

	trustOld := client.WithTLS(&tls.Config{RootCAs: pool(t, oldPKI.caFile)})
	trustNew := client.WithTLS(&tls.Config{RootCAs: pool(t, newer.caFile)})
	if err := status(t, s.Addr(), trustOld); err != nil {
		t.Fatalf("before rotation: %v", err)
	}
	if err := status(t, s.Addr(), trustNew); err == nil {
		t.Fatal("before rotation, a client trusting only the new CA was served")
	}
	// Key first, then certificate: between the two the pair does not
	// match, and the server must keep the old one meanwhile.
	copyFile(t, newer.serverKey, key)
	if err := status(t, s.Addr(), trustOld); err != nil {
		t.Fatalf("with a key that does not match its certificate yet, the old pair must stay: %v", err)
	}
	// A rewrite within one mtime tick of the last load would not be
	// seen; move the timestamp on so the test does not depend on the
	// file system's resolution.
	copyFile(t, newer.serverCert, cert)
	later := time.Now().Add(2 * time.Second)
	for _, f := range []string{cert, key} {
		if err := os.Chtimes(f, later, later); err != nil {
			t.Fatal(err)
		}
	}
	if err := status(t, s.Addr(), trustNew); err != nil {
		t.Fatalf("after rotation, a client trusting the new CA: %v", err)
	}
	if err := status(t, s.Addr(), trustOld); err == nil {
		t.Fatal("after rotation, the old certificate is still served")
	}
}

// TestReloadKeepsWorkingConfig: Reload of files that do not load fails
// and keeps the configuration that works.
func TestReloadKeepsWorkingConfig(t *testing.T) {
	dir := t.TempDir()
	p := newPKI(t, dir, "a")
	r, err := tlsconfig.New(tlsconfig.Files{Cert: p.serverCert, Key: p.serverKey}, tlsconfig.Server, nil)
	if err != nil {
		t.Fatal(err)
	}
	before := r.Config()
	write(t, p.serverKey, []byte("not a key"))
	if err := r.Reload(); err == nil {
		t.Fatal("Reload of a broken key succeeded")
	}
	if r.Config() != before {
		t.Fatal("a failed reload replaced the configuration")
	}
}

// TestWriteDev: the development files chain to their CA, for the names
// they are meant for, and are never overwritten.
func TestWriteDev(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if err := tlsconfig.WriteDev(dir); err != nil {
		t.Fatal(err)
	}
	roots := pool(t, filepath.Join(dir, "ca.pem"))
	for _, c := range []struct {
		cert, key string
		usage     x509.ExtKeyUsage
		host      string
	}{
		{"server.pem", "server-key.pem", x509.ExtKeyUsageServerAuth, "127.0.0.1"},
		{"server.pem", "server-key.pem", x509.ExtKeyUsageServerAuth, "localhost"},
		{"client.pem", "client-key.pem", x509.ExtKeyUsageClientAuth, ""},
		{"peer.pem", "peer-key.pem", x509.ExtKeyUsageServerAuth, "127.0.0.1"},
		{"peer.pem", "peer-key.pem", x509.ExtKeyUsageClientAuth, ""},
	} {
		pair, err := tls.LoadX509KeyPair(filepath.Join(dir, c.cert), filepath.Join(dir, c.key))
		if err != nil {
			t.Fatalf("%s: %v", c.cert, err)
		}
		if _, err := pair.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: c.host, KeyUsages: []x509.ExtKeyUsage{c.usage}}); err != nil {
			t.Errorf("%s for %q (%v): %v", c.cert, c.host, c.usage, err)
		}
		if st, _ := os.Stat(filepath.Join(dir, c.key)); st.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", c.key, st.Mode().Perm())
		}
	}
	if err := tlsconfig.WriteDev(dir); err == nil {
		t.Fatal("a second WriteDev overwrote the files")
	}
}
