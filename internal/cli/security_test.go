package cli

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/testutil"
	"github.com/tenure-io/tenure/internal/tlsconfig"
)

// devCerts writes the development certificates into a temp dir.
func devCerts(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "certs")
	m := runJSON(t, "127.0.0.1:1", 0, "cert", "dev", "--dir", dir)
	if m["dir"] != dir || len(m["files"].([]any)) != len(tlsconfig.DevFiles) {
		t.Fatalf("cert dev -o json = %v", m)
	}
	return dir
}

// TestCLITLSFlags: with the files of `tenure cert dev`, --cacert, --cert
// and --key reach a server that requires client certificates; without
// them the command fails with one line.
func TestCLITLSFlags(t *testing.T) {
	dir := devCerts(t)
	f := func(n string) string { return filepath.Join(dir, n) }
	r, err := tlsconfig.New(tlsconfig.Files{Cert: f("server.pem"), Key: f("server-key.pem"), CA: f("ca.pem")}, tlsconfig.Server, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := testutil.StartConfig(t, daemon.Config{TLS: r.ServerConfig()})

	runJSON(t, s.Addr(), 0, "status", "--cacert", f("ca.pem"), "--cert", f("client.pem"), "--key", f("client-key.pem"))
	for _, args := range [][]string{
		{"status"},                          // plaintext
		{"status", "--cacert", f("ca.pem")}, // no client certificate
	} {
		res := run(t, s.Addr(), args...)
		if res.code != ExitError || !strings.HasPrefix(res.stderr, "tenure: ") || strings.Count(res.stderr, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q; want exit 1 and one line", args, res.code, res.stderr)
		}
	}
	if res := run(t, s.Addr(), "status", "--cert", f("client.pem")); res.code != ExitError || !strings.Contains(res.stderr, "--key") {
		t.Errorf("--cert without --key: exit %d, stderr %q", res.code, res.stderr)
	}
	t.Setenv(envCACert, f("ca.pem"))
	t.Setenv(envCert, f("client.pem"))
	t.Setenv(envKey, f("client-key.pem"))
	runJSON(t, s.Addr(), 0, "status") // the environment's defaults

}
