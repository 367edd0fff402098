package cli

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/server"
)

// queuePushJSON is `tenure queue push -o json`.
type queuePushJSON struct {
	ID     uint64 `json:"id"`
	Result string `json:"result"` // "enqueued" or "duplicate"
}

// queuePopJSON is `tenure queue pop -o json`.
type queuePopJSON struct {
	ID            uint64 `json:"id"`
	Payload       string `json:"payload"`
	DeliveryToken uint64 `json:"delivery_token"`
	Attempt       int    `json:"attempt"`
	Receipt       string `json:"receipt"` // hex
}

// queueSettleJSON is `tenure queue ack|nack|extend -o json`, one per
// delivery.
type queueSettleJSON struct {
	ID     uint64 `json:"id"`
	Result string `json:"result"` // "acked", "nacked", "extended", "stale" or "denied"
}

// queueLenJSON is `tenure queue len -o json`.
type queueLenJSON struct {
	Queued      int    `json:"queued"`
	InFlight    int    `json:"in_flight"`
	Dead        int    `json:"dead"`
	MaxAttempts int    `json:"max_attempts"`
	OldestID    uint64 `json:"oldest_id"`
	OldestAgeMs int64  `json:"oldest_age_ms"`
	Waiting     int    `json:"waiting"`
}

// queueDeadJSON is one item of `tenure queue dlq list -o json`.
type queueDeadJSON struct {
	ID       uint64 `json:"id"`
	Payload  string `json:"payload"`
	Attempts int    `json:"attempts"`
}

// queueDLQListJSON is `tenure queue dlq list -o json`.
type queueDLQListJSON struct {
	Queue string          `json:"queue"`
	Items []queueDeadJSON `json:"items"`
}

// queueRequeueJSON is `tenure queue dlq requeue -o json`.
type queueRequeueJSON struct {
	Requeued int `json:"requeued"`
}

// queueDeleteJSON is `tenure queue delete -o json`.
type queueDeleteJSON struct {
	Deleted bool `json:"deleted"`
	Items   int  `json:"items"`
}

// queuePurgeJSON is `tenure queue purge -o json`.
type queuePurgeJSON struct {
	Purged int `json:"purged"`
}

func (a *app) queueCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "queue",
		Short: "Push to and pop from distributed queues",
		Long: `A replicated FIFO queue. push appends an item (its id is the revision of the
enqueue); pop hands out the oldest item under a visibility lease with a
delivery token and a receipt: nobody else gets it until the lease ends,
and only an ack with that token and receipt deletes it. An item whose
lease ran out, or that was nacked, goes back to its original place; after
max attempts (default 5) it moves to the dead letters (queue dlq). purge
removes a queue's items, delete the queue itself.`,
	}
	cmd.AddCommand(a.queuePushCommand(), a.queuePopCommand(), a.queueSettleCommand("ack"), a.queueSettleCommand("nack"), a.queueSettleCommand("extend"), a.queueLenCommand(), a.queueDLQCommand(), a.queuePurgeCommand(), a.queueDeleteCommand())
	return cmd
}

func (a *app) queuePushCommand() *cobra.Command {
	var (
		opID        string
		maxAttempts int
		batchFile   string
	)
	cmd := &cobra.Command{
		Use:   "push QUEUE PAYLOAD [--op-id ID] | push QUEUE --batch-file FILE|-",
		Short: "Append an item (PAYLOAD - reads stdin), or one item per line of a file",
		Long: `Append PAYLOAD to QUEUE ("-": read the payload from stdin).

With --batch-file FILE ("-": stdin), append one item per line of FILE (the
line without its newline), in order, up to 1,000 items per request and
commit. Each request is all or nothing; a failure stops the push, and the
items of the requests before it stay. With --op-id ID, the item of line N
(from 1) has the operation id ID/N, so that the same push repeated adds
nothing twice.

JSON: {"id":N,"result":"enqueued"|"duplicate"}, one line per item with
--batch-file. "duplicate" means the operation id was seen before (among the
queue's 10,000 latest; a queue that was emptied keeps them until 1,000
newer queues were emptied): nothing was added and id is the first item's.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("batch-file") {
				return cobra.ExactArgs(1)(cmd, args)
			}
			return cobra.ExactArgs(2)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var opts []client.EnqueueOption
			if cmd.Flags().Changed("max-attempts") {
				opts = append(opts, client.WithMaxAttempts(maxAttempts))
			}
			if cmd.Flags().Changed("batch-file") {
				return a.queuePushBatch(cmd, args[0], batchFile, opID, opts)
			}
			payload := []byte(args[1])
			if args[1] == "-" {
				var err error
				if payload, err = io.ReadAll(a.streams.In); err != nil {
					return err
				}
			}
			if opID != "" {
				opts = append(opts, client.WithOperationID(opID))
			}
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				r, err := c.Queue(args[0]).Enqueue(ctx, payload, opts...)
				if err != nil {
					return err
				}
				return a.emitPushed(r)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&opID, "op-id", "", "operation id: a retried push with the same id adds nothing (with --batch-file: ID/LINE per item)")
	f.IntVar(&maxAttempts, "max-attempts", 0, "deliveries before an item is dead-lettered; fixed by the queue's first push (default 5)")
	f.StringVar(&batchFile, "batch-file", "", "append one item per line of this file (-: stdin), in batches of up to 1,000")
	return cmd
}

func (a *app) emitPushed(r client.Enqueued) error {
	out := queuePushJSON{ID: r.ID, Result: "enqueued"}
	if r.Duplicate {
		out.Result = "duplicate"
	}
	return a.emit(out, func(w io.Writer) { fmt.Fprintf(w, "%s item %d\n", out.Result, out.ID) })
}

// maxBatchBytes bounds the payloads and operation ids of one batch
// request (the server's limit).
const maxBatchBytes = 4 << 20

// queuePushBatch pushes the lines of file to queue name in batches.
func (a *app) queuePushBatch(cmd *cobra.Command, name, file, opID string, opts []client.EnqueueOption) error {
	in := a.streams.In
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	ctx := cmd.Context()
	c, err := a.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	q := c.Queue(name)
	var (
		batch            []client.BatchItem
		bytes            int
		line             int
		added, duplicate int
	)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		rctx, cancel := context.WithTimeout(ctx, requestTimeout)
		defer cancel()
		res, err := q.EnqueueBatch(rctx, batch, opts...)
		if err != nil {
			return a.describe(fmt.Errorf("lines %d to %d: %w", line-len(batch)+1, line, err))
		}
		for _, r := range res {
			if r.Duplicate {
				duplicate++
			} else {
				added++
			}
			if a.json() {
				if err := a.emitPushed(r); err != nil {
					return err
				}
			}
		}
		batch, bytes = batch[:0], 0
		return nil
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), fsm.MaxQueuePayload+1)
	for sc.Scan() {
		it := client.BatchItem{Payload: append([]byte(nil), sc.Bytes()...)}
		if opID != "" {
			it.OperationID = fmt.Sprintf("%s/%d", opID, line+1)
		}
		if len(batch) == client.MaxBatch || (len(batch) > 0 && bytes+len(it.Payload)+len(it.OperationID) > maxBatchBytes) {
			if err := flush(); err != nil {
				return err
			}
		}
		batch = append(batch, it)
		bytes += len(it.Payload) + len(it.OperationID)
		line++
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading --batch-file at line %d: %v", line+1, err)
	}
	if err := flush(); err != nil {
		return err
	}
	if !a.json() {
		fmt.Fprintf(a.streams.Out, "enqueued %d items, %d duplicates\n", added, duplicate)
	}
	return nil
}

func (a *app) queuePopCommand() *cobra.Command {
	var (
		visibility, timeout time.Duration
		maxItems            int
	)
	cmd := &cobra.Command{
		Use:   "pop QUEUE [--visibility D] [--timeout D] [--max N]",
		Short: "Take the oldest item (or up to --max items) under a visibility lease",
		Long: `Wait for the oldest item of QUEUE and hand it out for --visibility: nobody
else gets it until then. Ack it (tenure queue ack, from any process) with
its delivery token and receipt before the lease ends, or it is delivered
again. The receipt is this delivery's capability: whoever has it can ack,
nack or extend the delivery, nobody else can. Keep it secret.

With --max N (up to 1,000), wait for at least one item and hand out up to
N of the oldest ones under one lease: each has its own delivery token,
receipt and attempt count, and is settled, redelivered and dead-lettered on
its own.

JSON: {"id":N,"payload":"...","delivery_token":N,"attempt":N,"receipt":"HEX"},
one line per item. "tenure queue ack QUEUE -" reads these lines back.

Exit codes: 0 items, 5 nothing arrived within --timeout, 1 other errors.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeout < 0 {
				return errors.New("--timeout must not be negative")
			}
			if err := checkVisibility(visibility); err != nil {
				return err
			}
			if maxItems < 1 || maxItems > client.MaxBatch {
				return fmt.Errorf("--max %d is outside 1..%d", maxItems, client.MaxBatch)
			}
			ctx := cmd.Context()
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			c, err := a.dial(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			ds, err := c.Queue(args[0]).DequeueBatch(ctx, maxItems, visibility)
			if errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("nothing arrived on queue %s within %v: %w", args[0], timeout, context.DeadlineExceeded)
			}
			if err != nil {
				return a.describe(err)
			}
			for _, d := range ds {
				out := queuePopJSON{ID: d.ID, Payload: string(d.Payload), DeliveryToken: d.Token, Attempt: d.Attempt, Receipt: hex.EncodeToString(d.Receipt)}
				if err := a.emit(out, func(w io.Writer) {
					fmt.Fprintf(w, "item %d (delivery token %d, receipt %s, attempt %d)\n%s\n", out.ID, out.DeliveryToken, out.Receipt, out.Attempt, out.Payload)
				}); err != nil {
					return err
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&visibility, "visibility", server.DefaultVisibility, "visibility lease: the item is delivered again if not acked within it")
	f.DurationVar(&timeout, "timeout", 30*time.Second, "give up waiting after this long (0: wait forever); exit 5")
	f.IntVar(&maxItems, "max", 1, "hand out up to this many items (1 to 1,000) under one lease")
	return cmd
}

func (a *app) queueSettleCommand(what string) *cobra.Command {
	var (
		token      uint64
		receipt    string
		visibility time.Duration
	)
	done := map[string]string{"ack": "acked", "nack": "nacked", "extend": "extended"}[what]
	short := map[string]string{
		"ack":    "Delete a delivered item (exit 3 if the delivery token is stale)",
		"nack":   "Give a delivered item back to the queue at once",
		"extend": "Extend a delivery's visibility lease",
	}[what]
	use := what + " QUEUE ID --delivery-token N --receipt HEX | " + what + " QUEUE - < POPPED.json"
	if what == "extend" {
		use += " --visibility D"
	}
	several := "With ID \"-\", the deliveries are read from stdin, one JSON object each, as\npop -o json printed them (id, delivery token and receipt)"
	if what != "extend" {
		several += "; several are " + done + "\nin batches of up to 1,000 per request and commit, each delivery on its own"
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long: short + `.

--delivery-token and --receipt are the ones pop printed: only the consumer
given the receipt can settle its delivery. ` + several + `. A missing or wrong receipt for the item's
current delivery is refused (PERMISSION_DENIED, exit 1) and changes
nothing.

JSON: {"id":N,"result":"` + done + `"|"stale"|"denied"}, one line per delivery.
"stale": the delivery token is not the item's current one (its lease ran
out and it was delivered again, or it was already settled); nothing was
done. "denied": not the delivery's receipt (of several deliveries; a single
one is refused with an error). An ack repeated with the same token and
receipt answers "acked" again.

Exit codes: 0 ` + done + `, 3 stale (any), 1 other errors (permission denied among them).`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if what == "extend" {
				if err := checkVisibility(visibility); err != nil {
					return err
				}
			}
			var ds []*client.Delivery
			if args[1] == "-" {
				if cmd.Flags().Changed("delivery-token") || cmd.Flags().Changed("receipt") {
					return errors.New("with -, the delivery token and receipt come from stdin: drop --delivery-token and --receipt")
				}
				var err error
				if ds, err = readPopped(args[0], a.streams.In); err != nil {
					return err
				}
			} else {
				if !cmd.Flags().Changed("delivery-token") {
					return errors.New("--delivery-token is required")
				}
				id, err := strconv.ParseUint(args[1], 10, 64)
				if err != nil {
					return fmt.Errorf("item id %q is not a number", args[1])
				}
				d, err := delivery(args[0], id, token, receipt)
				if err != nil {
					return err
				}
				ds = []*client.Delivery{d}
			}
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				q := c.Queue(args[0])
				o := &settleOutcome{a: a, done: done, single: len(ds) == 1}
				if len(ds) == 1 || what == "extend" {
					for _, d := range ds {
						var err error
						switch what {
						case "ack":
							err = q.Ack(ctx, d)
						case "nack":
							err = q.Nack(ctx, d)
						default:
							err = q.Extend(ctx, d, visibility)
						}
						if err := o.emit(d, err); err != nil {
							return err
						}
					}
					return o.exit(len(ds))
				}
				for start := 0; start < len(ds); start += client.MaxBatch {
					chunk := ds[start:min(start+client.MaxBatch, len(ds))]
					settle := q.AckBatch
					if what == "nack" {
						settle = q.NackBatch
					}
					outcomes, err := settle(ctx, chunk)
					if err != nil {
						return err
					}
					for i, d := range chunk {
						if err := o.emit(d, outcomes[i]); err != nil {
							return err
						}
					}
				}
				return o.exit(len(ds))
			})
		},
	}
	f := cmd.Flags()
	f.Uint64Var(&token, "delivery-token", 0, "the delivery token pop printed (required)")
	f.StringVar(&receipt, "receipt", "", "the receipt pop printed, hexadecimal (required)")
	if what == "extend" {
		f.DurationVar(&visibility, "visibility", server.DefaultVisibility, "the lease ends this long from now")
	}
	return cmd
}

// delivery is the delivery (id, token, receipt) of queue name, from the
// command line or pop's JSON.
func delivery(name string, id, token uint64, receipt string) (*client.Delivery, error) {
	if receipt == "" {
		return nil, errors.New("--receipt is required (the receipt pop printed)")
	}
	rb, err := hex.DecodeString(receipt)
	if err != nil {
		return nil, fmt.Errorf("--receipt %q is not hexadecimal", receipt)
	}
	return &client.Delivery{Queue: name, ID: id, Token: token, Receipt: rb}, nil
}

// readPopped reads the deliveries pop -o json printed, one JSON object
// each, from in.
func readPopped(name string, in io.Reader) ([]*client.Delivery, error) {
	var ds []*client.Delivery
	dec := json.NewDecoder(in)
	for {
		var popped queuePopJSON
		err := dec.Decode(&popped)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("stdin is not the JSON pop -o json prints: %v", err)
		}
		d, err := delivery(name, popped.ID, popped.DeliveryToken, popped.Receipt)
		if err != nil {
			return nil, fmt.Errorf("delivery %d on stdin: %w", len(ds)+1, err)
		}
		ds = append(ds, d)
	}
	if len(ds) == 0 {
		return nil, errors.New("stdin holds no delivery (the JSON pop -o json prints)")
	}
	return ds, nil
}

// settleOutcome prints what settling each delivery answered and counts
// the failures for the command's exit.
type settleOutcome struct {
	a      *app
	done   string // "acked", ...
	single bool   // one delivery only
	stale  int
	denied int
	first  error // the first failure
}

// emit prints the outcome err of settling d. A refusal of a lone delivery
// is returned, to end the command; of one of several it prints "denied".
func (o *settleOutcome) emit(d *client.Delivery, err error) error {
	out := queueSettleJSON{ID: d.ID, Result: o.done}
	switch {
	case errors.Is(err, client.ErrStale):
		out.Result = "stale"
		o.stale++
	case errors.Is(err, client.ErrPermissionDenied) && !o.single:
		out.Result = "denied"
		o.denied++
	case err != nil:
		return err
	}
	if err != nil && o.first == nil {
		o.first = err
	}
	return o.a.emit(out, func(w io.Writer) { fmt.Fprintf(w, "%s (item %d, delivery token %d)\n", out.Result, d.ID, d.Token) })
}

// exit is the command's error after n deliveries: a refusal (exit 1)
// before a stale token (exit 3), or nil.
func (o *settleOutcome) exit(n int) error {
	switch {
	case o.denied > 0:
		return &summaryError{fmt.Sprintf("%d of %d deliveries refused: %s", o.denied, n, strings.TrimPrefix(o.first.Error(), "tenure: ")), o.first}
	case o.stale > 0 && n == 1:
		return o.first
	case o.stale > 0:
		return &summaryError{fmt.Sprintf("%d of %d delivery tokens stale: %s", o.stale, n, strings.TrimPrefix(o.first.Error(), "tenure: ")), o.first}
	}
	return nil
}

// summaryError counts failures of several deliveries and wraps the first
// (for the exit code).
type summaryError struct {
	msg   string
	first error
}

func (e *summaryError) Error() string { return e.msg }
func (e *summaryError) Unwrap() error { return e.first }

func (a *app) queueLenCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "len QUEUE",
		Short: "Show how many items are queued, in flight and dead",
		Long: `Show QUEUE's counts.

JSON: {"queued":N,"in_flight":N,"dead":N,"max_attempts":N,"oldest_id":N,
"oldest_age_ms":N,"waiting":N}; oldest_* describe the oldest item queued or
in flight (0 when none), its age measured on the serving node (see
docs/queue.md); waiting counts the consumers blocked on the serving node.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				st, err := c.Queue(args[0]).Stats(ctx)
				if err != nil {
					return err
				}
				out := queueLenJSON{Queued: st.Queued, InFlight: st.InFlight, Dead: st.Dead, MaxAttempts: st.MaxAttempts, OldestID: st.OldestID, OldestAgeMs: st.OldestAge.Milliseconds(), Waiting: st.Waiting}
				return a.emit(out, func(w io.Writer) {
					fmt.Fprintf(w, "queued %d, in flight %d, dead %d", out.Queued, out.InFlight, out.Dead)
					if out.OldestID != 0 {
						fmt.Fprintf(w, ", oldest item %d is %v old", out.OldestID, st.OldestAge.Round(time.Millisecond))
					}
					fmt.Fprintln(w)
				})
			})
		},
	}
}

func (a *app) queueDLQCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "List and requeue dead-lettered items",
	}
	var (
		after uint64
		limit int
	)
	list := &cobra.Command{
		Use:   "list QUEUE [--after ID] [--limit N]",
		Short: "List dead-lettered items, oldest first",
		Long: `List QUEUE's dead-lettered items with ids above --after, oldest first:
all of them, or at most --limit. The server answers in pages (at most
1,000 items and 2 MiB each), which are read one after the other.

JSON: {"queue":"...","items":[{"id":N,"payload":"...","attempts":N},...]}.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.listing(cmd, func(ctx context.Context, c *client.Client) error {
				items, err := c.Queue(args[0]).DeadLetters(ctx, after, limit)
				if err != nil {
					return err
				}
				out := queueDLQListJSON{Queue: args[0], Items: []queueDeadJSON{}}
				for _, it := range items {
					out.Items = append(out.Items, queueDeadJSON{ID: it.ID, Payload: string(it.Payload), Attempts: it.Attempts})
				}
				return a.emit(out, func(w io.Writer) {
					for _, it := range out.Items {
						fmt.Fprintf(w, "%d\t%d attempts\t%s\n", it.ID, it.Attempts, it.Payload)
					}
				})
			})
		},
	}
	lf := list.Flags()
	lf.Uint64Var(&after, "after", 0, "list items with ids above this (paging)")
	lf.IntVar(&limit, "limit", 0, "list at most this many (0: all)")
	requeue := &cobra.Command{
		Use:   "requeue QUEUE [ID...]",
		Short: "Move dead-lettered items back to the queue (all, or the ids given)",
		Long: `Move QUEUE's dead-lettered items (all of them, or the ids given) back to
their original place in the queue, with their attempts reset.

JSON: {"requeued":N}.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var ids []uint64
			for _, s := range args[1:] {
				id, err := strconv.ParseUint(s, 10, 64)
				if err != nil {
					return fmt.Errorf("item id %q is not a number", s)
				}
				ids = append(ids, id)
			}
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				n, err := c.Queue(args[0]).RequeueDead(ctx, ids...)
				if err != nil {
					return err
				}
				out := queueRequeueJSON{Requeued: n}
				return a.emit(out, func(w io.Writer) { fmt.Fprintf(w, "requeued %d\n", n) })
			})
		},
	}
	cmd.AddCommand(list, requeue)
	return cmd
}

func (a *app) queuePurgeCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "purge QUEUE",
		Short: "Remove every item of a queue, keeping the queue",
		Long: `Remove every item of QUEUE: queued, in flight and dead. The queue keeps its
max attempts and its remembered operation ids and acks (a push retried
with a remembered --op-id is still "duplicate"). Deliveries in flight end:
their acks answer "stale". Purging an empty or unknown queue does nothing.

JSON: {"purged":N}: how many items were removed.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				n, err := c.Queue(args[0]).Purge(ctx)
				if err != nil {
					return err
				}
				return a.emit(queuePurgeJSON{Purged: n}, func(w io.Writer) { fmt.Fprintf(w, "purged %d\n", n) })
			})
		},
	}
}

func (a *app) queueDeleteCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "delete QUEUE",
		Short: "Delete a queue entirely",
		Long: `Delete QUEUE entirely: its items (queued, in flight and dead), its max
attempts and its remembered operation ids and acks. A later push creates it
anew (and a push retried with an old --op-id is enqueued again).
Deliveries in flight end: their acks answer "stale". Consumers waiting in
pop keep waiting.

JSON: {"deleted":true|false,"items":N}: whether the queue existed, and how
many items it held.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				r, err := c.Queue(args[0]).Delete(ctx)
				if err != nil {
					return err
				}
				out := queueDeleteJSON{Deleted: r.Deleted, Items: r.Items}
				return a.emit(out, func(w io.Writer) {
					if !out.Deleted {
						fmt.Fprintf(w, "no queue %s\n", args[0])
						return
					}
					fmt.Fprintf(w, "deleted queue %s (%d items)\n", args[0], out.Items)
				})
			})
		},
	}
}

// addQueueServeFlags registers the queue's admission limits on serve.
func addQueueServeFlags(f *pflag.FlagSet, l *server.Limits) {
	f.IntVar(&l.MaxQueuePayload, "max-queue-payload", server.DefaultMaxQueuePayload, "largest queue item payload in bytes (at most 4 MiB); larger is refused with INVALID_ARGUMENT")
}

// checkVisibility refuses a visibility lease the service does not accept
// (0 included: it would silently mean the server's default).
func checkVisibility(d time.Duration) error {
	if d < fsm.MinVisibilityMs*time.Millisecond || d > fsm.MaxVisibilityMs*time.Millisecond {
		return fmt.Errorf("--visibility %v is outside %v..%v", d, fsm.MinVisibilityMs*time.Millisecond, time.Duration(fsm.MaxVisibilityMs)*time.Millisecond)
	}
	return nil
}
