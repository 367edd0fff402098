package cli

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

// benchQueueJSON is `tenure bench queue -o json`.
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

func (a *app) benchQueueCommand() *cobra.Command {
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

func (a *app) runQueueBench(ctx context.Context, bf benchQueueFlags) (benchQueueJSON, error) {
	switch {
	case bf.producers < 1 || bf.consumers < 1:
		return benchQueueJSON{}, errors.New("--producers and --consumers must be at least 1")
	case bf.stored < 0 || bf.payload < 0:
		return benchQueueJSON{}, errors.New("--stored and --payload must not be negative")
	case bf.duration <= 0:
		return benchQueueJSON{}, errors.New("--duration must be positive")
	case bf.batch < 1 || bf.batch > client.MaxBatch:
		return benchQueueJSON{}, fmt.Errorf("--batch %d is outside 1..%d", bf.batch, client.MaxBatch)
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

	// Prefill with concurrent batches (the server commits several at once).
	t0 := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	prefill := make([]client.BatchItem, client.MaxBatch)
	for i := range prefill {
		prefill[i].Payload = payload
	}
	for range 8 {
		wg.Go(func() {
			for {
				end := next.Add(client.MaxBatch)
				n := min(int64(bf.stored)-(end-client.MaxBatch), client.MaxBatch)
				if n <= 0 {
					return
				}
				if _, err := q.EnqueueBatch(ctx, prefill[:n]); err != nil {
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
		return out, err
	default:
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
	// over reports the end of the run. A call may fail with the run's own
	// deadline a moment before rctx says so: that is not an error.
	deadline, _ := rctx.Deadline()
	over := func() bool { return rctx.Err() != nil || !time.Now().Before(deadline) }
	var enqueued, acked atomic.Int64
	// credit keeps the queue's length steady: a producer enqueues only
	// while fewer than (producers+consumers)×batch of its items wait
	// unacked.
	credit := newWindow(rctx, (bf.producers+bf.consumers)*bf.batch)
	items := make([]client.BatchItem, bf.batch)
	for i := range items {
		items[i].Payload = payload
	}
	prod := make([]*latencies, bf.producers)
	cons := make([]*latencies, bf.consumers)
	start := time.Now()
	for i := range prod {
		l := &latencies{}
		prod[i] = l
		wg.Go(func() {
			for !over() {
				if !credit.take(bf.batch) {
					return
				}
				t := time.Now()
				var err error
				if bf.batch == 1 {
					_, err = q.Enqueue(rctx, payload)
				} else {
					_, err = q.EnqueueBatch(rctx, items)
				}
				if err != nil {
					credit.give(bf.batch)
					if !over() {
						l.errs++
					}
					continue
				}
				l.enq = append(l.enq, time.Since(t))
				enqueued.Add(int64(bf.batch))
			}
		})
	}
	for i := range cons {
		l := &latencies{}
		cons[i] = l
		wg.Go(func() {
			for !over() {
				t := time.Now()
				var ds []*client.Delivery
				var err error
				if bf.batch == 1 {
					var d *client.Delivery
					if d, err = q.Dequeue(rctx, bf.visibility); err == nil {
						ds = []*client.Delivery{d}
					}
				} else {
					ds, err = q.DequeueBatch(rctx, bf.batch, bf.visibility)
				}
				if err != nil {
					if !over() {
						l.errs++
					}
					continue
				}
				l.deq = append(l.deq, time.Since(t))
				t = time.Now()
				actx, acancel := context.WithTimeout(context.Background(), cleanupTimeout)
				var outcomes []error
				if bf.batch == 1 {
					outcomes = []error{q.Ack(actx, ds[0])}
				} else {
					outcomes, err = q.AckBatch(actx, ds)
				}
				acancel()
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
				acked.Add(int64(ok))
				credit.give(len(ds))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	out.DurationS = elapsed.Seconds()
	out.Enqueued, out.Acked = enqueued.Load(), acked.Load()
	out.EnqueuesPerSec = float64(out.Enqueued) / elapsed.Seconds()
	out.ItemsPerSec = float64(out.Acked) / elapsed.Seconds()
	var enq, deq, ack []time.Duration
	for _, l := range append(prod, cons...) {
		enq, deq, ack = append(enq, l.enq...), append(deq, l.deq...), append(ack, l.ack...)
		out.Errors += l.errs
	}
	stats := func(d []time.Duration) (p50, p99, mx float64) {
		slices.Sort(d)
		if len(d) == 0 {
			return 0, 0, 0
		}
		return ms(percentile(d, 50)), ms(percentile(d, 99)), ms(d[len(d)-1])
	}
	out.EnqueueP50Ms, out.EnqueueP99Ms, out.EnqueueMaxMs = stats(enq)
	out.DequeueP50Ms, out.DequeueP99Ms, out.DequeueMaxMs = stats(deq)
	out.AckP50Ms, out.AckP99Ms, out.AckMaxMs = stats(ack)
	sctx, scancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer scancel()
	if st, err := q.Stats(sctx); err == nil {
		out.StoredAfter = st.Queued + st.InFlight
	}
	return out, nil
}
