//go:build linux || darwin

package nemesis

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
)

// The queue workload runs beside the register workload, through the same
// faults. Producers enqueue unique payloads, each under an operation id
// equal to the payload, and retry an enqueue whose outcome is unknown with
// the same id. Consumers dequeue with a short visibility lease; some
// deliveries are abandoned (a consumer that dies before it settles), the
// rest acknowledged. After the faults heal, the queue is drained. The
// checks:
//   - nothing lost: every acknowledged enqueue was delivered (or is a dead
//     letter);
//   - duplicates only through redelivery: every delivery of an item has a
//     larger delivery token and a larger attempt number than the one
//     before, and an item whose ack was confirmed is never delivered again;
//   - enqueue is idempotent: an operation id maps to one item, whose
//     payload is delivered unchanged;
//   - deliveries belong to their consumer: a hostile client that knows
//     the id and delivery token of the latest delivery (more than an
//     adversary has, who would guess them) but not its receipt tries to
//     ack, nack or extend it with a receipt of its own; no attempt may
//     succeed.
const (
	checkQueueLost      = "queue-lost"
	checkQueueDuplicate = "queue-duplicate"
	checkQueueAckLost   = "queue-ack-lost"
	checkQueueIdentity  = "queue-identity"
	checkQueueForeign   = "queue-foreign-settle"

	queueName       = "nemesis-queue"
	queueVisibility = 1500 * time.Millisecond
	queueCallLimit  = 3 * time.Second
)

type queueDelivery struct {
	token   uint64
	attempt int
	payload string
}

// queueWorkload records what producers and consumers saw.
type queueWorkload struct {
	eps string

	// mu guards everything below.
	mu         sync.Mutex
	enqueued   map[string]uint64 // payload (= operation id) → item id, acknowledged enqueues
	idOf       map[uint64]string // item id → payload, from acknowledged enqueues
	unknown    int               // enqueues whose outcome stayed unknown
	deliveries map[uint64][]queueDelivery
	acked      map[uint64]uint64 // item id → delivery token of a confirmed ack
	staleAcks  int
	abandoned  int
	dead       map[uint64]bool
	latest     *client.Delivery // the latest delivery, for the hostile client
	// The hostile client's attempts (hostile: it ran): accepted (each an
	// anomaly), refused for the receipt, stale, and failed otherwise
	// (faults).
	hostile         bool
	foreignAccepted []string
	foreignDenied   int
	foreignStale    int
	foreignFailed   int
}

func newQueueWorkload(eps string) *queueWorkload {
	return &queueWorkload{eps: eps, enqueued: make(map[string]uint64), idOf: make(map[uint64]string),
		deliveries: make(map[uint64][]queueDelivery), acked: make(map[uint64]uint64), dead: make(map[uint64]bool)}
}

// produce enqueues until ctx ends.
func (w *queueWorkload) produce(ctx context.Context, id string, rnd *rand.Rand) {
	c, err := dialClient(ctx, w.eps)
	if err != nil {
		return
	}
	defer c.Close()
	q := c.Queue(queueName)
	for i := 0; ctx.Err() == nil; i++ {
		payload := fmt.Sprintf("%s-%d", id, i)
		ok := false
		for try := 0; try < 20 && !ok; try++ {
			cctx, cancel := context.WithTimeout(ctx, queueCallLimit)
			res, err := q.Enqueue(cctx, []byte(payload), client.WithOperationID(payload))
			cancel()
			if err == nil {
				ok = true
				w.mu.Lock()
				w.enqueued[payload] = res.ID
				w.idOf[res.ID] = payload
				w.mu.Unlock()
				break
			}
			if ctx.Err() != nil {
				break
			}
			pace(ctx, 100*time.Millisecond)
		}
		if !ok {
			w.mu.Lock()
			w.unknown++
			w.mu.Unlock()
		}
		pace(ctx, time.Duration(20+rnd.IntN(60))*time.Millisecond)
	}
}

func (w *queueWorkload) delivered(d *client.Delivery) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.deliveries[d.ID] = append(w.deliveries[d.ID], queueDelivery{token: d.Token, attempt: d.Attempt, payload: string(d.Payload)})
	w.latest = d
}

// steal is the hostile client (see the checks above). It runs until ctx
// ends.
func (w *queueWorkload) steal(ctx context.Context, rnd *rand.Rand) {
	c, err := dialClient(ctx, w.eps)
	if err != nil {
		return
	}
	defer c.Close()
	q := c.Queue(queueName)
	w.mu.Lock()
	w.hostile = true
	w.mu.Unlock()
	for ctx.Err() == nil {
		w.mu.Lock()
		d := w.latest
		w.mu.Unlock()
		if d == nil {
			pace(ctx, 50*time.Millisecond)
			continue
		}
		fake := &client.Delivery{Queue: queueName, ID: d.ID, Token: d.Token}
		if rnd.IntN(4) > 0 { // else no receipt at all
			fake.Receipt = make([]byte, len(d.Receipt))
			for i := range fake.Receipt {
				fake.Receipt[i] = byte(rnd.UintN(256))
			}
		}
		what := []string{"ack", "nack", "extend"}[rnd.IntN(3)]
		cctx, cancel := context.WithTimeout(ctx, queueCallLimit)
		switch what {
		case "ack":
			err = q.Ack(cctx, fake)
		case "nack":
			err = q.Nack(cctx, fake)
		default:
			err = q.Extend(cctx, fake, time.Minute)
		}
		cancel()
		w.mu.Lock()
		switch {
		case err == nil:
			w.foreignAccepted = append(w.foreignAccepted, fmt.Sprintf("%s of item %d under delivery token %d with receipt %x", what, d.ID, d.Token, fake.Receipt))
		case errors.Is(err, client.ErrPermissionDenied):
			w.foreignDenied++
		case errors.Is(err, client.ErrStale):
			w.foreignStale++
		default:
			w.foreignFailed++
		}
		w.mu.Unlock()
		pace(ctx, time.Duration(10+rnd.IntN(30))*time.Millisecond)
	}
}

func (w *queueWorkload) ack(ctx context.Context, q *client.Queue, d *client.Delivery) {
	cctx, cancel := context.WithTimeout(ctx, queueCallLimit)
	err := q.Ack(cctx, d)
	cancel()
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err == nil:
		w.acked[d.ID] = d.Token
	case errors.Is(err, client.ErrStale):
		w.staleAcks++
	}
}

// consume dequeues until ctx ends; one delivery in eight is abandoned.
func (w *queueWorkload) consume(ctx context.Context, rnd *rand.Rand) {
	c, err := dialClient(ctx, w.eps)
	if err != nil {
		return
	}
	defer c.Close()
	q := c.Queue(queueName)
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, queueCallLimit)
		d, err := q.Dequeue(cctx, queueVisibility)
		cancel()
		if err != nil {
			pace(ctx, 50*time.Millisecond)
			continue
		}
		w.delivered(d)
		if rnd.IntN(8) == 0 {
			w.mu.Lock()
			w.abandoned++
			w.mu.Unlock()
			continue
		}
		w.ack(ctx, q, d)
	}
}

// drain takes every item still queued or in flight (waiting out the
// visibility leases) and lists the dead letters. It runs on a healed
// cluster.
func (w *queueWorkload) drain(ctx context.Context, c *client.Client) error {
	q := c.Queue(queueName)
	for {
		if ctx.Err() != nil {
			return fmt.Errorf("queue not drained: %w", ctx.Err())
		}
		cctx, cancel := context.WithTimeout(ctx, queueCallLimit)
		d, err := q.TryDequeue(cctx, queueVisibility)
		cancel()
		if err == nil {
			w.delivered(d)
			w.ack(ctx, q, d)
			continue
		}
		if !errors.Is(err, client.ErrQueueEmpty) {
			pace(ctx, 100*time.Millisecond)
			continue
		}
		cctx, cancel = context.WithTimeout(ctx, queueCallLimit)
		st, err := q.Stats(cctx)
		cancel()
		if err == nil && st.Queued == 0 && st.InFlight == 0 {
			break
		}
		pace(ctx, 100*time.Millisecond) // in flight: its lease has to run out
	}
	cctx, cancel := context.WithTimeout(ctx, queueCallLimit)
	defer cancel()
	dead, err := q.DeadLetters(cctx, 0, 100_000)
	if err != nil {
		return fmt.Errorf("listing dead letters: %w", err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, d := range dead {
		w.dead[d.ID] = true
	}
	return nil
}

// check reports the anomalies and a summary line.
func (w *queueWorkload) check(r *report) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var redelivered, deliveries int
	for _, payload := range slices.Sorted(maps.Keys(w.enqueued)) {
		id := w.enqueued[payload]
		if len(w.deliveries[id]) == 0 && !w.dead[id] {
			r.anomaly(checkQueueLost, "item %d (%q), acknowledged at enqueue, was never delivered", id, payload)
		}
	}
	ids := make([]uint64, 0, len(w.deliveries))
	for id := range w.deliveries {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		ds := append([]queueDelivery(nil), w.deliveries[id]...)
		deliveries += len(ds)
		if len(ds) > 1 {
			redelivered++
		}
		// Deliveries were recorded in the order the consumers saw them,
		// which concurrent consumers may interleave: order by token.
		sort.Slice(ds, func(i, j int) bool { return ds[i].token < ds[j].token })
		for i, d := range ds {
			if want, ok := w.idOf[id]; ok && d.payload != want {
				r.anomaly(checkQueueIdentity, "item %d delivered with payload %q, enqueued as %q", id, d.payload, want)
			}
			if i == 0 {
				continue
			}
			prev := ds[i-1]
			if d.token == prev.token {
				r.anomaly(checkQueueDuplicate, "item %d delivered twice under delivery token %d", id, d.token)
			} else if d.attempt <= prev.attempt {
				r.anomaly(checkQueueDuplicate, "item %d delivered again (token %d, attempt %d) without a redelivery (previous token %d, attempt %d)", id, d.token, d.attempt, prev.token, prev.attempt)
			}
		}
		if tok, ok := w.acked[id]; ok && ds[len(ds)-1].token > tok {
			r.anomaly(checkQueueAckLost, "item %d delivered under token %d after its ack under token %d was confirmed", id, ds[len(ds)-1].token, tok)
		}
	}
	for _, a := range w.foreignAccepted {
		r.anomaly(checkQueueForeign, "a client without the receipt was accepted: %s", a)
	}
	if w.hostile && w.foreignDenied == 0 {
		r.anomaly(checkQueueForeign, "the hostile client was never refused for its receipt: it did not reach a current delivery (%d stale, %d failed)", w.foreignStale, w.foreignFailed)
	}
	seen := make(map[uint64]string)
	for _, payload := range slices.Sorted(maps.Keys(w.enqueued)) {
		id := w.enqueued[payload]
		if other, dup := seen[id]; dup {
			r.anomaly(checkQueueIdentity, "item %d returned for two enqueues (%q and %q)", id, other, payload)
		}
		seen[id] = payload
	}
	r.line("queue: %d acknowledged enqueues (%d unknown), %d deliveries of %d items (%d redelivered), %d confirmed acks, %d stale acks, %d abandoned deliveries, %d dead letters",
		len(w.enqueued), w.unknown, deliveries, len(ids), redelivered, len(w.acked), w.staleAcks, w.abandoned, len(w.dead))
	r.line("queue: hostile client: %d settles without the receipt accepted, %d refused (permission denied), %d stale, %d failed otherwise",
		len(w.foreignAccepted), w.foreignDenied, w.foreignStale, w.foreignFailed)
}

// TestQueueChecker: the queue checks report each kind of anomaly they
// exist for, and none for a clean history.
func TestQueueChecker(t *testing.T) {
	clean := func() *queueWorkload {
		w := newQueueWorkload("")
		w.enqueued["a"], w.idOf[10] = 10, "a"
		w.enqueued["b"], w.idOf[11] = 11, "b"
		w.deliveries[10] = []queueDelivery{{token: 20, attempt: 1, payload: "a"}, {token: 25, attempt: 2, payload: "a"}}
		w.deliveries[11] = []queueDelivery{{token: 21, attempt: 1, payload: "b"}}
		w.acked[10], w.acked[11] = 25, 21
		return w
	}
	cases := []struct {
		name  string
		spoil func(w *queueWorkload)
		want  string
	}{
		{"clean", func(*queueWorkload) {}, ""},
		{"lost", func(w *queueWorkload) { delete(w.deliveries, 11); delete(w.acked, 11) }, checkQueueLost},
		{"dead letter is not lost", func(w *queueWorkload) { delete(w.deliveries, 11); delete(w.acked, 11); w.dead[11] = true }, ""},
		{"same token twice", func(w *queueWorkload) {
			w.deliveries[11] = append(w.deliveries[11], queueDelivery{token: 21, attempt: 1, payload: "b"})
		}, checkQueueDuplicate},
		{"redelivery without a new attempt", func(w *queueWorkload) {
			w.deliveries[11] = append(w.deliveries[11], queueDelivery{token: 30, attempt: 1, payload: "b"})
			w.acked[11] = 30
		}, checkQueueDuplicate},
		{"delivered after a confirmed ack", func(w *queueWorkload) { w.acked[10] = 20 }, checkQueueAckLost},
		{"payload changed", func(w *queueWorkload) { w.deliveries[11][0].payload = "x" }, checkQueueIdentity},
		{"one item for two enqueues", func(w *queueWorkload) { w.enqueued["c"] = 11 }, checkQueueIdentity},
		{"foreign settle accepted", func(w *queueWorkload) { w.foreignAccepted = append(w.foreignAccepted, "ack of item 11") }, checkQueueForeign},
		{"hostile client never refused", func(w *queueWorkload) { w.hostile, w.foreignStale = true, 5 }, checkQueueForeign},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := clean()
			tc.spoil(w)
			var r report
			w.check(&r)
			got := r.byCheck()
			if tc.want == "" && len(r.anomalies) != 0 {
				t.Fatalf("anomalies in a clean history: %+v", r.anomalies)
			}
			if tc.want != "" && got[tc.want] == 0 {
				t.Fatalf("want a %s anomaly, got %+v", tc.want, r.anomalies)
			}
		})
	}
}
