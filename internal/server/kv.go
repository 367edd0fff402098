package server

import (
	"context"
	"fmt"
	"time"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// KVLimits bound the key-value store and its watch history. Zero fields
// mean the defaults (DefaultKVLimits). Requests within the limits keep
// being served when one is reached.
type KVLimits struct {
	// MaxKeyLen bounds a key, bytes (--max-key-len; at most fsm.MaxNameLen).
	MaxKeyLen int
	// MaxValueLen bounds a value, bytes (--max-value-len; at most
	// fsm.MaxKVValueLen).
	MaxValueLen int
	// MaxTxnOps bounds a transaction's compares plus the ops of its
	// branches (--max-txn-ops; at most fsm.MaxTxnOps).
	MaxTxnOps int
	// WatchHistory bounds the event history kept for watches, in events
	// (--watch-history).
	WatchHistory int
	// WatchHistoryBytes bounds it in bytes (--watch-history-bytes).
	WatchHistoryBytes int
	// WatchProgressInterval is how often an idle watch is told the current
	// revision (--watch-progress-interval).
	WatchProgressInterval time.Duration
	// MaxWatches bounds the watch streams (KVWatch and Observe) open on
	// this node (--max-watches); MaxWatchesPerConnection bounds them per
	// client connection (--max-watches-per-connection).
	MaxWatches, MaxWatchesPerConnection int
}

// DefaultKVLimits are the key-value limits `tenure serve` runs with.
func DefaultKVLimits() KVLimits {
	return KVLimits{
		MaxKeyLen:             fsm.MaxNameLen,
		MaxValueLen:           fsm.MaxKVValueLen,
		MaxTxnOps:             128,
		WatchHistory:          100_000,
		WatchHistoryBytes:     128 << 20,
		WatchProgressInterval: 10 * time.Second,

		MaxWatches:              DefaultMaxWatches,
		MaxWatchesPerConnection: DefaultMaxWatchesPerConnection,
	}
}

// Validate reports a limit set past the state machine's hard ceiling.
func (l KVLimits) Validate() error {
	switch {
	case l.MaxKeyLen > fsm.MaxNameLen:
		return fmt.Errorf("%w: --max-key-len %d is above the ceiling %d", fsm.ErrInvalid, l.MaxKeyLen, fsm.MaxNameLen)
	case l.MaxValueLen > fsm.MaxKVValueLen:
		return fmt.Errorf("%w: --max-value-len %d is above the ceiling %d", fsm.ErrInvalid, l.MaxValueLen, fsm.MaxKVValueLen)
	case l.MaxTxnOps > fsm.MaxTxnOps:
		return fmt.Errorf("%w: --max-txn-ops %d is above the ceiling %d", fsm.ErrInvalid, l.MaxTxnOps, fsm.MaxTxnOps)
	}
	return nil
}

func (l KVLimits) withDefaults() KVLimits {
	d := DefaultKVLimits()
	fill := func(v *int, def, ceiling int) {
		if *v <= 0 {
			*v = def
		}
		*v = min(*v, ceiling)
	}
	fill(&l.MaxKeyLen, d.MaxKeyLen, fsm.MaxNameLen)
	fill(&l.MaxValueLen, d.MaxValueLen, fsm.MaxKVValueLen)
	fill(&l.MaxTxnOps, d.MaxTxnOps, fsm.MaxTxnOps)
	fill(&l.WatchHistory, d.WatchHistory, int(^uint(0)>>1))
	fill(&l.WatchHistoryBytes, d.WatchHistoryBytes, int(^uint(0)>>1))
	fill(&l.MaxWatches, d.MaxWatches, int(^uint(0)>>1))
	fill(&l.MaxWatchesPerConnection, d.MaxWatchesPerConnection, int(^uint(0)>>1))
	if l.WatchProgressInterval <= 0 {
		l.WatchProgressInterval = d.WatchProgressInterval
	}
	return l
}

// configureKV applies the limits to the hub's watch history.
func (s *Server) configureKV() {
	s.hub.kv.configure(s.limits.KV.WatchHistory, s.limits.KV.WatchHistoryBytes)
	s.watches = watchSlots{maxTotal: s.limits.KV.MaxWatches, maxPerConn: s.limits.KV.MaxWatchesPerConnection}
}

func (s *Server) admitKey(key string) error {
	if len(key) > s.limits.KV.MaxKeyLen {
		return fmt.Errorf("%w: key is %d bytes, the limit is %d (--max-key-len)", fsm.ErrInvalid, len(key), s.limits.KV.MaxKeyLen)
	}
	return nil
}

func (s *Server) admitValue(v []byte) error {
	if len(v) > s.limits.KV.MaxValueLen {
		return fmt.Errorf("%w: value is %d bytes, the limit is %d (--max-value-len)", fsm.ErrInvalid, len(v), s.limits.KV.MaxValueLen)
	}
	return nil
}

func (s *Server) admitPut(p *pb.KVPutRequest) error {
	if err := s.admitKey(p.GetKey()); err != nil {
		return err
	}
	if err := s.admitValue(p.GetValue()); err != nil {
		return err
	}
	if p.GetSession() != 0 {
		return s.checkSession(p.GetSession(), p.GetSessionSecret())
	}
	return nil
}

func (s *Server) proposeKV(ctx context.Context, op any) (fsm.Result, error) {
	res, err := s.proposeOp(ctx, op)
	if err == nil {
		err = res.Err
	}
	return res, err
}

// KVPut implements pb.TenureServer.
func (s *Server) KVPut(ctx context.Context, req *pb.KVPutRequest) (*pb.KVPutResponse, error) {
	if err := s.admitPut(req); err != nil {
		return nil, toStatus(err)
	}
	res, err := s.proposeKV(ctx, &fsmpb.KVPut{Key: req.GetKey(), Value: req.GetValue(), Session: req.GetSession()})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.KVPutResponse{Revision: res.Revision}, nil
}

// KVDelete implements pb.TenureServer.
func (s *Server) KVDelete(ctx context.Context, req *pb.KVDeleteRequest) (*pb.KVDeleteResponse, error) {
	if err := s.admitKey(req.GetKey()); err != nil {
		return nil, toStatus(err)
	}
	res, err := s.proposeKV(ctx, &fsmpb.KVDelete{Key: req.GetKey(), Prefix: req.GetPrefix()})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.KVDeleteResponse{Deleted: res.KV.Deleted, Revision: res.Revision}, nil
}

// KVRange implements pb.TenureServer.
func (s *Server) KVRange(ctx context.Context, req *pb.KVRangeRequest) (*pb.KVRangeResponse, error) {
	if err := fsm.ValidateKVKey(req.GetKey(), req.GetPrefix()); err != nil {
		return nil, toStatus(err)
	}
	if req.GetLimit() < 0 {
		return nil, toStatus(fmt.Errorf("%w: negative limit", fsm.ErrInvalid))
	}
	if err := s.admitKey(req.GetStartKey()); err != nil {
		return nil, toStatus(err)
	}
	out := &pb.KVRangeResponse{}
	var p pager
	p.list(req.GetLimit())
	err := s.read(ctx, req.GetSerializable(), func(st *fsm.State) {
		out.Revision = st.Revision()
		if !req.GetPrefix() {
			if kv, ok := st.KVGet(req.GetKey()); ok {
				out.Kvs = []*pb.KVKeyValue{kvToProto(&kv)}
			}
			return
		}
		// A page after a key that is not UTF-8 starts from its shown form.
		for kv := range st.KVFrom(req.GetKey(), fsm.KeyFromShown(req.GetStartKey())) {
			pkv := kvToProto(&kv)
			if !p.take(pkv) {
				break
			}
			out.Kvs = append(out.Kvs, pkv)
		}
	})
	out.More = p.more
	return out, err
}

func txnOpsToFSM(ops []*pb.KVRequestOp) ([]*fsmpb.KVOp, error) {
	out := make([]*fsmpb.KVOp, len(ops))
	for i, op := range ops {
		switch o := op.GetOp().(type) {
		case *pb.KVRequestOp_Put:
			out[i] = &fsmpb.KVOp{Op: &fsmpb.KVOp_Put{Put: &fsmpb.KVPut{Key: o.Put.GetKey(), Value: o.Put.GetValue(), Session: o.Put.GetSession()}}}
		case *pb.KVRequestOp_Delete:
			out[i] = &fsmpb.KVOp{Op: &fsmpb.KVOp_Delete{Delete: &fsmpb.KVDelete{Key: o.Delete.GetKey(), Prefix: o.Delete.GetPrefix()}}}
		case *pb.KVRequestOp_Range:
			out[i] = &fsmpb.KVOp{Op: &fsmpb.KVOp_Range{Range: &fsmpb.KVRange{Key: o.Range.GetKey(), Prefix: o.Range.GetPrefix(), Limit: o.Range.GetLimit(), StartKey: fsm.KeyFromShown(o.Range.GetStartKey())}}}
		default:
			return nil, fmt.Errorf("%w: transaction op %d is empty", fsm.ErrInvalid, i)
		}
	}
	return out, nil
}

// admitTxn checks a transaction against the size limits of this node (the
// state machine applies the limits on keys and bytes).
func (s *Server) admitTxn(req *pb.KVTxnRequest) error {
	n := len(req.GetCompare()) + len(req.GetSuccess()) + len(req.GetFailure())
	if n > s.limits.KV.MaxTxnOps {
		return fmt.Errorf("%w: transaction has %d compares and ops, the limit is %d (--max-txn-ops)", fsm.ErrInvalid, n, s.limits.KV.MaxTxnOps)
	}
	for _, c := range req.GetCompare() {
		if err := s.admitKey(c.GetKey()); err != nil {
			return err
		}
	}
	for _, branch := range [][]*pb.KVRequestOp{req.GetSuccess(), req.GetFailure()} {
		for _, op := range branch {
			switch {
			case op.GetPut() != nil:
				if err := s.admitPut(op.GetPut()); err != nil {
					return err
				}
			case op.GetDelete() != nil:
				if err := s.admitKey(op.GetDelete().GetKey()); err != nil {
					return err
				}
			case op.GetRange() != nil:
				if err := s.admitKey(op.GetRange().GetKey()); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// KVTxn implements pb.TenureServer.
func (s *Server) KVTxn(ctx context.Context, req *pb.KVTxnRequest) (*pb.KVTxnResponse, error) {
	if err := s.admitTxn(req); err != nil {
		return nil, toStatus(err)
	}
	// Each range answers one page, as a plain range does, and the whole
	// answer is bounded before anything is written or collected.
	txn := &fsmpb.KVTxn{Paged: true, MaxAnswerBytes: uint64(s.limits.MaxResponseBytes)}
	for _, c := range req.GetCompare() {
		txn.Compares = append(txn.Compares, &fsmpb.KVCompare{Key: c.GetKey(), Target: uint32(c.GetTarget()), Result: uint32(c.GetResult()), Value: c.GetValue(), Number: c.GetNumber()})
	}
	var err error
	if txn.Success, err = txnOpsToFSM(req.GetSuccess()); err != nil {
		return nil, toStatus(err)
	}
	if txn.Failure, err = txnOpsToFSM(req.GetFailure()); err != nil {
		return nil, toStatus(err)
	}
	s.node.Read(func(st *fsm.State) { err = st.CheckTxnAnswer(txn) })
	if err != nil { // refused before it takes a place in the log
		return nil, toStatus(err)
	}
	res, err := s.proposeKV(ctx, txn)
	if err != nil {
		return nil, toStatus(err)
	}
	ops := req.GetSuccess()
	if !res.KV.Succeeded {
		ops = req.GetFailure()
	}
	out := &pb.KVTxnResponse{Succeeded: res.KV.Succeeded, Revision: res.Revision, Responses: make([]*pb.KVResponseOp, len(ops))}
	for i, op := range ops {
		r := res.KV.Ops[i]
		switch op.GetOp().(type) {
		case *pb.KVRequestOp_Put:
			out.Responses[i] = &pb.KVResponseOp{Op: &pb.KVResponseOp_Put{Put: &pb.KVPutResponse{Revision: res.Revision}}}
		case *pb.KVRequestOp_Delete:
			out.Responses[i] = &pb.KVResponseOp{Op: &pb.KVResponseOp_Delete{Delete: &pb.KVDeleteResponse{Deleted: r.Deleted, Revision: res.Revision}}}
		case *pb.KVRequestOp_Range:
			rr := &pb.KVRangeResponse{More: r.More, Revision: res.Revision, Kvs: make([]*pb.KVKeyValue, len(r.Range))}
			for j := range r.Range {
				rr.Kvs[j] = kvToProto(&r.Range[j])
			}
			out.Responses[i] = &pb.KVResponseOp{Op: &pb.KVResponseOp_Range{Range: rr}}
		}
	}
	return out, nil
}
