package server

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/btree"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// Queue defaults and bounds of the RPC layer.
const (
	// DefaultVisibility is a dequeue's visibility lease when the request
	// names none.
	DefaultVisibility = 30 * time.Second
	// defaultDeadList and maxDeadList bound one page of dead letters (a
	// page also stops before maxPageBytes, page.go).
	defaultDeadList = 100
	maxDeadList     = 1000
	// MaxMessageSize is the largest gRPC message the server accepts: the
	// largest payload the state machine allows plus room for the rest.
	MaxMessageSize = fsm.MaxQueuePayload + 64<<10
	// receiptBytes is the length of a delivery's receipt (128 random bits).
	receiptBytes = 16
)

// newReceipts draws the receipts of n deliveries, and their hashes. The
// log and the state only ever see the hashes (fsm.ReceiptHash); the
// consumer alone gets the receipts.
func newReceipts(n int) (receipts, hashes [][]byte) {
	b := make([]byte, n*receiptBytes)
	rand.Read(b) // never fails (crypto/rand)
	receipts, hashes = make([][]byte, n), make([][]byte, n)
	for i := range receipts {
		receipts[i] = b[i*receiptBytes : (i+1)*receiptBytes : (i+1)*receiptBytes]
		hashes[i] = fsm.ReceiptHash(receipts[i])
	}
	return receipts, hashes
}

// GRPCOptions are the gRPC server options the service needs: messages
// large enough for the largest queue payload, and the codec that lets
// Register decode requests itself (wire.go).
func GRPCOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxMessageSize),
		grpc.ForceServerCodecV2(newCodec()),
		// Fixed flow-control windows (1 MiB per stream, 16 MiB per
		// connection) instead of gRPC's dynamic ones: the dynamic window
		// is sized by ping probes, about one per round trip on a busy
		// connection, each a write and a wake-up on both ends, for windows
		// this traffic of small messages never needs. The client does the
		// same.
		grpc.InitialWindowSize(1 << 20), grpc.InitialConnWindowSize(1 << 24),
		// The Go client pings a connection that has been silent for 10 s
		// while a call is open (client.Dial); gRPC's default policy would
		// close it for pinging more often than every 5 minutes.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second}),
	}
}

// DefaultQueueLimits are the queue's admission limits.
const (
	DefaultMaxQueuePayload = 1 << 20
)

// validateQueue checks the queue limits that have a hard ceiling.
func (l Limits) validateQueue() error {
	if l.MaxQueuePayload > fsm.MaxQueuePayload {
		return fmt.Errorf("--max-queue-payload %d is above the ceiling of %d bytes", l.MaxQueuePayload, fsm.MaxQueuePayload)
	}
	return nil
}

func (l Limits) withQueueDefaults() Limits {
	if l.MaxQueuePayload <= 0 {
		l.MaxQueuePayload = DefaultMaxQueuePayload
	}
	l.MaxQueuePayload = min(l.MaxQueuePayload, fsm.MaxQueuePayload)
	return l
}

// queueWaiters holds, per queue, the FIFO of dequeue requests waiting for
// an item. Waiting is not replicated: an item made ready wakes exactly one
// waiter (the first in line), taking it out of the line; it then proposes
// its dequeue, and one that loses the race to another consumer goes back
// to its original place. Safe for concurrent use.
type queueWaiters struct {
	wakeups atomic.Uint64

	// mu guards the fields below.
	mu      sync.Mutex
	seq     uint64
	byQueue map[string]*btree.BTreeG[*qwaiter]
}

type qwaiter struct {
	seq  uint64
	wake chan struct{} // buffered 1; signalled once per removal by ready
}

func waiterLess(a, b *qwaiter) bool { return a.seq < b.seq }

// join adds a new waiter at the end of name's line.
func (w *queueWaiters) join(name string) *qwaiter {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seq++
	qw := &qwaiter{seq: w.seq, wake: make(chan struct{}, 1)}
	w.insertLocked(name, qw)
	return qw
}

func (w *queueWaiters) insertLocked(name string, qw *qwaiter) {
	if w.byQueue == nil {
		w.byQueue = make(map[string]*btree.BTreeG[*qwaiter])
	}
	t := w.byQueue[name]
	if t == nil {
		t = btree.NewG(16, waiterLess)
		w.byQueue[name] = t
	}
	t.ReplaceOrInsert(qw)
}

// rejoin puts a woken waiter back at its original place.
func (w *queueWaiters) rejoin(name string, qw *qwaiter) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.insertLocked(name, qw)
}

// leave removes qw; a wake-up it received but did not use goes on to the
// next waiter, so that no item is left without one.
func (w *queueWaiters) leave(name string, qw *qwaiter) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if t := w.byQueue[name]; t != nil {
		t.Delete(qw)
	}
	select {
	case <-qw.wake:
		w.wakeLocked(name, 1)
	default:
	}
	if t := w.byQueue[name]; t != nil && t.Len() == 0 {
		delete(w.byQueue, name)
	}
}

// ready wakes up to n waiters of name, first come first.
func (w *queueWaiters) ready(name string, n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.wakeLocked(name, n)
}

func (w *queueWaiters) wakeLocked(name string, n int) {
	t := w.byQueue[name]
	for ; n > 0 && t != nil && t.Len() > 0; n-- {
		qw, _ := t.DeleteMin()
		w.wakeups.Add(1)
		qw.wake <- struct{}{} // never blocks: one signal per removal
	}
}

// wakeAll wakes every waiter of every queue: this node stopped leading, and
// each waiter's next proposal is refused, which sends its client on to the
// new leader instead of leaving it blocked here until its deadline.
func (w *queueWaiters) wakeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for name, t := range w.byQueue {
		w.wakeLocked(name, t.Len())
	}
}

func (w *queueWaiters) waiting(name string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if t := w.byQueue[name]; t != nil {
		return t.Len()
	}
	return 0
}

// queueEvent takes the queue's events from the state machine (Hub.Sink).
func (h *Hub) queueEvent(e fsm.Event) {
	if e.Kind != fsm.EventQueueReady {
		return
	}
	w := &h.queues
	w.mu.Lock()
	w.wakeLocked(e.Name, e.Queue.Ready)
	w.mu.Unlock()
}

// QueueWakeups reports how many waiting dequeues have been woken by items
// becoming ready: one per item at most, however many consumers wait.
func (h *Hub) QueueWakeups() uint64 { return h.queues.wakeups.Load() }

// QueueWaiting reports how many dequeues wait on the named queue.
func (h *Hub) QueueWaiting(name string) int { return h.queues.waiting(name) }

// admitEnqueue applies the queue's admission limits.
func (s *Server) admitEnqueue(req *pb.QueueEnqueueRequest) error {
	if err := s.checkName("queue name", req.GetQueue()); err != nil {
		return err
	}
	if n := len(req.GetPayload()); n > s.limits.MaxQueuePayload {
		return fmt.Errorf("%w: payload is %d bytes, the limit is %d (--max-queue-payload)", fsm.ErrInvalid, n, s.limits.MaxQueuePayload)
	}
	return nil
}

// QueueEnqueue implements pb.TenureServer.
func (s *Server) QueueEnqueue(ctx context.Context, req *pb.QueueEnqueueRequest) (*pb.QueueEnqueueResponse, error) {
	if err := s.admitEnqueue(req); err != nil {
		return nil, toStatus(err)
	}
	res, err := s.proposeOp(ctx, (&fsmpb.QueueEnqueue{Queue: req.GetQueue(), Payload: req.GetPayload(), OperationId: req.GetOperationId(), MaxAttempts: req.GetMaxAttempts()}))
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.QueueEnqueueResponse{Id: res.Queue.ID, Duplicate: res.Queue.Duplicate, Revision: res.Revision}, nil
}

// QueueDequeue implements pb.TenureServer: a dequeue batch of one item
// (see dequeue).
func (s *Server) QueueDequeue(ctx context.Context, req *pb.QueueDequeueRequest) (*pb.QueueDequeueResponse, error) {
	items, err := s.dequeue(ctx, req.GetQueue(), req.GetVisibilityMs(), req.GetSession(), req.GetSessionSecret(), req.GetWait(), 1)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return &pb.QueueDequeueResponse{}, nil
	}
	return &pb.QueueDequeueResponse{Item: items[0]}, nil
}

// dequeue hands out up to n items of the named queue under one
// visibility lease (0: DefaultVisibility). A waiting dequeue sits in its
// queue's line in the hub and proposes a dequeue each time it is woken.
// The proposal itself is detached from the call: if the caller has gone
// when items come back, they are returned to the queue (nacked) at once.
// Each proposal carries the hash of a fresh receipt per item; the answer
// carries the receipts themselves.
func (s *Server) dequeue(ctx context.Context, name string, vis int64, session uint64, secret []byte, wait bool, n int) ([]*pb.QueueItem, error) {
	if err := fsm.ValidateQueueName(name); err != nil {
		return nil, toStatus(err)
	}
	if vis == 0 {
		vis = DefaultVisibility.Milliseconds()
	}
	if err := fsm.ValidateVisibility(vis); err != nil {
		return nil, toStatus(err)
	}
	if session != 0 {
		if err := s.checkSession(session, secret); err != nil {
			return nil, toStatus(err)
		}
	}
	// The request is in its queue's line while it proposes and waits. A
	// wake-up takes it out of the line; the proposal that follows runs out
	// of line (so no second item is assigned to it meanwhile). If that one
	// loses the race, the request goes back to its place and looks once
	// more before it waits, so no item made ready in between is missed.
	//
	// The caller's right is checked again after every dequeue is applied
	// (the items of one applied after a revocation go back to the queue)
	// and whenever the ACLs change while it waits (revoke.go).
	rights := s.streamRights(ctx, "QueueDequeue", write(fsm.KindQueue, name))
	w := &s.hub.queues
	qw := w.join(name)
	defer w.leave(name, qw)
	inLine := true
	for {
		receipts, hashes := newReceipts(n)
		res, err := s.proposeDetached((&fsmpb.QueueDequeueBatch{Queue: name, Session: session, VisibilityMs: vis, ReceiptHashes: hashes}))
		if err != nil {
			return nil, toStatus(err)
		}
		if got := res.Queue.Items; len(got) > 0 {
			err := ctx.Err()
			if err == nil {
				err = rights.check()
			}
			if err != nil {
				back := &fsmpb.QueueSettleBatch{Queue: name}
				for i, d := range got {
					back.Items = append(back.Items, &fsmpb.QueueSettleItem{Id: d.ID, DeliveryToken: d.Token, ReceiptHash: hashes[i]})
				}
				_, _ = s.proposeDetached(queueNackBatch{back})
				return nil, toStatus(err)
			}
			items := make([]*pb.QueueItem, len(got))
			for i, d := range got {
				items[i] = &pb.QueueItem{Id: d.ID, Payload: d.Payload, DeliveryToken: d.Token, Attempt: d.Attempt, Receipt: receipts[i]}
			}
			return items, nil
		}
		if !wait {
			return nil, nil
		}
		if !inLine {
			w.rejoin(name, qw)
			inLine = true
			continue
		}
		if err := s.waitDequeue(ctx, qw, rights); err != nil {
			return nil, err
		}
		inLine = false
	}
}

// waitDequeue waits until qw is woken, ctx ends, or the caller loses its
// right to dequeue.
func (s *Server) waitDequeue(ctx context.Context, qw *qwaiter, rights *streamRights) error {
	for {
		acl := s.hub.acl.changed()
		if err := rights.check(); err != nil {
			return toStatus(err)
		}
		select {
		case <-qw.wake:
			return nil
		case <-acl:
		case <-ctx.Done():
			return toStatus(ctx.Err())
		}
	}
}

func (s *Server) settle(ctx context.Context, op any) (*pb.QueueSettleResponse, error) {
	res, err := s.proposeOp(ctx, op)
	if err != nil {
		return nil, toStatus(err)
	}
	out := &pb.QueueSettleResponse{Result: pb.QueueSettleResult_QUEUE_SETTLE_RESULT_OK, Revision: res.Revision}
	if res.Queue.Stale {
		out.Result = pb.QueueSettleResult_QUEUE_SETTLE_RESULT_STALE
	}
	return out, nil
}

// settleArgs is the settle command of req. The receipt is hashed whatever
// it is (a missing one too): the state machine compares the hash with the
// delivery's, and a mismatch is PERMISSION_DENIED.
func settleArgs(req *pb.QueueSettleRequest) *fsmpb.QueueSettle {
	return &fsmpb.QueueSettle{Queue: req.GetQueue(), Id: req.GetId(), DeliveryToken: req.GetDeliveryToken(), ReceiptHash: fsm.ReceiptHash(req.GetReceipt())}
}

// QueueAck implements pb.TenureServer. An ack repeated with the same
// token and receipt answers OK again (among the queue's 10,000 latest
// acks).
func (s *Server) QueueAck(ctx context.Context, req *pb.QueueSettleRequest) (*pb.QueueSettleResponse, error) {
	return s.settle(ctx, queueAck{settleArgs(req)})
}

// QueueNack implements pb.TenureServer.
func (s *Server) QueueNack(ctx context.Context, req *pb.QueueSettleRequest) (*pb.QueueSettleResponse, error) {
	return s.settle(ctx, queueNack{settleArgs(req)})
}

// QueueExtend implements pb.TenureServer.
func (s *Server) QueueExtend(ctx context.Context, req *pb.QueueSettleRequest) (*pb.QueueSettleResponse, error) {
	if err := fsm.ValidateVisibility(req.GetVisibilityMs()); err != nil {
		return nil, toStatus(err)
	}
	return s.settle(ctx, &fsmpb.QueueExtend{Queue: req.GetQueue(), Id: req.GetId(), DeliveryToken: req.GetDeliveryToken(), VisibilityMs: req.GetVisibilityMs(), ReceiptHash: fsm.ReceiptHash(req.GetReceipt())})
}

// QueuePurge implements pb.TenureServer.
func (s *Server) QueuePurge(ctx context.Context, req *pb.QueuePurgeRequest) (*pb.QueuePurgeResponse, error) {
	if err := fsm.ValidateQueueName(req.GetQueue()); err != nil {
		return nil, toStatus(err)
	}
	res, err := s.proposeOp(ctx, (&fsmpb.QueuePurge{Queue: req.GetQueue()}))
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.QueuePurgeResponse{Purged: uint64(res.Queue.Removed), Revision: res.Revision}, nil
}

// QueueDelete implements pb.TenureServer.
func (s *Server) QueueDelete(ctx context.Context, req *pb.QueueDeleteRequest) (*pb.QueueDeleteResponse, error) {
	if err := fsm.ValidateQueueName(req.GetQueue()); err != nil {
		return nil, toStatus(err)
	}
	res, err := s.proposeOp(ctx, (&fsmpb.QueueDelete{Queue: req.GetQueue()}))
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.QueueDeleteResponse{Deleted: res.Queue.Deleted, Items: uint64(res.Queue.Removed), Revision: res.Revision}, nil
}

// QueueStats implements pb.TenureServer.
func (s *Server) QueueStats(ctx context.Context, req *pb.QueueStatsRequest) (*pb.QueueStatsResponse, error) {
	if err := fsm.ValidateQueueName(req.GetQueue()); err != nil {
		return nil, toStatus(err)
	}
	out := &pb.QueueStatsResponse{Queue: req.GetQueue()}
	err := s.read(ctx, req.GetSerializable(), func(st *fsm.State) {
		v := st.QueueStats(req.GetQueue())
		out.Queued, out.InFlight, out.Dead, out.MaxAttempts, out.OldestId = uint64(v.Ready), uint64(v.InFlight), uint64(v.Dead), v.MaxAttempts, v.OldestID
		out.Revision = st.Revision()
	})
	if err != nil {
		return nil, err
	}
	out.Waiting = uint64(s.hub.queues.waiting(req.GetQueue()))
	if out.OldestId != 0 {
		out.OldestAgeMs = time.Since(s.hub.clock.when(out.OldestId)).Milliseconds()
	}
	return out, nil
}

// QueueDeadList implements pb.TenureServer.
func (s *Server) QueueDeadList(ctx context.Context, req *pb.QueueDeadListRequest) (*pb.QueueDeadListResponse, error) {
	if err := fsm.ValidateQueueName(req.GetQueue()); err != nil {
		return nil, toStatus(err)
	}
	limit := int(req.GetLimit())
	if limit == 0 {
		limit = defaultDeadList
	}
	var p pager
	p.list(int64(min(limit, maxDeadList)))
	out := &pb.QueueDeadListResponse{}
	err := s.read(ctx, false, func(st *fsm.State) {
		out.Dead = uint64(st.QueueStats(req.GetQueue()).Dead)
		for it := range st.DeadLetters(req.GetQueue(), req.GetAfterId()) {
			item := &pb.QueueDeadItem{Id: it.ID, Payload: it.Payload, Attempts: it.Attempts}
			if !p.take(item) {
				break
			}
			out.Items = append(out.Items, item)
		}
	})
	out.More = p.more
	return out, err
}

// QueueDeadRequeue implements pb.TenureServer.
func (s *Server) QueueDeadRequeue(ctx context.Context, req *pb.QueueDeadRequeueRequest) (*pb.QueueDeadRequeueResponse, error) {
	if err := fsm.ValidateQueueName(req.GetQueue()); err != nil {
		return nil, toStatus(err)
	}
	res, err := s.proposeOp(ctx, (&fsmpb.QueueRequeueDead{Queue: req.GetQueue(), Ids: req.GetIds()}))
	if err != nil {
		return nil, toStatus(err)
	}
	out := &pb.QueueDeadRequeueResponse{Requeued: uint64(res.Queue.Requeued)}
	s.node.Read(func(st *fsm.State) { out.Dead = uint64(st.QueueStats(req.GetQueue()).Dead) })
	return out, nil
}
