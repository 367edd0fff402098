//go:build linux || darwin

package nemesis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
	"github.com/tenure-io/tenure/internal/tlsconfig"
)

// The secure run: the whole suite with TLS for clients (client
// certificates required), mutual TLS between peers and --auth. The
// certificates come from `tenure cert dev`; every client of the suite, in
// process or in a child process (`tenure lock` and the helper it runs),
// reads them and the management token from the environment
// (TENURE_CACERT, TENURE_CERT, TENURE_KEY, TENURE_AUTH_TOKEN), which
// TestNemesisSecure sets and every child inherits. Without them the suite
// runs in plaintext as before.

// TestNemesisSecure runs TestNemesis's workloads and faults, the hostile
// client included, on a cluster with TLS and auth on: the checkers must
// find nothing, and the hostile client's attempts must still be refused
// (with the management token it has every right, so the refusals are the
// capabilities', not the ACLs').
func TestNemesisSecure(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if err := tlsconfig.WriteDev(dir); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TENURE_CACERT", filepath.Join(dir, "ca.pem"))
	t.Setenv("TENURE_CERT", filepath.Join(dir, "client.pem"))
	t.Setenv("TENURE_KEY", filepath.Join(dir, "client-key.pem"))
	t.Setenv(envAuthToken, "") // set once the cluster is bootstrapped
	t.Setenv(envSecureCerts, dir)
	d := min(*flagDuration, 20*time.Second)
	res := runSuite(t, suiteConfig{
		keys: 3, goPerKey: 2, readersPerKey: 1, procPerKey: 1,
		queue:     true,
		hostile:   true,
		duration:  d,
		schedule:  fullSchedule,
		maxFaults: max(1, int(d/time.Second)),
		seed:      *flagSeed,
	})
	for _, a := range res.report.anomalies {
		t.Errorf("anomaly [%s] %s", a.Check, a.Msg)
	}
	if res.accepted == 0 {
		t.Errorf("no write was accepted: the workload did not run")
	}
	if len(res.faults) == 0 {
		t.Errorf("no fault was injected")
	}
}

const (
	envAuthToken = "TENURE_AUTH_TOKEN"
	// envSecureCerts names the directory of the development certificates
	// the servers use; set only for the secure run.
	envSecureCerts = "NEMESIS_SECURE_CERTS"
)

// secureServeArgs are the servers' TLS and auth flags in the secure run.
func secureServeArgs() []string {
	dir := os.Getenv(envSecureCerts)
	if dir == "" {
		return nil
	}
	f := func(n string) string { return filepath.Join(dir, n) }
	return []string{"--tls-cert", f("server.pem"), "--tls-key", f("server-key.pem"), "--tls-client-ca", f("ca.pem"),
		"--peer-tls-cert", f("peer.pem"), "--peer-tls-key", f("peer-key.pem"), "--peer-tls-ca", f("ca.pem"), "--auth"}
}

// envToken puts the auth token of the environment on every RPC, read at
// each call: the clients are made before the cluster is bootstrapped.
type envToken struct{}

func (envToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	if tok := os.Getenv(envAuthToken); tok != "" {
		return map[string]string{client.AuthTokenHeader: tok}, nil
	}
	return nil, nil
}

func (envToken) RequireTransportSecurity() bool { return false }

// clientTLS is the clients' TLS configuration from the environment (nil:
// plaintext).
func clientTLS() (*tls.Config, error) {
	ca := os.Getenv("TENURE_CACERT")
	if ca == "" {
		return nil, nil
	}
	return tlsconfig.ClientConfig(ca, os.Getenv("TENURE_CERT"), os.Getenv("TENURE_KEY"))
}

// dialClient is client.Dial with the environment's TLS and auth token.
func dialClient(ctx context.Context, eps string) (*client.Client, error) {
	cfg, err := clientTLS()
	if err != nil {
		return nil, err
	}
	var opts []client.Option
	if cfg != nil {
		opts = append(opts, client.WithTLS(cfg), client.WithGRPCOptions(grpc.WithPerRPCCredentials(envToken{})))
	}
	return client.Dial(ctx, eps, opts...)
}

// grpcCredentials are the dial options of a raw gRPC connection with the
// environment's TLS and auth token.
func grpcCredentials() []grpc.DialOption {
	cfg, err := clientTLS()
	if err != nil || cfg == nil {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(cfg)), grpc.WithPerRPCCredentials(envToken{})}
}

// secureBootstrap bootstraps the ACLs of a secure run's cluster and puts
// the management token in the environment; it does nothing otherwise.
func (c *cluster) secureBootstrap() error {
	if os.Getenv(envSecureCerts) == "" {
		return nil
	}
	var apis []pb.TenureClient
	for _, nd := range c.nodes {
		conn, err := grpc.NewClient(nd.addr, grpcCredentials()...)
		if err != nil {
			return err
		}
		defer conn.Close()
		apis = append(apis, pb.NewTenureClient(conn))
	}
	var last error
	err := testutil.PollUntil(30*time.Second, func() (bool, error) {
		for _, api := range apis { // the leader answers; the others say they are not
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			tok, err := api.AclBootstrap(ctx, &pb.AclBootstrapRequest{})
			cancel()
			if err == nil {
				return true, os.Setenv(envAuthToken, tok.GetSecret())
			}
			last = err
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("bootstrapping the ACLs: %w", errors.Join(err, last))
	}
	return nil
}
