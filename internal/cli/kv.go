package cli

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/server"
)

// kvJSON is one key in `tenure kv get -o json`.
type kvJSON struct {
	Key            string `json:"key"`
	Value          string `json:"value"`
	CreateRevision uint64 `json:"create_revision"`
	ModRevision    uint64 `json:"mod_revision"`
	Version        uint64 `json:"version"`
	Session        uint64 `json:"session,omitempty"`
}

func toKVJSON(kv client.KeyValue) kvJSON {
	return kvJSON{Key: kv.Key, Value: string(kv.Value), CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision, Version: kv.Version, Session: kv.Session}
}

// kvGetJSON is `tenure kv get KEY -o json`: the key's fields and found.
type kvGetJSON struct {
	kvJSON
	Found bool `json:"found"`
}

// kvMissingJSON is `tenure kv get KEY -o json` for a missing key.
type kvMissingJSON struct {
	Key   string `json:"key"`
	Found bool   `json:"found"`
}

// kvRangeJSON is `tenure kv get --prefix P -o json`.
type kvRangeJSON struct {
	KVs      []kvJSON `json:"kvs"`
	More     bool     `json:"more"`
	Revision uint64   `json:"revision"`
}

// kvEventJSON is one line of `tenure kv watch -o json`.
type kvEventJSON struct {
	Type     string  `json:"type"`
	Key      string  `json:"key,omitempty"`
	Value    *string `json:"value,omitempty"`
	Revision uint64  `json:"revision"`
}

// kvTxnJSON is `tenure kv txn -o json`.
type kvTxnJSON struct {
	Succeeded bool            `json:"succeeded"`
	Revision  uint64          `json:"revision"`
	Results   []kvTxnOpResult `json:"results"`
}

type kvTxnOpResult struct {
	Op      string   `json:"op"`
	KVs     []kvJSON `json:"kvs,omitempty"`
	Deleted int64    `json:"deleted,omitempty"`
}

func (a *app) kvCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kv",
		Short: "Key-value store: put, get, del, txn, watch",
		Long: `A small key-value store for coordination data (configuration, service
addresses, small state): every key has a create revision, a mod revision
and a version; transactions compare and write atomically; watches deliver
every change from a revision on.

Keys are UTF-8 text. A key written through the etcd API that is not UTF-8
shows Go-quoted, quotes included ("k\xff1"), in every listing, watch and
JSON output; read or write it by name through the etcd API.`,
	}
	cmd.AddCommand(a.kvPutCommand(), a.kvGetCommand(), a.kvDelCommand(), a.kvTxnCommand(), a.kvWatchCommand())
	return cmd
}

func (a *app) kvPutCommand() *cobra.Command {
	var (
		session   uint64
		secretHex string
		val       valueArg
	)
	cmd := &cobra.Command{
		Use:   "put KEY VALUE|-|--file F",
		Short: "Write a key",
		Long: `Write VALUE to KEY ("-": read the value from stdin; --file F: from a file).

With --session ID the key is ephemeral: deleted when that session ends.
Binding a key to a session needs the session's secret: --session-secret
HEX, or TENURE_SESSION_SECRET when --session is TENURE_SESSION (as in a
command run by tenure lock); a wrong one is refused (exit 1).

JSON: {"revision":N}, the revision of the write.`,
		Args: func(cmd *cobra.Command, args []string) error { return val.args(cmd, args) },
		RunE: func(cmd *cobra.Command, args []string) error {
			value, err := val.read(args, a.streams.In)
			if err != nil {
				return err
			}
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				var opts []client.PutOption
				if session != 0 {
					secret, err := sessionSecret(session, secretHex)
					if err != nil {
						return err
					}
					opts = append(opts, client.WithSessionCredentials(session, secret))
				}
				rev, err := c.Put(ctx, args[0], value, opts...)
				if err != nil {
					return err
				}
				return a.emit(map[string]uint64{"revision": rev}, func(w io.Writer) {
					fmt.Fprintf(w, "OK (revision %d)\n", rev)
				})
			})
		},
	}
	cmd.Flags().Uint64Var(&session, "session", 0, "bind the key to this session id (deleted when the session ends)")
	cmd.Flags().StringVar(&secretHex, "session-secret", "", "the session's secret, hex (default: TENURE_SESSION_SECRET if --session is TENURE_SESSION)")
	val.add(cmd)
	return cmd
}

func (a *app) kvGetCommand() *cobra.Command {
	var (
		prefix bool
		limit  int64
		after  string
	)
	cmd := &cobra.Command{
		Use:   "get KEY",
		Short: "Read a key, or the keys under a prefix",
		Long: `Read KEY (linearizable unless --consistency serializable).

JSON: {"key","value","create_revision","mod_revision","version","found":true};
a missing key is not an error: {"key":KEY,"found":false} and exit 0 (the
text output says "not found").

With --prefix: {"kvs":[{"key","value","create_revision","mod_revision",
"version"},...],"more":bool,"revision":N}, keys in order, all of them or
at most --limit. To page, repeat with --after set to the last key while
"more" is true. The server answers in pages (at most 10,000 keys and
2 MiB each), which are read one after the other: an answer of several
pages is not one snapshot, and "revision" is the first page's (a watch
from revision + 1 misses no change).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			call := a.unary
			if prefix {
				call = a.listing
			}
			return call(cmd, func(ctx context.Context, c *client.Client) error {
				if prefix {
					start := ""
					if after != "" {
						start = after + "\x00" // the first key after it
					}
					r, err := c.RangeFrom(ctx, args[0], start, limit)
					if err != nil {
						return err
					}
					out := kvRangeJSON{KVs: []kvJSON{}, More: r.More, Revision: r.Revision}
					for _, kv := range r.KVs {
						out.KVs = append(out.KVs, toKVJSON(kv))
					}
					return a.emit(out, func(w io.Writer) {
						for _, kv := range out.KVs {
							fmt.Fprintf(w, "%s\t%s\n", kv.Key, kv.Value)
						}
					})
				}
				r, err := c.Get(ctx, args[0])
				if err != nil {
					return err
				}
				if len(r.KVs) == 0 {
					return a.emit(kvMissingJSON{Key: args[0]}, func(w io.Writer) {
						fmt.Fprintf(w, "key %s: not found\n", args[0])
					})
				}
				out := kvGetJSON{kvJSON: toKVJSON(r.KVs[0]), Found: true}
				return a.emit(out, func(w io.Writer) {
					fmt.Fprintf(w, "%s\n", out.Value)
				})
			})
		},
	}
	cmd.Flags().BoolVar(&prefix, "prefix", false, "read every key starting with KEY")
	cmd.Flags().Int64Var(&limit, "limit", 0, "with --prefix: at most this many keys (0: all)")
	cmd.Flags().StringVar(&after, "after", "", "with --prefix: only keys after this one (paging: the last key of the previous page)")
	return cmd
}

func (a *app) kvDelCommand() *cobra.Command {
	var prefix bool
	cmd := &cobra.Command{
		Use:   "del KEY",
		Short: "Delete a key, or the keys under a prefix",
		Long: `Delete KEY (with --prefix every key starting with it, at one revision).

JSON: {"deleted":N,"revision":N}. Deleting nothing is not an error and
does not change the revision.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				var r client.DeleteResult
				var err error
				if prefix {
					r, err = c.DeletePrefix(ctx, args[0])
				} else {
					r, err = c.Delete(ctx, args[0])
				}
				if err != nil {
					return err
				}
				return a.emit(map[string]any{"deleted": r.Deleted, "revision": r.Revision}, func(w io.Writer) {
					fmt.Fprintf(w, "%d\n", r.Deleted)
				})
			})
		},
	}
	cmd.Flags().BoolVar(&prefix, "prefix", false, "delete every key starting with KEY")
	return cmd
}

func (a *app) kvTxnCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "txn < SCRIPT",
		Short: "Compare, then write atomically (script on stdin)",
		Long: `Run one transaction read from stdin: compares, a blank line, the ops to
run if every compare holds, a blank line, the ops to run otherwise.

Compares (one per line; strings may be double-quoted):
  value(KEY) = VALUE        also != > <  (bytes; false for a missing key)
  version(KEY) = N          also != > <  (0 for a missing key)
  create(KEY) = N           create revision
  mod(KEY) = N              mod revision
  exists(KEY)               version > 0
  missing(KEY)              version = 0
Ops:
  put KEY VALUE
  get KEY          get --prefix PREFIX
  del KEY          del --prefix PREFIX

Example (compare-and-swap):
  mod("config") = 42

  put config "new value"

  get config

JSON: {"succeeded":bool,"revision":N,"results":[{"op":"put"},
{"op":"get","kvs":[...]},{"op":"del","deleted":N}]} with one result per op
of the branch taken.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ifs, then, els, kinds, err := parseTxn(a.streams.In)
			if err != nil {
				return err
			}
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				r, err := c.Txn(ctx, ifs, then, els)
				if err != nil {
					return err
				}
				branch := kinds[0]
				if !r.Succeeded {
					branch = kinds[1]
				}
				out := kvTxnJSON{Succeeded: r.Succeeded, Revision: r.Revision, Results: []kvTxnOpResult{}}
				for i, res := range r.Results {
					or := kvTxnOpResult{Op: branch[i], Deleted: res.Deleted}
					for _, kv := range res.KVs {
						or.KVs = append(or.KVs, toKVJSON(kv))
					}
					out.Results = append(out.Results, or)
				}
				return a.emit(out, func(w io.Writer) {
					if out.Succeeded {
						fmt.Fprintf(w, "SUCCESS (revision %d)\n", out.Revision)
					} else {
						fmt.Fprintf(w, "FAILURE (revision %d)\n", out.Revision)
					}
					for _, res := range out.Results {
						switch res.Op {
						case "get":
							for _, kv := range res.KVs {
								fmt.Fprintf(w, "%s\t%s\n", kv.Key, kv.Value)
							}
						case "del":
							fmt.Fprintf(w, "deleted %d\n", res.Deleted)
						default:
							fmt.Fprintln(w, "OK")
						}
					}
				})
			})
		},
	}
}

// parseTxn reads the txn script: compares, blank line, then-ops, blank
// line, else-ops. kinds names each op of both branches ("put", "get", "del").
func parseTxn(r io.Reader) (ifs []client.Compare, then, els []client.Op, kinds [2][]string, err error) {
	sc := bufio.NewScanner(r)
	section, lineNo := 0, 0
	for sc.Scan() {
		lineNo++
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			section++
			if section > 2 {
				return nil, nil, nil, kinds, fmt.Errorf("txn line %d: more than three sections", lineNo)
			}
			continue
		}
		if section == 0 {
			c, err := parseCompare(line)
			if err != nil {
				return nil, nil, nil, kinds, fmt.Errorf("txn line %d: %w", lineNo, err)
			}
			ifs = append(ifs, c)
			continue
		}
		op, kind, err := parseOp(line)
		if err != nil {
			return nil, nil, nil, kinds, fmt.Errorf("txn line %d: %w", lineNo, err)
		}
		if section == 1 {
			then = append(then, op)
		} else {
			els = append(els, op)
		}
		kinds[section-1] = append(kinds[section-1], kind)
	}
	return ifs, then, els, kinds, sc.Err()
}

// fields splits a line into words; double-quoted words use Go escapes.
func fields(line string) ([]string, error) {
	var out []string
	for line = strings.TrimSpace(line); line != ""; line = strings.TrimSpace(line) {
		if line[0] == '"' {
			q, err := strconv.QuotedPrefix(line)
			if err != nil {
				return nil, fmt.Errorf("bad quoted string in %q", line)
			}
			s, _ := strconv.Unquote(q)
			out = append(out, s)
			line = line[len(q):]
			continue
		}
		end := strings.IndexAny(line, " \t")
		if end < 0 {
			end = len(line)
		}
		out = append(out, line[:end])
		line = line[end:]
	}
	return out, nil
}

func parseCompare(line string) (client.Compare, error) {
	open := strings.IndexByte(line, '(')
	closing := strings.LastIndexByte(line, ')')
	if open < 0 || closing < open {
		return client.Compare{}, fmt.Errorf("want target(KEY) OP OPERAND, got %q", line)
	}
	target := strings.TrimSpace(line[:open])
	keyWords, err := fields(line[open+1 : closing])
	if err != nil || len(keyWords) != 1 {
		return client.Compare{}, fmt.Errorf("want one key in %q", line)
	}
	key := keyWords[0]
	rest, err := fields(line[closing+1:])
	if err != nil {
		return client.Compare{}, err
	}
	switch target {
	case "exists", "missing":
		if len(rest) != 0 {
			return client.Compare{}, fmt.Errorf("%s(KEY) takes no operand", target)
		}
		if target == "exists" {
			return client.KeyExists(key), nil
		}
		return client.KeyMissing(key), nil
	}
	if len(rest) != 2 {
		return client.Compare{}, fmt.Errorf("want %s(KEY) OP OPERAND, got %q", target, line)
	}
	op, ok := map[string]client.CompareOp{"=": client.Equal, "==": client.Equal, "!=": client.NotEqual, ">": client.Greater, "<": client.Less}[rest[0]]
	if !ok {
		return client.Compare{}, fmt.Errorf("unknown comparison %q (want = != > <)", rest[0])
	}
	if target == "value" {
		return client.ValueIs(key, op, []byte(rest[1])), nil
	}
	n, err := strconv.ParseUint(rest[1], 10, 64)
	if err != nil {
		return client.Compare{}, fmt.Errorf("%s compares numbers, not %q", target, rest[1])
	}
	switch target {
	case "version":
		return client.VersionIs(key, op, n), nil
	case "create":
		return client.CreateRevisionIs(key, op, n), nil
	case "mod":
		return client.ModRevisionIs(key, op, n), nil
	}
	return client.Compare{}, fmt.Errorf("unknown compare target %q (want value, version, create, mod, exists, missing)", target)
}

func parseOp(line string) (client.Op, string, error) {
	w, err := fields(line)
	if err != nil {
		return client.Op{}, "", err
	}
	switch {
	case len(w) == 3 && w[0] == "put":
		return client.OpPut(w[1], []byte(w[2])), "put", nil
	case len(w) == 2 && w[0] == "get":
		return client.OpGet(w[1]), "get", nil
	case len(w) == 3 && w[0] == "get" && w[1] == "--prefix":
		return client.OpRange(w[2], 0), "get", nil
	case len(w) == 2 && w[0] == "del":
		return client.OpDelete(w[1]), "del", nil
	case len(w) == 3 && w[0] == "del" && w[1] == "--prefix":
		return client.OpDeletePrefix(w[2]), "del", nil
	}
	return client.Op{}, "", fmt.Errorf("want put KEY VALUE, get [--prefix] KEY or del [--prefix] KEY, got %q", line)
}

func (a *app) kvWatchCommand() *cobra.Command {
	var (
		prefix   bool
		from     uint64
		progress bool
		count    int
	)
	cmd := &cobra.Command{
		Use:   "watch KEY_OR_PREFIX [--prefix] [--from-revision N] [--count N]",
		Short: "Print every change of a key or prefix",
		Long: `Print every change of KEY (with --prefix, of every key starting with it),
in revision order, from --from-revision on (inclusive; default: changes
after now), until interrupted (exit 0) or, with --count N, until N
changes were printed (exit 0). It reconnects by itself and resumes where
it was: no change is missed or repeated.

JSON: one object per line, {"type":"put"|"delete","key":..,"value":..,
"revision":N} (no value for a delete). With --progress, idle periods
print {"type":"progress","revision":N}: every change up to N has been
printed. To resume after a restart, pass the last revision printed + 1.

When the server no longer holds the history from --from-revision (it
keeps a bounded history), the watch fails (exit 1) with a "compacted"
message giving the oldest revision available and the current one:
re-read with "tenure kv get --prefix" and watch from its revision + 1.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			c, err := a.dial(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			var opts []client.WatchOption
			if prefix {
				opts = append(opts, client.WithPrefix())
			}
			if from > 0 {
				opts = append(opts, client.WithStartRevision(from))
			}
			if count < 0 {
				return errors.New("--count must not be negative")
			}
			wctx, done := context.WithCancel(ctx)
			defer done()
			w, err := c.Watch(wctx, args[0], opts...)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return a.describe(err)
			}
			printed := 0
			for r := range w.C {
				if r.Progress && progress {
					if err := a.emit(kvEventJSON{Type: "progress", Revision: r.Revision}, func(wr io.Writer) {
						fmt.Fprintf(wr, "progress (revision %d)\n", r.Revision)
					}); err != nil {
						return err
					}
				}
				for _, e := range r.Events {
					out := kvEventJSON{Type: e.Type.String(), Key: e.KV.Key, Revision: e.KV.ModRevision}
					if e.Type == client.EventPut {
						v := string(e.KV.Value)
						out.Value = &v
					}
					if err := a.emit(out, func(wr io.Writer) {
						if out.Value != nil {
							fmt.Fprintf(wr, "PUT %s %s (revision %d)\n", out.Key, *out.Value, out.Revision)
						} else {
							fmt.Fprintf(wr, "DELETE %s (revision %d)\n", out.Key, out.Revision)
						}
					}); err != nil {
						return err
					}
					if printed++; count > 0 && printed == count {
						done()
						return nil
					}
				}
			}
			err = w.Err()
			if errors.Is(err, context.Canceled) && ctx.Err() != nil {
				return nil // interrupted: a normal end
			}
			return a.describe(err)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&prefix, "prefix", false, "watch every key starting with KEY_OR_PREFIX")
	f.Uint64Var(&from, "from-revision", 0, "first revision to print (inclusive); 0: changes after now")
	f.BoolVar(&progress, "progress", false, "print progress notifications on idle watches")
	f.IntVar(&count, "count", 0, "stop after printing this many changes (0: run until interrupted)")
	return cmd
}

// kvFlags adds the key-value limits to `tenure serve`.
func kvFlags(f *pflag.FlagSet, l *server.KVLimits) {
	d := server.DefaultKVLimits()
	f.IntVar(&l.MaxKeyLen, "max-key-len", d.MaxKeyLen, "longest key, bytes (INVALID_ARGUMENT past it)")
	f.IntVar(&l.MaxValueLen, "max-value-len", d.MaxValueLen, "largest value, bytes, at most 1.5 MiB, etcd's request limit (INVALID_ARGUMENT past it)")
	f.IntVar(&l.MaxTxnOps, "max-txn-ops", d.MaxTxnOps, "most compares plus ops in one transaction (INVALID_ARGUMENT past it)")
	f.IntVar(&l.WatchHistory, "watch-history", d.WatchHistory, "key changes kept in memory for watches; older revisions answer OUT_OF_RANGE (compacted)")
	f.IntVar(&l.WatchHistoryBytes, "watch-history-bytes", d.WatchHistoryBytes, "bytes of key changes kept for watches")
	f.DurationVar(&l.WatchProgressInterval, "watch-progress-interval", d.WatchProgressInterval, "how often an idle watch is told the current revision")
	f.IntVar(&l.MaxWatches, "max-watches", d.MaxWatches, "most watch streams (kv watch, observe) open on this node (RESOURCE_EXHAUSTED past it)")
	f.IntVar(&l.MaxWatchesPerConnection, "max-watches-per-connection", d.MaxWatchesPerConnection, "most watch streams open on one client connection (RESOURCE_EXHAUSTED past it)")
}

// sessionSecret is the secret of session id: from the flag, or from the
// environment tenure lock gives its command when id is that session.
func sessionSecret(id uint64, flag string) ([]byte, error) {
	if flag == "" && os.Getenv("TENURE_SESSION") == strconv.FormatUint(id, 10) {
		flag = os.Getenv("TENURE_SESSION_SECRET")
	}
	if flag == "" {
		return nil, fmt.Errorf("binding a key to session %d needs its secret: --session-secret HEX (or run under tenure lock, which sets TENURE_SESSION_SECRET)", id)
	}
	secret, err := hex.DecodeString(flag)
	if err != nil {
		return nil, fmt.Errorf("--session-secret is not hex: %v", err)
	}
	return secret, nil
}
