package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// The way a failure is reported, shared by the command lines built on
// this package: tenure, and the benchmark tool bench/cmd/tenure-bench.

// Output is a command's stdout, counting what was printed on it, so that a
// failure prints its JSON error only where the command printed nothing.
// It is not safe for concurrent use.
type Output struct {
	w io.Writer
	n int
}

// NewOutput counts what is printed on w.
func NewOutput(w io.Writer) *Output { return &Output{w: w} }

// Write implements io.Writer.
func (o *Output) Write(p []byte) (int, error) {
	n, err := o.w.Write(p)
	o.n += n
	return n, err
}

// ErrorLine renders err as program prog's single stderr line
// "<prog>: <message>": the client's own "tenure: " prefixes taken off and
// white space folded.
func ErrorLine(prog string, err error) string {
	msg := err.Error()
	for strings.HasPrefix(msg, "tenure: ") {
		msg = strings.TrimPrefix(msg, "tenure: ")
	}
	return prog + ": " + strings.Join(strings.Fields(msg), " ")
}

// Report prints err, a command's failure: its ErrorLine on stderr and,
// with asJSON, where the command printed nothing on out,
// {"error":{"code":...,"message":...}} (ErrorCode) on out. It returns
// the process's exit code (ExitCode).
func Report(prog string, err error, asJSON bool, out *Output, stderr io.Writer) int {
	line := ErrorLine(prog, err)
	fmt.Fprintln(stderr, line)
	if asJSON && out.n == 0 { // one JSON object on stdout, also for a failure
		b, _ := json.Marshal(errorJSON{Error: errorBody{Code: ErrorCode(err), Message: strings.TrimPrefix(line, prog+": ")}})
		fmt.Fprintf(out, "%s\n", b)
	}
	return ExitCode(err)
}
