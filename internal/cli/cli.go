// Package cli implements the tenure command line: the server (serve), the
// lock runner (lock NAME -- CMD), and inspection, register and
// administration commands. cmd/tenure only calls Run. Benchmarks are not
// part of the product: they live in bench/cmd/tenure-bench.
//
// # Output and exit codes (a public contract)
//
// With -o json every command prints exactly one JSON object on stdout; the
// field names are documented on each command and are parsed by other tools.
// Errors are one line on stderr starting with "tenure: "; with -o json a
// command that fails before printing its answer also prints
// {"error":{"code":"...","message":"..."}} on stdout (codes: ErrorCode).
// Exit codes:
//
//	0 ok
//	1 error
//	2 unknown command or subcommand
//	3 stale: a fenced write was rejected (client.ErrStale)
//	4 not held: the lock was not held by the caller (client.ErrNotHeld)
//	5 timeout: a deadline passed (context.DeadlineExceeded)
//	6 no leader: the servers answered, but none led within the time
//	  given (client.ErrNoLeader)
//	7 lost: `tenure lock` (sem, rwlock, elect) stopped CMD because its
//	  hold was lost (or, with --on-suspect stop, unproven)
//
// `tenure lock NAME -- CMD` exits with CMD's own status instead (128+N if
// CMD was killed by signal N), unless it could not run CMD to the end.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tenure-io/tenure/client"
)

// Exit codes. They are part of the command line's public contract.
const (
	ExitOK       = 0
	ExitError    = 1
	ExitUsage    = 2 // an unknown command or subcommand
	ExitStale    = 3
	ExitNotHeld  = 4
	ExitTimeout  = 5
	ExitNoLeader = 6 // no node led the cluster within the time given
	ExitLost     = 7 // a lock runner's hold was lost: its command was stopped
)

// requestTimeout bounds each unary call (status, fence, ...).
const requestTimeout = 10 * time.Second

// Streams are a command's standard streams.
type Streams struct {
	In  io.Reader
	Out io.Writer
	Err io.Writer
}

// StdStreams are the process's standard streams.
func StdStreams() Streams { return Streams{In: os.Stdin, Out: os.Stdout, Err: os.Stderr} }

// Run executes the command line args (without the program name) and
// returns the process's exit code. ctx ending stops long-running commands
// (serve stops cleanly, lock withdraws its wait). Run is safe to call from
// several goroutines at once, but `lock` and `serve` also react to the
// process's SIGINT and SIGTERM.
func Run(ctx context.Context, args []string, s Streams) int {
	if s.In == nil {
		s.In = strings.NewReader("")
	}
	if s.Out == nil {
		s.Out = io.Discard
	}
	if s.Err == nil {
		s.Err = io.Discard
	}
	out := NewOutput(s.Out)
	s.Out = out
	a := &app{streams: s}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetIn(s.In)
	root.SetOut(s.Out)
	root.SetErr(s.Err)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	var ee *exitError
	if errors.As(err, &ee) && ee.err == nil {
		return ExitCode(err) // the command's own status, printed by it
	}
	return Report("tenure", err, a.json() || wantsJSON(args), out, s.Err)
}

// errorJSON is what a command prints on stdout with -o json when it fails
// before printing its own answer: {"error":{"code":"...","message":"..."}}.
type errorJSON struct {
	Error errorBody `json:"error"`
}

type errorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// ErrorCode names the kind of a failure in JSON output (a public
// contract, like the exit codes): stale, not_held, timeout,
// invalid_argument, resource_exhausted, permission_denied, no_leader,
// unavailable, session_expired, unknown_outcome, locked, already_held,
// lost, cancelled, or error for anything else.
func ErrorCode(err error) string {
	switch {
	case errors.Is(err, errLost):
		return "lost"
	case errors.Is(err, client.ErrStale):
		return "stale"
	case errors.Is(err, client.ErrNotHeld):
		return "not_held"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, client.ErrInvalid), errors.Is(err, errUsage):
		return "invalid_argument"
	case errors.Is(err, client.ErrLimit):
		return "resource_exhausted"
	case errors.Is(err, client.ErrPermissionDenied):
		return "permission_denied"
	case errors.Is(err, client.ErrNoLeader):
		return "no_leader"
	case errors.Is(err, client.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, client.ErrSessionExpired):
		return "session_expired"
	case errors.Is(err, client.ErrUnknownOutcome):
		return "unknown_outcome"
	case errors.Is(err, client.ErrLocked):
		return "locked"
	case errors.Is(err, client.ErrAlreadyHeld):
		return "already_held"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	}
	return "error"
}

// wantsJSON reports whether args ask for -o json, for a command line that
// failed before its flags were parsed.
func wantsJSON(args []string) bool {
	for i, a := range args {
		switch {
		case a == "--":
			return false
		case a == "-ojson", a == "--output=json", a == "-o=json":
			return true
		case (a == "-o" || a == "--output") && i+1 < len(args) && args[i+1] == "json":
			return true
		}
	}
	return false
}

// errUsage marks a command line that cannot be parsed.
var errUsage = errors.New("usage")

// errUnknownCommand marks a command or subcommand that does not exist
// (exit 2); it is a usage error too.
var errUnknownCommand = errors.New("unknown command")

// errLost marks a lock runner that stopped its command because its hold
// was lost (exit 7).
var errLost = errors.New("lost ownership")

// unknownCommandError is a command line naming a command that does not
// exist: errors.Is matches errUnknownCommand (and so errUsage).
type unknownCommandError struct{ msg string }

func (e unknownCommandError) Error() string { return e.msg }
func (e unknownCommandError) Is(target error) bool {
	return target == errUnknownCommand || target == errUsage
}

// unknownCommand is the error for arg, which names no subcommand of cmd.
func unknownCommand(cmd *cobra.Command, arg string) error {
	msg := fmt.Sprintf("unknown command %q for %q", arg, cmd.CommandPath())
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2 // cobra's own default
	}
	if s := cmd.SuggestionsFor(arg); len(s) > 0 {
		msg += fmt.Sprintf(" (did you mean %s?)", strings.Join(s, ", "))
	}
	return unknownCommandError{msg: fmt.Sprintf("%s; see '%s --help'", msg, cmd.CommandPath())}
}

// refuseUnknownSubcommands makes every command that groups subcommands
// (tenure member, tenure kv, ..., the root) fail on an argument that names
// none of them, instead of printing its help and exiting 0; given no
// argument it still prints its help (or runs, if it runs by itself).
func refuseUnknownSubcommands(cmd *cobra.Command) {
	for _, c := range cmd.Commands() {
		refuseUnknownSubcommands(c)
	}
	if !cmd.HasSubCommands() {
		return
	}
	if cmd.Runnable() {
		// One that also runs by itself (tenure cluster keys): if it takes
		// no arguments (its Use names none), one it refuses was meant as
		// a subcommand.
		if args := cmd.Args; args != nil && !strings.Contains(cmd.Use, " ") {
			cmd.Args = func(cmd *cobra.Command, a []string) error {
				if err := args(cmd, a); err != nil && len(a) > 0 {
					return unknownCommand(cmd, a[0])
				}
				return nil
			}
		}
		return
	}
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return cmd.Help()
		}
		return unknownCommand(cmd, args[0])
	}
}

// usageError is a flag error: its text, and errors.Is(err, errUsage).
type usageError struct{ err error }

func (e usageError) Error() string        { return e.err.Error() }
func (e usageError) Is(target error) bool { return target == errUsage }
func (e usageError) Unwrap() error        { return e.err }

// ExitCode maps an error to the process exit code; this is the only place
// where the mapping lives.
func ExitCode(err error) int {
	var ee *exitError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, errUnknownCommand):
		return ExitUsage
	case errors.Is(err, errLost):
		return ExitLost
	case errors.Is(err, client.ErrNoLeader):
		return ExitNoLeader
	case errors.Is(err, client.ErrStale):
		return ExitStale
	case errors.Is(err, client.ErrNotHeld):
		return ExitNotHeld
	case errors.Is(err, context.DeadlineExceeded):
		return ExitTimeout
	}
	return ExitError
}

// exitError carries an exit code chosen by the command itself (the status
// of a child process). A nil err prints nothing.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// errorLine renders err as the single stderr line "tenure: <message>".
func errorLine(err error) string { return ErrorLine("tenure", err) }

type app struct {
	streams     Streams
	endpoint    string
	consistency string
	output      string
	security    clientSecurity // security.go
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "tenure",
		Short: "Tenure: a lock service that issues fencing tokens",
		Long: `Tenure is a lock service: a replicated lock authority that grants named
locks to sessions and issues a fencing token with every grant.

Exit codes: 0 ok, 1 error, 2 unknown command, 3 stale token, 4 lock not
held, 5 timeout, 6 no leader, 7 lock lost (its command was stopped).
"tenure lock NAME -- CMD" exits with CMD's status.`,
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			switch a.output {
			case "text", "json":
				return nil
			}
			return fmt.Errorf("unknown output format %q (want text or json)", a.output)
		},
	}
	endpoint := os.Getenv("TENURE_ENDPOINT")
	if endpoint == "" {
		endpoint = client.DefaultEndpoint
	}
	pf := root.PersistentFlags()
	pf.StringVar(&a.endpoint, "endpoint", endpoint, "server address host:port, or a comma-separated list of cluster members (env TENURE_ENDPOINT)")
	pf.StringVarP(&a.output, "output", "o", "text", "output format: text or json")
	a.security.flags(pf)
	pf.StringVar(&a.consistency, "consistency", "linearizable", "reads: linearizable (through the leader) or serializable (local to the node, may be stale)")
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf("%w (see '%s --help')", usageError{err}, cmd.CommandPath())
	})
	root.CompletionOptions.DisableDefaultCmd = true
	root.AddCommand(
		a.serveCommand(),
		a.lockCommand(),
		a.semCommand(),
		a.rwlockCommand(),
		a.electCommand(),
		a.fenceCommand(),
		a.sessionCommand(),
		a.statusCommand(),
		a.memberCommand(),
		a.snapshotCommand(),
		a.kvCommand(),
		a.queueCommand(),
		a.limitsCommand(),
		a.versionCommand(),
		a.certCommand(),
		a.aclCommand(),
		a.clusterCommand(),
	)
	refuseUnknownSubcommands(root)
	return root
}

func (a *app) json() bool { return a.output == "json" }

// emit prints v as one JSON object (with -o json) or text() otherwise.
func (a *app) emit(v any, text func(w io.Writer)) error {
	if a.json() {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(a.streams.Out, "%s\n", b)
		return err
	}
	text(a.streams.Out)
	return nil
}

// dial connects to the endpoint, with extra options after the flags'; the
// caller closes the client.
func (a *app) dial(ctx context.Context, extra ...client.Option) (*client.Client, error) {
	if err := checkEndpoints(a.endpoint); err != nil {
		return nil, err
	}
	opts, err := a.security.options()
	if err != nil {
		return nil, err
	}
	// The CLI finds the cluster from one endpoint: the members' published
	// addresses, and the leader a follower names (client.WithDiscovery).
	opts = append(append(opts, client.WithDiscovery()), extra...)
	switch a.consistency {
	case "linearizable":
		return client.Dial(ctx, a.endpoint, opts...)
	case "serializable":
		fmt.Fprintln(a.streams.Err, "tenure: serializable read: the answer comes from one node's local state and may be stale")
		return client.Dial(ctx, a.endpoint, append(opts, client.WithSerializableReads())...)
	}
	return nil, fmt.Errorf("--consistency must be linearizable or serializable, not %q", a.consistency)
}

// checkEndpoints refuses an endpoint without a port: gRPC would dial a
// bare host on port 443.
func checkEndpoints(endpoints string) error {
	for _, ep := range strings.Split(endpoints, ",") {
		ep = strings.TrimSpace(ep)
		if ep == "" {
			continue
		}
		if _, port, err := net.SplitHostPort(ep); err != nil || port == "" {
			return fmt.Errorf("--endpoint %q has no port: give host:port (the server listens on 7070 by default)", ep)
		}
	}
	return nil
}

// listTimeout bounds a listing that follows the server's pages (each page
// is a request; a million sessions are a hundred pages).
const listTimeout = 2 * time.Minute

// unary runs fn with a connected client under the request timeout.
func (a *app) unary(cmd *cobra.Command, fn func(ctx context.Context, c *client.Client) error) error {
	return a.call(cmd, requestTimeout, fn)
}

// listing runs fn, which reads a listing in pages, under listTimeout.
func (a *app) listing(cmd *cobra.Command, fn func(ctx context.Context, c *client.Client) error) error {
	return a.call(cmd, listTimeout, fn)
}

// call runs fn with a connected client under timeout.
func (a *app) call(cmd *cobra.Command, timeout time.Duration, fn func(ctx context.Context, c *client.Client) error) error {
	ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
	defer cancel()
	c, err := a.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	return a.describe(fn(ctx, c))
}

// describe names the endpoint in errors that come from not reaching it.
func (a *app) describe(err error) error {
	if errors.Is(err, client.ErrUnavailable) && !errors.Is(err, client.ErrNoLeader) {
		return fmt.Errorf("cannot reach %s: %w", a.endpoint, err)
	}
	return err
}
