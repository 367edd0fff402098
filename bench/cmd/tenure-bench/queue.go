package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/tenure-io/tenure/client"
)

type benchQueueFlags struct {
	producers, consumers int
	stored               int
	duration             time.Duration
	payload              int
	visibility           time.Duration
	batch                int
}

// benchQueueJSON is `tenure-bench queue -o json`.
type benchQueueJSON struct {
	Queue          string  `json:"queue"`
	Producers      int     `json:"producers"`
	Consumers      int     `json:"consumers"`
	Batch          int     `json:"batch"`
	PayloadBytes   int     `json:"payload_bytes"`
	StoredBefore   int     `json:"stored_before"`
	StoredAfter    int     `json:"stored_after"`
	PrefillS       float64 `json:"prefill_s"`
	PrefillPerSec  float64 `json:"prefill_per_sec"`
	DurationS      float64 `json:"duration_s"`
	Enqueued       int64   `json:"enqueued"`
	Acked          int64   `json:"acked"`
	EnqueuesPerSec float64 `json:"enqueues_per_sec"`
	ItemsPerSec    float64 `json:"items_per_sec"`
	EnqueueP50Ms   float64 `json:"enqueue_p50_ms"`
	EnqueueP99Ms   float64 `json:"enqueue_p99_ms"`
	EnqueueMaxMs   float64 `json:"enqueue_max_ms"`
	DequeueP50Ms   float64 `json:"dequeue_p50_ms"`
	DequeueP99Ms   float64 `json:"dequeue_p99_ms"`
	DequeueMaxMs   float64 `json:"dequeue_max_ms"`
	AckP50Ms       float64 `json:"ack_p50_ms"`
	AckP99Ms       float64 `json:"ack_p99_ms"`
	AckMaxMs       float64 `json:"ack_max_ms"`
	Errors         int64   `json:"errors"`
}

// queueCommand is the queue benchmark.
func (a *app) queueCommand() *cobra.Command {
	var bf benchQueueFlags
	cmd := &cobra.Command{
		Use:   "queue --producers N --consumers N --stored N --duration D [--batch N]",
		Short: "Measure queue throughput (enqueue + dequeue + ack) against a running server",
		Long: `Fill a fresh queue with --stored items (in batches of 1,000), then run
--producers clients that enqueue and --consumers clients that dequeue and
ack, for --duration, and report items/s (acked) with latencies. With
--batch N, each request is a batch of up to N items: EnqueueBatch,
DequeueBatch, AckBatch (the latencies are per request). Producers stay at
most (producers+consumers)×batch items ahead of the consumers, so the queue
holds about --stored items throughout and the figures show whether its
length costs anything. The server's max-queue-length must allow --stored
plus that window.

JSON: {"queue","producers","consumers","batch","payload_bytes","stored_before",
"stored_after","prefill_s","prefill_per_sec","duration_s","enqueued",
"acked","enqueues_per_sec","items_per_sec","enqueue_p50_ms",
"enqueue_p99_ms","enqueue_max_ms","dequeue_p50_ms","dequeue_p99_ms",
"dequeue_max_ms","ack_p50_ms","ack_p99_ms","ack_max_ms","errors"}.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			out, err := a.runQueueBench(ctx, bf)
			if err != nil {
				return a.describe(err)
			}
			return a.emit(out, func(w io.Writer) {
				fmt.Fprintf(w, "%d producers, %d consumers, batch %d, %d items stored (prefill %.0f/s), %.1fs: %.0f items/s acked, %.0f enqueues/s; enqueue p50 %.2fms p99 %.2fms max %.2fms, dequeue p50 %.2fms p99 %.2fms max %.2fms, ack p50 %.2fms p99 %.2fms max %.2fms, %d errors\n",
					out.Producers, out.Consumers, out.Batch, out.StoredBefore, out.PrefillPerSec, out.DurationS, out.ItemsPerSec, out.EnqueuesPerSec, out.EnqueueP50Ms, out.EnqueueP99Ms, out.EnqueueMaxMs, out.DequeueP50Ms, out.DequeueP99Ms, out.DequeueMaxMs, out.AckP50Ms, out.AckP99Ms, out.AckMaxMs, out.Errors)
			})
		},
	}
	f := cmd.Flags()
	f.IntVar(&bf.producers, "producers", 16, "clients enqueueing")
	f.IntVar(&bf.consumers, "consumers", 16, "clients dequeueing and acking")
	f.IntVar(&bf.stored, "stored", 100, "items put in the queue before measuring")
	f.DurationVar(&bf.duration, "duration", 10*time.Second, "how long to measure")
	f.IntVar(&bf.payload, "payload", 100, "payload bytes per item")
	f.DurationVar(&bf.visibility, "visibility", 30*time.Second, "visibility lease of each dequeue")
	f.IntVar(&bf.batch, "batch", 1, "items per request (1: the single-item requests; up to 1,000)")
	return cmd
}

// window is a count of free slots that producers take and consumers give
// back; take waits until there are enough, or ctx ends.
type window struct {
	ctx context.Context
	// mu guards free.
	mu   sync.Mutex
	cond *sync.Cond
	free int
}

func newWindow(ctx context.Context, size int) *window {
	w := &window{ctx: ctx, free: size}
	w.cond = sync.NewCond(&w.mu)
	context.AfterFunc(ctx, func() {
		w.mu.Lock()
		w.cond.Broadcast()
		w.mu.Unlock()
	})
	return w
}

// take takes n slots; false when ctx ended first.
func (w *window) take(n int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.free < n && w.ctx.Err() == nil {
		w.cond.Wait()
	}
	if w.ctx.Err() != nil {
		return false
	}
	w.free -= n
	return true
}

func (w *window) give(n int) {
	w.mu.Lock()
	w.free += n
	w.cond.Broadcast()
	w.mu.Unlock()
}

// latencies is one worker's tally; only its goroutine writes it.
type latencies struct {
	enq, deq, ack []time.Duration
	errs          int64
}

// runQueueBench fills a fresh queue, then measures producers and
// consumers against it for bf.duration.
func (a *app) runQueueBench(ctx context.Context, bf benchQueueFlags) (benchQueueJSON, error) {
	if err := bf.validate(); err != nil {
		return benchQueueJSON{}, err
	}
	var rid [4]byte
	_, _ = rand.Read(rid[:])
	c, err := a.dial(ctx)
	if err != nil {
		return benchQueueJSON{}, err
	}
	defer c.Close()
	q := c.Queue("bench-q-" + hex.EncodeToString(rid[:]))
	payload := make([]byte, bf.payload)
	out := benchQueueJSON{Queue: q.Name(), Producers: bf.producers, Consumers: bf.consumers, Batch: bf.batch, PayloadBytes: bf.payload}

	t0 := time.Now()
	if err := prefill(ctx, q, bf.stored, payload); err != nil {
		return out, err
	}
	out.PrefillS = time.Since(t0).Seconds()
	if bf.stored > 0 {
		out.PrefillPerSec = float64(bf.stored) / out.PrefillS
	}
	st, err := q.Stats(ctx)
	if err != nil {
		return out, err
	}
	out.StoredBefore = st.Queued + st.InFlight

	rctx, cancel := context.WithTimeout(ctx, bf.duration)
	defer cancel()
	r := newQueueRun(rctx, q, bf, payload)
	start := time.Now()
	prod, cons := r.measure()
	r.report(&out, time.Since(start), append(prod, cons...))

	_ = cleanup(func(ctx context.Context) error {
		st, err := q.Stats(ctx)
		if err == nil {
			out.StoredAfter = st.Queued + st.InFlight
		}
		return err
	})
	return out, nil
}

func (bf benchQueueFlags) validate() error {
	switch {
	case bf.producers < 1 || bf.consumers < 1:
		return errors.New("--producers and --consumers must be at least 1")
	case bf.stored < 0 || bf.payload < 0:
		return errors.New("--stored and --payload must not be negative")
	case bf.duration <= 0:
		return errors.New("--duration must be positive")
	case bf.batch < 1 || bf.batch > client.MaxBatch:
		return fmt.Errorf("--batch %d is outside 1..%d", bf.batch, client.MaxBatch)
	}
	return nil
}

// prefill enqueues stored items with concurrent batches of client.MaxBatch
// (the server commits several at once); the first error ends it.
func prefill(ctx context.Context, q *client.Queue, stored int, payload []byte) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	batch := make([]client.BatchItem, client.MaxBatch)
	for i := range batch {
		batch[i].Payload = payload
	}
	for range 8 {
		wg.Go(func() {
			for {
				end := next.Add(client.MaxBatch)
				n := min(int64(stored)-(end-client.MaxBatch), client.MaxBatch)
				if n <= 0 {
					return
				}
				if _, err := q.EnqueueBatch(ctx, batch[:n]); err != nil {
					select {
					case errc <- fmt.Errorf("prefill: %w", err):
					default:
					}
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// queueRun is one measurement window: producers and consumers on one
// queue until ctx ends.
type queueRun struct {
	ctx      context.Context
	deadline time.Time
	q        *client.Queue
	bf       benchQueueFlags
	payload  []byte
	// items is the batch a producer enqueues when bf.batch > 1 (read only).
	items []client.BatchItem
	// credit keeps the queue's length steady: a producer enqueues only
	// while fewer than (producers+consumers)×batch of its items wait
	// unacked.
	credit          *window
	enqueued, acked atomic.Int64
}

func newQueueRun(ctx context.Context, q *client.Queue, bf benchQueueFlags, payload []byte) *queueRun {
	deadline, _ := ctx.Deadline()
	r := &queueRun{ctx: ctx, deadline: deadline, q: q, bf: bf, payload: payload,
		items: make([]client.BatchItem, bf.batch), credit: newWindow(ctx, (bf.producers+bf.consumers)*bf.batch)}
	for i := range r.items {
		r.items[i].Payload = payload
	}
	return r
}

// over reports the end of the run. A call may fail with the run's own
// deadline a moment before ctx says so: that is not an error.
func (r *queueRun) over() bool { return r.ctx.Err() != nil || !time.Now().Before(r.deadline) }

// measure runs the producers and consumers until the window ends and
// returns their tallies.
func (r *queueRun) measure() (prod, cons []*latencies) {
	var wg sync.WaitGroup
	prod = make([]*latencies, r.bf.producers)
	cons = make([]*latencies, r.bf.consumers)
	for i := range prod {
		l := &latencies{}
		prod[i] = l
		wg.Go(func() { r.produce(l) })
	}
	for i := range cons {
		l := &latencies{}
		cons[i] = l
		wg.Go(func() { r.consume(l) })
	}
	wg.Wait()
	return prod, cons
}

// produce enqueues (one item or a batch per request) while the window
// has credit, until the run is over.
func (r *queueRun) produce(l *latencies) {
	for !r.over() {
		if !r.credit.take(r.bf.batch) {
			return
		}
		t := time.Now()
		var err error
		if r.bf.batch == 1 {
			_, err = r.q.Enqueue(r.ctx, r.payload)
		} else {
			_, err = r.q.EnqueueBatch(r.ctx, r.items)
		}
		if err != nil {
			r.credit.give(r.bf.batch)
			if !r.over() {
				l.errs++
			}
			continue
		}
		l.enq = append(l.enq, time.Since(t))
		r.enqueued.Add(int64(r.bf.batch))
	}
}

// consume dequeues and acks until the run is over, giving the window back
// the credit of what it took.
func (r *queueRun) consume(l *latencies) {
	for !r.over() {
		t := time.Now()
		ds, err := r.dequeue()
		if err != nil {
			if !r.over() {
				l.errs++
			}
			continue
		}
		l.deq = append(l.deq, time.Since(t))
		t = time.Now()
		outcomes, err := r.ack(ds)
		if err != nil {
			l.errs++
			continue
		}
		ok := 0
		for _, e := range outcomes {
			if e != nil {
				l.errs++
			} else {
				ok++
			}
		}
		l.ack = append(l.ack, time.Since(t))
		r.acked.Add(int64(ok))
		r.credit.give(len(ds))
	}
}

// dequeue takes one delivery, or a batch of up to bf.batch.
func (r *queueRun) dequeue() ([]*client.Delivery, error) {
	if r.bf.batch == 1 {
		d, err := r.q.Dequeue(r.ctx, r.bf.visibility)
		if err != nil {
			return nil, err
		}
		return []*client.Delivery{d}, nil
	}
	return r.q.DequeueBatch(r.ctx, r.bf.batch, r.bf.visibility)
}

// ack acknowledges ds under a fresh context (the window may have ended):
// one outcome per delivery, or an error for the whole request.
func (r *queueRun) ack(ds []*client.Delivery) ([]error, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if r.bf.batch == 1 {
		return []error{r.q.Ack(ctx, ds[0])}, nil
	}
	return r.q.AckBatch(ctx, ds)
}

// report fills out's rates and latencies from the workers' tallies.
func (r *queueRun) report(out *benchQueueJSON, elapsed time.Duration, tallies []*latencies) {
	out.DurationS = elapsed.Seconds()
	out.Enqueued, out.Acked = r.enqueued.Load(), r.acked.Load()
	out.EnqueuesPerSec = float64(out.Enqueued) / elapsed.Seconds()
	out.ItemsPerSec = float64(out.Acked) / elapsed.Seconds()
	var enq, deq, ack []time.Duration
	for _, l := range tallies {
		enq, deq, ack = append(enq, l.enq...), append(deq, l.deq...), append(ack, l.ack...)
		out.Errors += l.errs
	}
	out.EnqueueP50Ms, out.EnqueueP99Ms, out.EnqueueMaxMs = latencyStats(enq)
	out.DequeueP50Ms, out.DequeueP99Ms, out.DequeueMaxMs = latencyStats(deq)
	out.AckP50Ms, out.AckP99Ms, out.AckMaxMs = latencyStats(ack)
}

// latencyStats sorts d and returns its p50, p99 and maximum in ms (zeros
// when d is empty).
func latencyStats(d []time.Duration) (p50, p99, mx float64) {
	slices.Sort(d)
	if len(d) == 0 {
		return 0, 0, 0
	}
	return ms(percentile(d, 50)), ms(percentile(d, 99)), ms(d[len(d)-1])
}
