package etcdapi

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/server"
)

// checkTxn applies etcd's checks of a transaction (checkTxnRequest): the
// number of operations (the longest of the compares and the two
// branches), the keys, each op's own checks; then etcd's duplicate-key
// check of each branch. A nested transaction is not supported.
func (s *Server) checkTxn(r *pb.TxnRequest) error {
	if n := max(len(r.Compare), len(r.Success), len(r.Failure)); n > s.limits.MaxTxnOps {
		return rpctypes.ErrGRPCTooManyOps
	}
	for _, c := range r.Compare {
		if err := s.checkKey(c.Key); err != nil {
			return err
		}
		if err := s.checkRangeEnd(c.RangeEnd); err != nil {
			return err
		}
	}
	for _, branch := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range branch {
			var err error
			switch o := op.Request.(type) {
			case *pb.RequestOp_RequestRange:
				err = s.checkRange(o.RequestRange)
			case *pb.RequestOp_RequestPut:
				err = s.checkPut(o.RequestPut)
			case *pb.RequestOp_RequestDeleteRange:
				err = s.checkDelete(o.RequestDeleteRange)
			case *pb.RequestOp_RequestTxn:
				err = errUnsupported("a nested transaction")
			default:
				err = rpctypes.ErrGRPCKeyNotFound // an empty op, as etcd answers it
			}
			if err != nil {
				return err
			}
		}
	}
	for _, branch := range [][]*pb.RequestOp{r.Success, r.Failure} {
		if err := checkIntervals(branch); err != nil {
			return err
		}
	}
	return nil
}

// checkIntervals is etcd's duplicate-key check of one branch: no key may
// be put twice, nor put and deleted. etcd compares a put with a delete's
// interval [key, range_end) as byte strings, so a delete "from key on"
// (range end 0) overlaps no put; that is kept.
func checkIntervals(ops []*pb.RequestOp) error {
	type interval struct{ begin, end string } // end "": the key alone
	var dels []interval
	for _, op := range ops {
		if d := op.GetRequestDeleteRange(); d != nil {
			dels = append(dels, interval{string(d.Key), string(d.RangeEnd)})
		}
	}
	puts := make(map[string]bool)
	for _, op := range ops {
		p := op.GetRequestPut()
		if p == nil {
			continue
		}
		k := string(p.Key)
		if puts[k] {
			return rpctypes.ErrGRPCDuplicateKey
		}
		for _, d := range dels {
			if (d.end == "" && k == d.begin) || (d.end != "" && d.begin <= k && k < d.end) {
				return rpctypes.ErrGRPCDuplicateKey
			}
		}
		puts[k] = true
	}
	return nil
}

// txnRights are the rights a transaction needs: read on each compare's
// span, read on each range's, write on each put's key and each delete's
// span, in both branches (whichever runs).
func txnRights(r *pb.TxnRequest) []server.Right {
	var rights []server.Right
	for _, c := range r.Compare {
		rights = append(rights, spanRight(c.Key, c.RangeEnd, fsm.AccessRead))
	}
	for _, branch := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range branch {
			switch o := op.Request.(type) {
			case *pb.RequestOp_RequestRange:
				rights = append(rights, spanRight(o.RequestRange.Key, o.RequestRange.RangeEnd, fsm.AccessRead))
			case *pb.RequestOp_RequestPut:
				rights = append(rights, server.WriteRight(fsm.KindKV, string(o.RequestPut.Key)))
			case *pb.RequestOp_RequestDeleteRange:
				rights = append(rights, spanRight(o.RequestDeleteRange.Key, o.RequestDeleteRange.RangeEnd, fsm.AccessWrite))
			}
		}
	}
	return rights
}

// compareTargets and compareResults map etcd's enums to the state
// machine's numbers.
var (
	compareTargets = map[pb.Compare_CompareTarget]uint32{
		pb.Compare_VERSION: fsm.CompareVersion, pb.Compare_CREATE: fsm.CompareCreateRevision,
		pb.Compare_MOD: fsm.CompareModRevision, pb.Compare_VALUE: fsm.CompareValue, pb.Compare_LEASE: fsm.CompareLease,
	}
	compareResults = map[pb.Compare_CompareResult]uint32{
		pb.Compare_EQUAL: fsm.CompareEqual, pb.Compare_NOT_EQUAL: fsm.CompareNotEqual,
		pb.Compare_GREATER: fsm.CompareGreater, pb.Compare_LESS: fsm.CompareLess,
	}
)

// compareOp is the state machine's form of a compare. Like etcd it reads
// the number or value of the compare's target only (a compare of the
// create revision that carries a version compares with 0).
func compareOp(c *pb.Compare) (*fsmpb.KVCompare, error) {
	target, ok := compareTargets[c.Target]
	result, ok2 := compareResults[c.Result]
	if !ok || !ok2 {
		return nil, status.Errorf(codes.InvalidArgument, "etcdserver: unknown compare target %d or result %d", c.Target, c.Result)
	}
	out := &fsmpb.KVCompare{Key: string(c.Key), RangeEnd: c.RangeEnd, Target: target, Result: result, Signed: true}
	var n int64
	switch u := c.TargetUnion.(type) {
	case *pb.Compare_Version:
		if c.Target == pb.Compare_VERSION {
			n = u.Version
		}
	case *pb.Compare_CreateRevision:
		if c.Target == pb.Compare_CREATE {
			n = u.CreateRevision
		}
	case *pb.Compare_ModRevision:
		if c.Target == pb.Compare_MOD {
			n = u.ModRevision
		}
	case *pb.Compare_Lease:
		if c.Target == pb.Compare_LEASE {
			n = u.Lease
		}
	case *pb.Compare_Value:
		if c.Target == pb.Compare_VALUE {
			out.Value = u.Value
		}
	}
	out.Number = uint64(n)
	return out, nil
}

func rangeOp(r *pb.RangeRequest) *fsmpb.KVRange {
	q, _ := rangeQuery(r)
	return &fsmpb.KVRange{
		Key: q.Key, RangeEnd: q.End, Limit: q.Limit, SortOrder: q.SortOrder, SortTarget: q.SortTarget,
		KeysOnly: q.KeysOnly, CountOnly: q.CountOnly, Count: true,
		MinModRevision: q.MinModRevision, MaxModRevision: q.MaxModRevision,
		MinCreateRevision: q.MinCreateRevision, MaxCreateRevision: q.MaxCreateRevision,
		Revision: uint64(max(r.Revision, 0)),
	}
}

func txnOps(ops []*pb.RequestOp) []*fsmpb.KVOp {
	out := make([]*fsmpb.KVOp, len(ops))
	for i, op := range ops {
		switch o := op.Request.(type) {
		case *pb.RequestOp_RequestRange:
			out[i] = &fsmpb.KVOp{Op: &fsmpb.KVOp_Range{Range: rangeOp(o.RequestRange)}}
		case *pb.RequestOp_RequestPut:
			out[i] = &fsmpb.KVOp{Op: &fsmpb.KVOp_Put{Put: putOp(o.RequestPut)}}
		case *pb.RequestOp_RequestDeleteRange:
			d := o.RequestDeleteRange
			out[i] = &fsmpb.KVOp{Op: &fsmpb.KVOp_Delete{Delete: &fsmpb.KVDelete{Key: string(d.Key), RangeEnd: d.RangeEnd}}}
		}
	}
	return out
}

func txnCommand(r *pb.TxnRequest) (*fsmpb.KVTxn, error) {
	t := &fsmpb.KVTxn{Success: txnOps(r.Success), Failure: txnOps(r.Failure)}
	for _, c := range r.Compare {
		fc, err := compareOp(c)
		if err != nil {
			return nil, err
		}
		t.Compares = append(t.Compares, fc)
	}
	return t, nil
}

// readOnly: every op of both branches is a range (etcd serves such a
// transaction as a read); serializable: and every range is serializable.
func readOnly(r *pb.TxnRequest) (readOnly, serializable bool) {
	readOnly, serializable = true, true
	for _, branch := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range branch {
			rr := op.GetRequestRange()
			if rr == nil {
				return false, false
			}
			serializable = serializable && rr.Serializable
		}
	}
	return readOnly, serializable
}

// Txn implements etcd's KV.Txn. A transaction of ranges only is a read (a
// serializable one served by this node); any other is committed, at one
// revision, which is the header's.
func (k *kvServer) Txn(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error) {
	s := k.s
	if err := s.checkTxn(r); err != nil {
		return nil, err
	}
	t, err := txnCommand(r)
	if err != nil {
		return nil, err
	}
	// The state machine checks the bound again where the answer is built:
	// keys written between the measure and the apply cannot pass it.
	t.MaxAnswerBytes = uint64(s.cfg.MaxResponseBytes)
	if err := s.authorize(ctx, "KV/Txn", txnRights(r)...); err != nil {
		return nil, err
	}
	reads, serializable := readOnly(r)
	if !serializable {
		if fw, err := s.forward(ctx); err != nil || fw != nil {
			if err != nil {
				return nil, err
			}
			resp, err := pb.NewKVClient(fw.conn).Txn(fw.ctx, r)
			return relay(s, resp, err)
		}
	}
	var res fsm.Result
	if reads {
		if !serializable {
			if err := s.linearizable(ctx); err != nil {
				return nil, toGRPC(err)
			}
		}
		s.front.Read(func(st *fsm.State) {
			var cost answerCost
			cost.txnCost(st, r)
			if res.Err = s.checkCost(cost); res.Err != nil {
				return
			}
			var kv fsm.KVResult
			kv, res.Err = st.ReadTxn(t)
			res.KV, res.Revision = &kv, st.Revision()
		})
		err = res.Err
	} else {
		// The answer is measured on the leader's state before the
		// transaction is proposed: what commits before it applies can
		// change the figure by the few commands in flight only.
		s.front.Read(func(st *fsm.State) {
			var cost answerCost
			cost.txnCost(st, r)
			err = s.checkCost(cost)
		})
		if err != nil {
			return nil, err
		}
		res, err = s.propose(ctx, t)
	}
	if err != nil {
		return nil, toGRPC(err)
	}
	return txnResponse(r, res, s.header(res.Revision)), nil
}

// txnResponse builds the answer of a transaction from the state machine's
// result. Like etcd, an op's own header carries only a revision: the
// transaction's revision before it, or after it once an earlier op (or
// this one) changed something.
func txnResponse(r *pb.TxnRequest, res fsm.Result, hdr *pb.ResponseHeader) *pb.TxnResponse {
	ops := r.Success
	if !res.KV.Succeeded {
		ops = r.Failure
	}
	wrote := false
	for i, op := range ops {
		if op.GetRequestPut() != nil || (op.GetRequestDeleteRange() != nil && res.KV.Ops[i].Deleted > 0) {
			wrote = true
		}
	}
	before := res.Revision
	if wrote {
		before--
	}
	out := &pb.TxnResponse{Header: hdr, Succeeded: res.KV.Succeeded, Responses: make([]*pb.ResponseOp, len(ops))}
	changed := false
	for i, op := range ops {
		or := res.KV.Ops[i]
		switch o := op.Request.(type) {
		case *pb.RequestOp_RequestRange:
			rev := before
			if changed {
				rev++
			}
			_, empty := rangeQuery(o.RequestRange)
			rr := rangeResponse(fsm.RangeAnswer{KVs: or.Range, More: or.More, Count: or.Count}, empty, rev)
			out.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseRange{ResponseRange: rr}}
		case *pb.RequestOp_RequestPut:
			changed = true
			pr := &pb.PutResponse{Header: &pb.ResponseHeader{Revision: int64(before + 1)}}
			if o.RequestPut.PrevKv && len(or.Prev) > 0 {
				pr.PrevKv = keyValue(&or.Prev[0])
			}
			out.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponsePut{ResponsePut: pr}}
		case *pb.RequestOp_RequestDeleteRange:
			changed = changed || or.Deleted > 0
			rev := before
			if changed {
				rev++
			}
			dr := &pb.DeleteRangeResponse{Header: &pb.ResponseHeader{Revision: int64(rev)}, Deleted: or.Deleted}
			if o.RequestDeleteRange.PrevKv {
				dr.PrevKvs = keyValues(or.Prev)
			}
			out.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseDeleteRange{ResponseDeleteRange: dr}}
		}
	}
	return out
}
