package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/tlsconfig"
)

// Client-side security: every command takes --cacert, --cert, --key and
// --auth-token, with the environment as their defaults.
const (
	envCACert    = "TENURE_CACERT"
	envCert      = "TENURE_CERT"
	envKey       = "TENURE_KEY"
	envAuthToken = "TENURE_AUTH_TOKEN"
)

// clientSecurity holds the client flags.
type clientSecurity struct {
	caCert, cert, key string
	authToken         string
}

func (cs *clientSecurity) flags(pf *pflag.FlagSet) {
	pf.StringVar(&cs.caCert, "cacert", os.Getenv(envCACert), "CA certificate (PEM) the server's certificate must chain to; turns TLS on (env "+envCACert+")")
	pf.StringVar(&cs.cert, "cert", os.Getenv(envCert), "client certificate (PEM) for a server that requires one; turns TLS on (env "+envCert+")")
	pf.StringVar(&cs.key, "key", os.Getenv(envKey), "the client certificate's private key (PEM) (env "+envKey+")")
	pf.StringVar(&cs.authToken, "auth-token", os.Getenv(envAuthToken), "auth token secret for a server that runs with --auth (env "+envAuthToken+")")
}

// options are the client options the flags ask for.
func (cs *clientSecurity) options() ([]client.Option, error) {
	var opts []client.Option
	if cs.caCert != "" || cs.cert != "" || cs.key != "" {
		cfg, err := tlsconfig.ClientConfig(cs.caCert, cs.cert, cs.key)
		if err != nil {
			return nil, err
		}
		opts = append(opts, client.WithTLS(cfg))
	}
	if cs.authToken != "" {
		opts = append(opts, client.WithAuthToken(cs.authToken))
	}
	return opts, nil
}

// serveSecurity holds the security flags of `tenure serve`.
type serveSecurity struct {
	tls, peer tlsconfig.Files
	// httpTLS: the HTTP listener's certificate (its CA is tls.CA's).
	httpTLS  tlsconfig.Files
	auth     bool
	insecure bool
}

func (ss *serveSecurity) flags(f *pflag.FlagSet) {
	f.StringVar(&ss.tls.Cert, "tls-cert", "", "serve the client API over TLS with this certificate (PEM; re-read when it changes or on SIGHUP)")
	f.StringVar(&ss.tls.Key, "tls-key", "", "the private key of --tls-cert (PEM)")
	f.StringVar(&ss.tls.CA, "tls-client-ca", "", "require client certificates that chain to this CA (PEM)")
	f.StringVar(&ss.peer.Cert, "peer-tls-cert", "", "raft peer traffic over mutual TLS with this certificate (PEM, for both server and client use; re-read when it changes or on SIGHUP)")
	f.StringVar(&ss.peer.Key, "peer-tls-key", "", "the private key of --peer-tls-cert (PEM)")
	f.StringVar(&ss.peer.CA, "peer-tls-ca", "", "the CA every peer's certificate must chain to (PEM)")
	f.StringVar(&ss.httpTLS.Cert, "http-tls-cert", "", "serve --http-listen over TLS with this certificate (PEM; re-read when it changes or on SIGHUP); client certificates that chain to --tls-client-ca identify their callers there too")
	f.StringVar(&ss.httpTLS.Key, "http-tls-key", "", "the private key of --http-tls-cert (PEM)")
	f.BoolVar(&ss.auth, "auth", false, "enforce ACLs on this member, and as leader make the whole cluster enforce them for good: deny every request no policy of its caller allows (create the first token with `tenure acl bootstrap`)")
	f.BoolVar(&ss.insecure, "insecure", false, "serve the client API or --http-listen outside loopback without TLS and --auth, or raft peers without peer TLS (protected mode off; --pprof outside loopback still needs --auth)")
}

// configure checks protected mode and sets the daemon's TLS
// configuration. It returns the reloaders to reload on SIGHUP.
func (ss *serveSecurity) configure(cfg *daemon.Config, log io.Writer) ([]*tlsconfig.Reloader, error) {
	clientTLS := ss.tls.Cert != "" || ss.tls.Key != ""
	peerTLS := ss.peer.Cert != "" || ss.peer.Key != "" || ss.peer.CA != ""
	if ss.tls.CA != "" && !clientTLS {
		return nil, errors.New("--tls-client-ca needs --tls-cert and --tls-key")
	}
	if cfg.ZkSecureListen != "" && !clientTLS {
		return nil, errors.New("--zk-secure-listen needs --tls-cert and --tls-key (and, for client certificates, --tls-client-ca)")
	}
	if peerTLS && cfg.PeerListen == "" {
		return nil, errors.New("--peer-tls-cert, --peer-tls-key and --peer-tls-ca need --peer-listen")
	}
	httpTLS := ss.httpTLS.Cert != "" || ss.httpTLS.Key != ""
	if httpTLS && cfg.HTTPListen == "" {
		return nil, errors.New("--http-tls-cert and --http-tls-key need --http-listen")
	}
	// Go's profiles read the process's memory (a heap profile holds values
	// and payloads): outside loopback they need --auth, which gives them
	// to the management policy only. --insecure does not waive this.
	if cfg.Pprof && cfg.HTTPListen != "" && !isLoopback(cfg.HTTPListen) && !ss.auth {
		return nil, fmt.Errorf("refusing to serve Go's profiles (--pprof) on %s, outside loopback, without --auth: anyone who can reach it could read the server's memory (give --auth, which leaves them to the management policy, or serve --http-listen on loopback)", cfg.HTTPListen)
	}
	if !ss.insecure {
		if !isLoopback(cfg.Listen) && !(clientTLS && ss.auth) {
			return nil, fmt.Errorf("refusing to serve the client API on %s, outside loopback, without TLS and --auth: anyone who can reach it could take every lock and read every key (give --tls-cert, --tls-key and --auth, or --insecure to serve anyway)", cfg.Listen)
		}
		if cfg.EtcdListen != "" && !isLoopback(cfg.EtcdListen) && !(clientTLS && ss.auth) && ss.tls.CA == "" {
			return nil, fmt.Errorf("refusing to serve the etcd API on %s, outside loopback, without TLS and --auth or client certificates: anyone who can reach it could take every lock and read every key (give --tls-cert, --tls-key and --auth, or --tls-client-ca, or --insecure to serve anyway)", cfg.EtcdListen)
		}
		if cfg.ZkListen != "" && !isLoopback(cfg.ZkListen) && !ss.auth {
			return nil, fmt.Errorf("refusing to serve the ZooKeeper API on %s, outside loopback, without --auth: anyone who can reach it could take every lock and read every znode (give --auth, or --insecure to serve anyway)", cfg.ZkListen)
		}
		if cfg.ZkSecureListen != "" && !isLoopback(cfg.ZkSecureListen) && !ss.auth && ss.tls.CA == "" {
			return nil, fmt.Errorf("refusing to serve the ZooKeeper API over TLS on %s, outside loopback, without --auth or client certificates: anyone who can reach it could take every lock and read every znode (give --auth, or --tls-client-ca, or --insecure to serve anyway)", cfg.ZkSecureListen)
		}
		if cfg.HTTPListen != "" && !isLoopback(cfg.HTTPListen) && !(httpTLS && ss.auth) {
			return nil, fmt.Errorf("refusing to serve the HTTP listener (dashboard, metrics) on %s, outside loopback, without TLS and --auth: anyone who can reach it could read every lock, election value and dead letter (give --http-tls-cert, --http-tls-key and --auth, or --insecure to serve anyway)", cfg.HTTPListen)
		}
		if cfg.PeerListen != "" && !isLoopback(cfg.PeerListen) && !peerTLS {
			return nil, fmt.Errorf("refusing to serve raft peers on %s, outside loopback, without peer TLS: anyone who can reach it could rewrite the replicated log (give --peer-tls-cert, --peer-tls-key and --peer-tls-ca, or --insecure to serve anyway)", cfg.PeerListen)
		}
	}
	cfg.Auth = ss.auth
	var out []*tlsconfig.Reloader
	if clientTLS {
		r, err := tlsconfig.New(ss.tls, tlsconfig.Server, log)
		if err != nil {
			return nil, err
		}
		cfg.TLS = r.ServerConfig()
		out = append(out, r)
	}
	if httpTLS {
		files := ss.httpTLS
		files.CA = ss.tls.CA
		r, err := tlsconfig.New(files, tlsconfig.Server, log)
		if err != nil {
			return nil, fmt.Errorf("--http-tls-cert: %w", err)
		}
		cfg.HTTPTLS = httpServerConfig(r)
		out = append(out, r)
	}
	if peerTLS {
		r, err := tlsconfig.New(ss.peer, tlsconfig.Peer, log)
		if err != nil {
			return nil, err
		}
		cfg.PeerTLS = r.Config
		out = append(out, r)
	}
	return out, nil
}

// httpServerConfig is the HTTP listener's TLS configuration from r: a
// client certificate is asked for and verified against the client CA, if
// there is one, but not required (a browser sends a bearer token
// instead).
func httpServerConfig(r *tlsconfig.Reloader) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			c := r.Config()
			if c.ClientCAs == nil {
				return c, nil
			}
			c = c.Clone()
			c.ClientAuth = tls.VerifyClientCertIfGiven
			return c, nil
		},
	}
}

// isLoopback reports whether the listen address addr is on loopback only
// (127.0.0.0/8, ::1 or localhost). An empty host is every interface.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// reloadOnHUP reloads every reloader's files on SIGHUP until ctx ends.
func reloadOnHUP(ctx context.Context, rs []*tlsconfig.Reloader, log io.Writer) {
	if len(rs) == 0 {
		return
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-hup:
				for _, r := range rs {
					if err := r.Reload(); err != nil {
						fmt.Fprintf(log, "tenure: SIGHUP: %v (keeping the previous certificates)\n", err)
						continue
					}
				}
				fmt.Fprintln(log, "tenure: SIGHUP: TLS certificates reloaded")
			case <-ctx.Done():
				return
			}
		}
	}()
}

// certCommand is `tenure cert`.
func (a *app) certCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cert",
		Short: "Certificates for trying TLS",
	}
	var dir string
	dev := &cobra.Command{
		Use:   "dev",
		Short: "Write a throwaway CA and certificates for 127.0.0.1 and localhost",
		Long: `Write a throwaway CA and certificates signed by it into --dir, for trying
TLS on one machine (never for production: the files are not protected by
anything but their permissions):

  ca.pem                       the CA (--tls-client-ca, --peer-tls-ca, --cacert)
  server.pem, server-key.pem   the client API's (--tls-cert, --tls-key)
  client.pem, client-key.pem   a client's, common name ` + tlsconfig.DevClientName + ` (--cert, --key)
  peer.pem, peer-key.pem       raft's mutual TLS (--peer-tls-cert, --peer-tls-key)

The server and peer certificates are valid for 127.0.0.1, ::1 and
localhost, for 90 days. Existing files are never overwritten.
JSON: {"dir","files"}.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return errors.New("--dir is required")
			}
			if err := tlsconfig.WriteDev(dir); err != nil {
				return err
			}
			out := struct {
				Dir   string   `json:"dir"`
				Files []string `json:"files"`
			}{dir, tlsconfig.DevFiles}
			return a.emit(out, func(w io.Writer) {
				fmt.Fprintf(w, "wrote a development CA and certificates to %s:\n", dir)
				for _, f := range tlsconfig.DevFiles {
					fmt.Fprintf(w, "  %s\n", f)
				}
			})
		},
	}
	dev.Flags().StringVar(&dir, "dir", "", "directory to write the files into (created if needed)")
	cmd.AddCommand(dev)
	return cmd
}
