package server

import (
	"context"
	"encoding/binary"
	"fmt"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// Queue batches: several items of one queue in one request and one
// commit (fsm/queue_batch.go says what is all-or-nothing and what is
// item by item).

// batchCount checks the number of items of a batch request.
func batchCount(what string, n int) error {
	switch {
	case n == 0:
		return fmt.Errorf("%w: %s batch needs at least one item", fsm.ErrInvalid, what)
	case n > fsm.MaxQueueBatch:
		return fmt.Errorf("%w: %s batch holds %d items, the limit is %d items per batch", fsm.ErrInvalid, what, n, fsm.MaxQueueBatch)
	}
	return nil
}

// admitEnqueueBatch applies the queue's admission limits to a batch: each
// payload within --max-queue-payload, all payloads and operation ids
// together within fsm.MaxQueueBatchBytes.
func (s *Server) admitEnqueueBatch(req *pb.QueueEnqueueBatchRequest) error {
	if err := s.checkName("queue name", req.GetQueue()); err != nil {
		return err
	}
	if err := batchCount("an enqueue", len(req.GetItems())); err != nil {
		return err
	}
	total := 0
	for i, it := range req.GetItems() {
		if n := len(it.GetPayload()); n > s.limits.MaxQueuePayload {
			return fmt.Errorf("%w: item %d: payload is %d bytes, the limit is %d (--max-queue-payload)", fsm.ErrInvalid, i, n, s.limits.MaxQueuePayload)
		}
		total += len(it.GetPayload()) + len(it.GetOperationId())
	}
	if total > fsm.MaxQueueBatchBytes {
		return fmt.Errorf("%w: the batch's payloads and operation ids are %d bytes together, the limit is %d bytes per batch", fsm.ErrInvalid, total, fsm.MaxQueueBatchBytes)
	}
	return nil
}

// QueueEnqueueBatch implements pb.TenureServer.
func (s *Server) QueueEnqueueBatch(ctx context.Context, req *pb.QueueEnqueueBatchRequest) (*pb.QueueEnqueueBatchResponse, error) {
	if err := s.admitEnqueueBatch(req); err != nil {
		return nil, toStatus(err)
	}
	size := 0
	for _, it := range req.GetItems() {
		size += len(it.GetPayload()) + len(it.GetOperationId()) + 2*binary.MaxVarintLen32
	}
	c := &fsmpb.QueueEnqueueBatch{Queue: req.GetQueue(), MaxAttempts: req.GetMaxAttempts(), Items: make([]byte, 0, size)}
	for _, it := range req.GetItems() {
		c.Items = fsm.AppendBatchItem(c.Items, it.GetPayload(), it.GetOperationId())
	}
	res, err := s.proposeOp(ctx, c)
	if err != nil {
		return nil, toStatus(err)
	}
	out := &pb.QueueEnqueueBatchResponse{Items: make([]*pb.QueueEnqueueResponse, len(res.Queue.Enqueued)), Revision: res.Revision}
	for i, it := range res.Queue.Enqueued {
		out.Items[i] = &pb.QueueEnqueueResponse{Id: it.ID, Duplicate: it.Duplicate, Revision: res.Revision}
	}
	return out, nil
}

// QueueDequeueBatch implements pb.TenureServer (see dequeue).
func (s *Server) QueueDequeueBatch(ctx context.Context, req *pb.QueueDequeueBatchRequest) (*pb.QueueDequeueBatchResponse, error) {
	if err := batchCount("a dequeue", int(req.GetMaxItems())); err != nil {
		return nil, toStatus(fmt.Errorf("%w (max_items)", err))
	}
	items, err := s.dequeue(ctx, req.GetQueue(), req.GetVisibilityMs(), req.GetSession(), req.GetSessionSecret(), req.GetWait(), int(req.GetMaxItems()))
	if err != nil {
		return nil, err
	}
	return &pb.QueueDequeueBatchResponse{Items: items}, nil
}

// settleBatch proposes an ack or nack batch of req and answers item by
// item. Receipts are hashed whatever they are (see settleArgs).
func (s *Server) settleBatch(ctx context.Context, req *pb.QueueSettleBatchRequest, ack bool) (*pb.QueueSettleBatchResponse, error) {
	if err := fsm.ValidateQueueName(req.GetQueue()); err != nil {
		return nil, toStatus(err)
	}
	what := "a nack"
	if ack {
		what = "an ack"
	}
	if err := batchCount(what, len(req.GetItems())); err != nil {
		return nil, toStatus(err)
	}
	c := &fsmpb.QueueSettleBatch{Queue: req.GetQueue(), Items: make([]*fsmpb.QueueSettleItem, len(req.GetItems()))}
	for i, d := range req.GetItems() {
		c.Items[i] = &fsmpb.QueueSettleItem{Id: d.GetId(), DeliveryToken: d.GetDeliveryToken(), ReceiptHash: fsm.ReceiptHash(d.GetReceipt())}
	}
	var op any = queueNackBatch{c}
	if ack {
		op = queueAckBatch{c}
	}
	res, err := s.proposeOp(ctx, op)
	if err != nil {
		return nil, toStatus(err)
	}
	out := &pb.QueueSettleBatchResponse{Items: make([]*pb.QueueSettleItemResult, len(res.Queue.Items)), Revision: res.Revision}
	for i, it := range res.Queue.Items {
		r := &pb.QueueSettleItemResult{Result: pb.QueueSettleResult_QUEUE_SETTLE_RESULT_OK}
		switch {
		case it.Err != nil:
			r = &pb.QueueSettleItemResult{Error: toProto(it.Err)}
		case it.Stale:
			r.Result = pb.QueueSettleResult_QUEUE_SETTLE_RESULT_STALE
		}
		out.Items[i] = r
	}
	return out, nil
}

// QueueAckBatch implements pb.TenureServer.
func (s *Server) QueueAckBatch(ctx context.Context, req *pb.QueueSettleBatchRequest) (*pb.QueueSettleBatchResponse, error) {
	return s.settleBatch(ctx, req, true)
}

// QueueNackBatch implements pb.TenureServer.
func (s *Server) QueueNackBatch(ctx context.Context, req *pb.QueueSettleBatchRequest) (*pb.QueueSettleBatchResponse, error) {
	return s.settleBatch(ctx, req, false)
}
