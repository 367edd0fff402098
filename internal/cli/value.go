package cli

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

// maxInputValue bounds what a value read from stdin or a file may be
// before it is sent: past the largest value the service stores anywhere,
// reading on is pointless (the service names its own, lower, limits).
const maxInputValue = 16 << 20

// valueArg is a command's VALUE: the argument itself, "-" for stdin, or
// --file F (then the argument is left out).
type valueArg struct{ file string }

func (v *valueArg) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&v.file, "file", "", `read the value from this file (then give no VALUE; VALUE "-" reads stdin)`)
}

// args accepts KEY VALUE, or KEY alone with --file.
func (v *valueArg) args(cmd *cobra.Command, args []string) error {
	if v.file != "" {
		if len(args) != 1 {
			return errors.New("with --file give only KEY, not a VALUE")
		}
		return nil
	}
	if len(args) != 2 {
		return fmt.Errorf("want KEY VALUE (or KEY --file F), got %d arguments", len(args))
	}
	return nil
}

// read returns the value: args[1], stdin for "-", or the file's bytes.
func (v *valueArg) read(args []string, stdin io.Reader) ([]byte, error) {
	var r io.Reader
	switch {
	case v.file != "":
		f, err := os.Open(v.file)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	case args[1] == "-":
		r = stdin
	default:
		return []byte(args[1]), nil
	}
	b, err := io.ReadAll(io.LimitReader(r, maxInputValue+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxInputValue {
		return nil, fmt.Errorf("the value is more than %d bytes; the service stores much less (see docs/limits.md)", maxInputValue)
	}
	return b, nil
}
