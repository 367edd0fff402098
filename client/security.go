package client

import (
	"context"
	"crypto/tls"
	"fmt"

	"google.golang.org/grpc/credentials"
)

// AuthTokenHeader is the gRPC metadata key that carries an auth token
// (see WithAuthToken).
const AuthTokenHeader = "tenure-auth-token"

// WithTLS connects over TLS with cfg (nil is an error): RootCAs the
// server's certificate must chain to (nil: the system's roots), and
// Certificates for a server that requires client certificates. The
// server name checked is the endpoint's host unless cfg.ServerName is set.
// Without WithTLS the client speaks plaintext, which a server that serves
// TLS refuses.
func WithTLS(cfg *tls.Config) Option {
	return func(o *dialOptions) error {
		if cfg == nil {
			return fmt.Errorf("%w: WithTLS: nil configuration", ErrInvalid)
		}
		o.tls = cfg.Clone()
		return nil
	}
}

// WithAuthToken presents secret (an auth token's secret, as `tenure acl
// bootstrap` or `tenure acl token create` printed it) with every request.
// A server that runs with --auth then allows what the token's policies
// allow; everything else is PERMISSION_DENIED (ErrPermissionDenied).
// Without TLS the secret crosses the network in plaintext: use both. An
// empty secret is an error.
func WithAuthToken(secret string) Option {
	return func(o *dialOptions) error {
		if secret == "" {
			return fmt.Errorf("%w: WithAuthToken: empty token", ErrInvalid)
		}
		o.authToken = secret
		return nil
	}
}

// tokenCreds puts the auth token on every RPC.
type tokenCreds string

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (t tokenCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{AuthTokenHeader: string(t)}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials. It
// is false so that a token works on a loopback server without TLS; a
// server that listens on the network refuses to run with auth but
// without TLS (protected mode), unless its operator said --insecure.
func (tokenCreds) RequireTransportSecurity() bool { return false }

var _ credentials.PerRPCCredentials = tokenCreds("")
