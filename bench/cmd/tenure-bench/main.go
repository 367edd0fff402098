// Command tenure-bench drives a running Tenure server and reports
// throughput and latency: locks (the root command), queues (queue) and the
// key-value store (kv). It is a benchmark tool, not part of the product:
// the tenure binary has no benchmark command.
//
//	go build -o bin/tenure-bench ./bench/cmd/tenure-bench
//	bin/tenure-bench --endpoint 127.0.0.1:7070 --mode contended --clients 64 --duration 10s -o json
//	bin/tenure-bench --endpoint 127.0.0.1:7070 queue --stored 100000 --batch 100 -o json
//	bin/tenure-bench --endpoint 127.0.0.1:7070 kv --op put --clients 16 -o json
//
// With -o json each command prints exactly one JSON object on stdout (its
// fields are listed in each command's --help, and bench/*.sh parse them).
// Errors are one line on stderr starting with "tenure-bench: "; with -o
// json a command that fails also prints {"error":{"code","message"}} on
// stdout, with the codes and exit codes of the tenure command line
// (cli.ErrorCode, cli.ExitCode).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/cli"
	"github.com/tenure-io/tenure/internal/tlsconfig"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// Client-side security flags, with the environment as their defaults: the
// same flags and variables as the tenure command line's.
const (
	envEndpoint  = "TENURE_ENDPOINT"
	envCACert    = "TENURE_CACERT"
	envCert      = "TENURE_CERT"
	envKey       = "TENURE_KEY"
	envAuthToken = "TENURE_AUTH_TOKEN"
)

// app holds the flags every command shares and the output streams.
type app struct {
	out, errw         io.Writer
	endpoint          string
	output            string
	consistency       string
	caCert, cert, key string
	authToken         string
}

// run executes args (without the program name) and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	out := cli.NewOutput(stdout)
	a := &app{out: out, errw: stderr}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetIn(strings.NewReader(""))
	root.SetOut(out)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return cli.ExitOK
	}
	return cli.Report("tenure-bench", err, a.output == "json", out, stderr)
}

func (a *app) rootCommand() *cobra.Command {
	root := a.lockCommand()
	root.SilenceErrors = true
	root.SilenceUsage = true
	root.PersistentPreRunE = func(*cobra.Command, []string) error {
		switch a.output {
		case "text", "json":
			return nil
		}
		return fmt.Errorf("unknown output format %q (want text or json)", a.output)
	}
	endpoint := os.Getenv(envEndpoint)
	if endpoint == "" {
		endpoint = client.DefaultEndpoint
	}
	pf := root.PersistentFlags()
	pf.StringVar(&a.endpoint, "endpoint", endpoint, "server address host:port, or a comma-separated list of cluster members (env "+envEndpoint+")")
	pf.StringVarP(&a.output, "output", "o", "text", "output format: text or json")
	pf.StringVar(&a.caCert, "cacert", os.Getenv(envCACert), "CA certificate (PEM) the server's certificate must chain to; turns TLS on (env "+envCACert+")")
	pf.StringVar(&a.cert, "cert", os.Getenv(envCert), "client certificate (PEM) for a server that requires one; turns TLS on (env "+envCert+")")
	pf.StringVar(&a.key, "key", os.Getenv(envKey), "the client certificate's private key (PEM) (env "+envKey+")")
	pf.StringVar(&a.authToken, "auth-token", os.Getenv(envAuthToken), "auth token secret for a server that runs with --auth (env "+envAuthToken+")")
	pf.StringVar(&a.consistency, "consistency", "linearizable", "reads: linearizable (through the leader) or serializable (local to the node, may be stale)")
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf("%w (see '%s --help')", err, cmd.CommandPath())
	})
	root.CompletionOptions.DisableDefaultCmd = true
	root.AddCommand(a.queueCommand(), a.kvCommand())
	return root
}

// emit prints v as one JSON object (with -o json) or text() otherwise.
func (a *app) emit(v any, text func(w io.Writer)) error {
	if a.output == "json" {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(a.out, "%s\n", b)
		return err
	}
	text(a.out)
	return nil
}

// dial connects to the endpoint with the flags' options, then extra; the
// caller closes the client.
func (a *app) dial(ctx context.Context, extra ...client.Option) (*client.Client, error) {
	var opts []client.Option
	if a.caCert != "" || a.cert != "" || a.key != "" {
		cfg, err := tlsconfig.ClientConfig(a.caCert, a.cert, a.key)
		if err != nil {
			return nil, err
		}
		opts = append(opts, client.WithTLS(cfg))
	}
	if a.authToken != "" {
		opts = append(opts, client.WithAuthToken(a.authToken))
	}
	opts = append(opts, extra...)
	switch a.consistency {
	case "linearizable":
	case "serializable":
		fmt.Fprintln(a.errw, "tenure-bench: serializable read: the answer comes from one node's local state and may be stale")
		opts = append(opts, client.WithSerializableReads())
	default:
		return nil, fmt.Errorf("--consistency must be linearizable or serializable, not %q", a.consistency)
	}
	return client.Dial(ctx, a.endpoint, opts...)
}

// describe names the endpoint in errors that come from not reaching it.
func (a *app) describe(err error) error {
	if errors.Is(err, client.ErrUnavailable) && !errors.Is(err, client.ErrNoLeader) {
		return fmt.Errorf("cannot reach %s: %w", a.endpoint, err)
	}
	return err
}
