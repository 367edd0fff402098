// Command tenure is Tenure's server and command line client. See
// internal/cli for the commands, their JSON output and exit codes.
package main

import (
	"context"
	"os"

	"github.com/tenure-io/tenure/internal/cli"
)

func main() {
	os.Exit(cli.Run(context.Background(), os.Args[1:], cli.StdStreams()))
}
