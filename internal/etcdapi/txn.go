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
// branches), the keys, each op's own checks, a nested transaction's
// within what its parent left of the ops limit; then etcd's
// duplicate-key check of each branch, nested transactions' included
// (checkIntervals).
func (s *Server) checkTxn(r *pb.TxnRequest) error {
	if err := s.checkTxnOps(r, s.limits.MaxTxnOps, 0); err != nil {
		return err
	}
	for _, branch := range [][]*pb.RequestOp{r.Success, r.Failure} {
		if _, _, err := checkIntervals(branch); err != nil {
			return err
		}
	}
	return nil
}

// checkTxnOps is checkTxn's check of r's ops, nested depth deep, with
// maxOps ops allowed: etcd passes a nested transaction what is left of
// the limit after its parent's longest list.
func (s *Server) checkTxnOps(r *pb.TxnRequest, maxOps, depth int) error {
	n := max(len(r.Compare), len(r.Success), len(r.Failure))
	if n > maxOps {
		return rpctypes.ErrGRPCTooManyOps
	}
	if depth > fsm.MaxTxnDepth {
		return status.Errorf(codes.InvalidArgument, "etcdserver: transactions nested more than %d deep", fsm.MaxTxnDepth)
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
				err = s.checkTxnOps(o.RequestTxn, maxOps-n, depth+1)
			default:
				err = rpctypes.ErrGRPCKeyNotFound // an empty op, as etcd answers it
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// interval is a delete's span in checkIntervals: [begin, end), or the key
// begin alone when end is "".
type interval struct{ begin, end string }

// holds reports whether the put of k overlaps the delete. etcd compares
// them as byte strings, so a delete "from key on" (range end 0) overlaps
// no put; that is kept.
func (d interval) holds(k string) bool {
	if d.end == "" {
		return k == d.begin
	}
	return d.begin <= k && k < d.end
}

func overlaps(dels []interval, k string) bool {
	for _, d := range dels {
		if d.holds(k) {
			return true
		}
	}
	return false
}

// checkIntervals is etcd's duplicate-key check of one branch (its
// checkIntervals): no key may be put twice, nor put and deleted, in the
// branch and the nested transactions it holds. A nested transaction's
// puts are checked against the deletes of the branch and of the nested
// transactions before it, and against the puts of those; its two
// branches may put the same key (only one runs). The branch's own puts
// are checked against every delete below it. It returns the keys put and
// the spans deleted, for the level above.
func checkIntervals(ops []*pb.RequestOp) (map[string]bool, []interval, error) {
	var dels []interval
	for _, op := range ops {
		if d := op.GetRequestDeleteRange(); d != nil {
			dels = append(dels, interval{string(d.Key), string(d.RangeEnd)})
		}
	}
	puts := make(map[string]bool)
	for _, op := range ops {
		t := op.GetRequestTxn()
		if t == nil {
			continue
		}
		putsThen, delsThen, err := checkIntervals(t.Success)
		if err != nil {
			return nil, nil, err
		}
		putsElse, delsElse, err := checkIntervals(t.Failure)
		if err != nil {
			return nil, nil, err
		}
		for k := range putsThen {
			if puts[k] || overlaps(dels, k) {
				return nil, nil, rpctypes.ErrGRPCDuplicateKey
			}
			puts[k] = true
		}
		for k := range putsElse {
			if puts[k] && !putsThen[k] {
				return nil, nil, rpctypes.ErrGRPCDuplicateKey
			}
			if overlaps(dels, k) {
				return nil, nil, rpctypes.ErrGRPCDuplicateKey
			}
			puts[k] = true
		}
		dels = append(dels, delsThen...)
		dels = append(dels, delsElse...)
	}
	for _, op := range ops {
		p := op.GetRequestPut()
		if p == nil {
			continue
		}
		k := string(p.Key)
		if puts[k] || overlaps(dels, k) {
			return nil, nil, rpctypes.ErrGRPCDuplicateKey
		}
		puts[k] = true
	}
	return puts, dels, nil
}

// txnRights are the rights a transaction needs: read on each compare's
// span, read on each range's, write on each put's key and each delete's
// span, in both branches (whichever runs) and in every nested
// transaction's (etcd's checkTxnReqsPermission).
func txnRights(r *pb.TxnRequest) []server.Right {
	return appendTxnRights(nil, r)
}

func appendTxnRights(rights []server.Right, r *pb.TxnRequest) []server.Right {
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
			case *pb.RequestOp_RequestTxn:
				rights = appendTxnRights(rights, o.RequestTxn)
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

func txnOps(ops []*pb.RequestOp) ([]*fsmpb.KVOp, error) {
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
		case *pb.RequestOp_RequestTxn:
			t, err := txnCommand(o.RequestTxn)
			if err != nil {
				return nil, err
			}
			out[i] = &fsmpb.KVOp{Op: &fsmpb.KVOp_Txn{Txn: t}}
		}
	}
	return out, nil
}

func txnCommand(r *pb.TxnRequest) (*fsmpb.KVTxn, error) {
	success, err := txnOps(r.Success)
	if err != nil {
		return nil, err
	}
	failure, err := txnOps(r.Failure)
	if err != nil {
		return nil, err
	}
	t := &fsmpb.KVTxn{Success: success, Failure: failure}
	for _, c := range r.Compare {
		fc, err := compareOp(c)
		if err != nil {
			return nil, err
		}
		t.Compares = append(t.Compares, fc)
	}
	return t, nil
}

// readOnly: every op of both branches, and of every nested transaction's,
// is a range (etcd serves such a transaction as a read); serializable:
// and every range is serializable.
func readOnly(r *pb.TxnRequest) (reads, serializable bool) {
	reads, serializable = true, true
	for _, branch := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range branch {
			if t := op.GetRequestTxn(); t != nil {
				ro, ser := readOnly(t)
				if !ro {
					return false, false
				}
				serializable = serializable && ser
				continue
			}
			rr := op.GetRequestRange()
			if rr == nil {
				return false, false
			}
			serializable = serializable && rr.Serializable
		}
	}
	return reads, serializable
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
// this one) changed something, in the order the ops ran, nested
// transactions' included; a nested transaction's own header is empty.
func txnResponse(r *pb.TxnRequest, res fsm.Result, hdr *pb.ResponseHeader) *pb.TxnResponse {
	before := res.Revision
	if wroteIn(r, res.KV) {
		before--
	}
	changed := false
	out := txnAnswer(r, res.KV, before, &changed)
	out.Header = hdr
	return out
}

// wroteIn reports whether the branch kv took of r, or a nested
// transaction's, wrote (a put, or a delete that deleted).
func wroteIn(r *pb.TxnRequest, kv *fsm.KVResult) bool {
	ops := r.Success
	if !kv.Succeeded {
		ops = r.Failure
	}
	for i, op := range ops {
		switch {
		case op.GetRequestPut() != nil, op.GetRequestDeleteRange() != nil && kv.Ops[i].Deleted > 0:
			return true
		case op.GetRequestTxn() != nil && wroteIn(op.GetRequestTxn(), kv.Ops[i].Txn):
			return true
		}
	}
	return false
}

// txnAnswer is txnResponse's answer of the branch kv took of r, without
// its header; changed says whether an op before it changed something.
func txnAnswer(r *pb.TxnRequest, kv *fsm.KVResult, before uint64, changed *bool) *pb.TxnResponse {
	ops := r.Success
	if !kv.Succeeded {
		ops = r.Failure
	}
	out := &pb.TxnResponse{Header: &pb.ResponseHeader{}, Succeeded: kv.Succeeded, Responses: make([]*pb.ResponseOp, len(ops))}
	for i, op := range ops {
		or := kv.Ops[i]
		switch o := op.Request.(type) {
		case *pb.RequestOp_RequestRange:
			rev := before
			if *changed {
				rev++
			}
			_, empty := rangeQuery(o.RequestRange)
			rr := rangeResponse(fsm.RangeAnswer{KVs: or.Range, More: or.More, Count: or.Count}, empty, rev)
			out.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseRange{ResponseRange: rr}}
		case *pb.RequestOp_RequestPut:
			*changed = true
			pr := &pb.PutResponse{Header: &pb.ResponseHeader{Revision: int64(before + 1)}}
			if o.RequestPut.PrevKv && len(or.Prev) > 0 {
				pr.PrevKv = keyValue(&or.Prev[0])
			}
			out.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponsePut{ResponsePut: pr}}
		case *pb.RequestOp_RequestDeleteRange:
			*changed = *changed || or.Deleted > 0
			rev := before
			if *changed {
				rev++
			}
			dr := &pb.DeleteRangeResponse{Header: &pb.ResponseHeader{Revision: int64(rev)}, Deleted: or.Deleted}
			if o.RequestDeleteRange.PrevKv {
				dr.PrevKvs = keyValues(or.Prev)
			}
			out.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseDeleteRange{ResponseDeleteRange: dr}}
		case *pb.RequestOp_RequestTxn:
			tr := txnAnswer(o.RequestTxn, or.Txn, before, changed)
			out.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseTxn{ResponseTxn: tr}}
		}
	}
	return out
}
