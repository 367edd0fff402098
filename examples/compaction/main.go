// Command compaction is a compaction worker that writes its segments under
// epoch directories (guard/epoch): it runs under `tenure lock`, merges the
// published epoch's records with new ones, writes the result into the
// epoch of its own fencing token and publishes that epoch. A worker that
// was paused past its lease and wakes up after a newer worker published
// can only write into its own directory, which nobody reads, and its
// publish is rejected as stale (exit 3).
//
//	tenure lock compaction -- go run ./examples/compaction --dir /tmp/segments --put user:1=alice
//	go run ./examples/compaction --dir /tmp/segments --list
//
// See README.md in this directory.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tenure-io/tenure/client"
)

// Exit codes, as the tenure CLI uses them.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
	exitStale = 3
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// putFlags collects repeated --put key=value flags.
type putFlags []Record

func (p *putFlags) String() string { return fmt.Sprint(*p) }

func (p *putFlags) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok {
		return errors.New("want key=value")
	}
	r := Record{Key: k, Value: v}
	if err := r.validate(); err != nil {
		return err
	}
	*p = append(*p, r)
	return nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("compaction", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg      Config
		puts     putFlags
		endpoint = envOr("TENURE_ENDPOINT", client.DefaultEndpoint)
		token    = os.Getenv("TENURE_FENCE_TOKEN")
		list     bool
		stall    time.Duration
	)
	fs.StringVar(&cfg.Dir, "dir", "", "root directory of the epoch directories (required)")
	fs.StringVar(&cfg.Pointer, "pointer", "compaction/epoch", "Tenure register that holds the published epoch")
	fs.StringVar(&endpoint, "endpoint", endpoint, "Tenure server (env TENURE_ENDPOINT)")
	fs.StringVar(&token, "token", token, "fencing token of the lock grant (env TENURE_FENCE_TOKEN, set by tenure lock)")
	fs.Var(&puts, "put", "record key=value to merge in (repeatable)")
	fs.IntVar(&cfg.SegmentRecords, "segment-records", 1000, "records per output segment")
	fs.IntVar(&cfg.Keep, "keep", 1, "epochs below the published one to keep after publishing (-1: collect nothing)")
	fs.BoolVar(&list, "list", false, "print the published epoch's records and exit (needs no lock)")
	fs.DurationVar(&stall, "stall", 0, "wait this long between writing the segments and publishing (to demonstrate a slow or paused worker)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if cfg.Dir == "" || fs.NArg() != 0 {
		fmt.Fprintln(stderr, "compaction: --dir is required and no positional arguments are accepted")
		return exitUsage
	}
	cfg.Puts = puts

	c, err := client.Dial(ctx, endpoint)
	if err != nil {
		fmt.Fprintln(stderr, "compaction:", err)
		return exitError
	}
	defer c.Close()
	enc := json.NewEncoder(stdout)

	if list {
		recs, ep, err := Read(ctx, c, cfg.Dir, cfg.Pointer)
		if err != nil {
			fmt.Fprintln(stderr, "compaction:", err)
			return exitError
		}
		if recs == nil {
			recs = []Record{}
		}
		_ = enc.Encode(struct {
			Epoch   uint64   `json:"epoch"`
			Records []Record `json:"records"`
		}{ep, recs})
		return exitOK
	}

	if token == "" {
		fmt.Fprintln(stderr, "compaction: no fencing token: run under `tenure lock NAME -- ...` or pass --token")
		return exitUsage
	}
	cfg.Token, err = strconv.ParseUint(token, 10, 64)
	if err != nil || cfg.Token == 0 {
		fmt.Fprintf(stderr, "compaction: fencing token %q is not a positive integer\n", token)
		return exitUsage
	}
	if stall > 0 {
		cfg.beforePublish = func() {
			t := time.NewTimer(stall)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
			}
		}
	}
	res, err := Compact(ctx, c, cfg)
	if errors.Is(err, client.ErrStale) {
		res.Result = "stale"
		_ = enc.Encode(res)
		fmt.Fprintf(stderr, "compaction: a newer epoch is published; epoch %d stays unpublished: %v\n", cfg.Token, err)
		return exitStale
	}
	if err != nil {
		fmt.Fprintln(stderr, "compaction:", err)
		return exitError
	}
	_ = enc.Encode(res)
	return exitOK
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
