package etcdapi

import (
	"context"
	"errors"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/server"
)

// kvServer is etcd's KV service.
type kvServer struct {
	pb.UnimplementedKVServer
	s *Server
}

// checkKey applies the checks every key of a request gets: etcd's (not
// empty), then Tenure's (--max-key-len). A key is any bytes, as in etcd
// (fsm.ShowKey: how Tenure's own API shows one that is not UTF-8).
func (s *Server) checkKey(key []byte) error {
	switch {
	case len(key) == 0:
		return rpctypes.ErrGRPCEmptyKey
	case len(key) > s.limits.MaxKeyLen:
		return status.Errorf(codes.InvalidArgument, "etcdserver: key is %d bytes, the limit is %d (--max-key-len)", len(key), s.limits.MaxKeyLen)
	}
	return nil
}

// checkRangeEnd bounds a range end (a prefix's end is no longer than the
// prefix).
func (s *Server) checkRangeEnd(end []byte) error {
	if len(end) > s.limits.MaxKeyLen {
		return status.Errorf(codes.InvalidArgument, "etcdserver: range end is %d bytes, the limit is %d (--max-key-len)", len(end), s.limits.MaxKeyLen)
	}
	return nil
}

func (s *Server) checkRange(r *pb.RangeRequest) error {
	if err := s.checkKey(r.Key); err != nil {
		return err
	}
	if _, ok := pb.RangeRequest_SortOrder_name[int32(r.SortOrder)]; !ok {
		return rpctypes.ErrGRPCInvalidSortOption
	}
	if _, ok := pb.RangeRequest_SortTarget_name[int32(r.SortTarget)]; !ok {
		return rpctypes.ErrGRPCInvalidSortOption
	}
	return s.checkRangeEnd(r.RangeEnd)
}

func (s *Server) checkPut(r *pb.PutRequest) error {
	if err := s.checkKey(r.Key); err != nil {
		return err
	}
	switch {
	case r.IgnoreValue && len(r.Value) != 0:
		return rpctypes.ErrGRPCValueProvided
	case r.IgnoreLease && r.Lease != 0:
		return rpctypes.ErrGRPCLeaseProvided
	case len(r.Value) > s.limits.MaxValueLen:
		return status.Errorf(codes.InvalidArgument, "etcdserver: request is too large: the value is %d bytes, the limit is %d (--max-value-len)", len(r.Value), s.limits.MaxValueLen)
	case r.Lease < 0:
		return rpctypes.ErrGRPCLeaseNotFound
	}
	return nil
}

func (s *Server) checkDelete(r *pb.DeleteRangeRequest) error {
	if err := s.checkKey(r.Key); err != nil {
		return err
	}
	return s.checkRangeEnd(r.RangeEnd)
}

// rangeQuery is the state machine's form of a range request. Negative
// numbers, which etcd accepts, mean what etcd makes of them: a negative
// limit or minimum filter removes nothing; a negative maximum filter
// removes every key (empty reports that; the count stays).
func rangeQuery(r *pb.RangeRequest) (q fsm.RangeQuery, empty bool) {
	unsigned := func(v int64) uint64 { return uint64(max(v, 0)) }
	q = fsm.RangeQuery{
		Key: string(r.Key), End: r.RangeEnd, Limit: max(r.Limit, 0),
		SortOrder: uint32(r.SortOrder), SortTarget: uint32(r.SortTarget),
		KeysOnly: r.KeysOnly, CountOnly: r.CountOnly, Count: true,
		MinModRevision: unsigned(r.MinModRevision), MaxModRevision: unsigned(r.MaxModRevision),
		MinCreateRevision: unsigned(r.MinCreateRevision), MaxCreateRevision: unsigned(r.MaxCreateRevision),
		Revision: unsigned(r.Revision),
	}
	return q, r.MaxModRevision < 0 || r.MaxCreateRevision < 0
}

func keyValue(kv *fsm.KV) *mvccpb.KeyValue {
	return &mvccpb.KeyValue{Key: []byte(kv.Key), CreateRevision: int64(kv.CreateRevision), ModRevision: int64(kv.ModRevision), Version: int64(kv.Version), Value: kv.Value, Lease: int64(kv.Session)}
}

func keyValues(kvs []fsm.KV) []*mvccpb.KeyValue {
	if len(kvs) == 0 {
		return nil
	}
	out := make([]*mvccpb.KeyValue, len(kvs))
	for i := range kvs {
		out[i] = keyValue(&kvs[i])
	}
	return out
}

func rangeResponse(a fsm.RangeAnswer, empty bool, rev uint64) *pb.RangeResponse {
	out := &pb.RangeResponse{Header: &pb.ResponseHeader{Revision: int64(rev)}, Count: a.Count}
	if !empty {
		out.Kvs, out.More = keyValues(a.KVs), a.More
	}
	return out
}

// Range implements etcd's KV.Range. A serializable read is served by this
// node; a linearizable one by the leader. A read at a past revision
// answers the keys as they were then, from the state machine's history
// window (fsm/kvhistory.go); one before the window's start is answered
// "compacted". Below cluster version 3, which keeps no history, a past
// revision is served only when no key changed since (the watch history
// tells).
func (k *kvServer) Range(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error) {
	s := k.s
	if err := s.checkRange(r); err != nil {
		return nil, err
	}
	if err := s.authorize(ctx, "KV/Range", spanRight(r.Key, r.RangeEnd, fsm.AccessRead)); err != nil {
		return nil, err
	}
	if !r.Serializable {
		if fw, err := s.forward(ctx); err != nil || fw != nil {
			if err != nil {
				return nil, err
			}
			resp, err := pb.NewKVClient(fw.conn).Range(fw.ctx, r)
			return relay(s, resp, err)
		}
		if err := s.linearizable(ctx); err != nil {
			return nil, toGRPC(err)
		}
	}
	q, empty := rangeQuery(r)
	var a fsm.RangeAnswer
	var rev uint64
	var costErr, revErr error
	legacy := false // below cluster version 3: the current keys, if none changed since
	s.front.Read(func(st *fsm.State) {
		rev = st.Revision()
		if revErr = st.CheckKVRevision(q.Revision); revErr != nil {
			if legacy = errors.Is(revErr, fsm.ErrCompactedRevision) && !st.KVHistoryKept(); !legacy {
				return
			}
			q.Revision = 0
		}
		var cost answerCost
		cost.rangeCost(st, r)
		if costErr = s.checkCost(cost); costErr == nil {
			a = st.Range(q)
		}
	})
	switch {
	case revErr != nil && !legacy:
		return nil, toGRPC(revErr)
	case costErr != nil:
		return nil, costErr
	case legacy && !s.srv.KVUnchangedSince(uint64(r.Revision), rev):
		return nil, rpctypes.ErrGRPCCompacted
	}
	resp := rangeResponse(a, empty, rev)
	resp.Header = s.header(rev)
	return resp, nil
}

// Put implements etcd's KV.Put.
func (k *kvServer) Put(ctx context.Context, r *pb.PutRequest) (*pb.PutResponse, error) {
	s := k.s
	if err := s.checkPut(r); err != nil {
		return nil, err
	}
	if err := s.authorize(ctx, "KV/Put", server.WriteRight(fsm.KindKV, string(r.Key))); err != nil {
		return nil, err
	}
	if fw, err := s.forward(ctx); err != nil || fw != nil {
		if err != nil {
			return nil, err
		}
		resp, err := pb.NewKVClient(fw.conn).Put(fw.ctx, r)
		return relay(s, resp, err)
	}
	res, err := s.propose(ctx, putOp(r))
	if err != nil {
		return nil, toGRPC(err)
	}
	out := &pb.PutResponse{Header: s.header(res.Revision)}
	if r.PrevKv && len(res.KV.Prev) > 0 {
		out.PrevKv = keyValue(&res.KV.Prev[0])
	}
	return out, nil
}

func putOp(r *pb.PutRequest) *fsmpb.KVPut {
	return &fsmpb.KVPut{Key: string(r.Key), Value: r.Value, Lease: uint64(r.Lease), IgnoreValue: r.IgnoreValue, IgnoreLease: r.IgnoreLease}
}

// DeleteRange implements etcd's KV.DeleteRange.
func (k *kvServer) DeleteRange(ctx context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	s := k.s
	if err := s.checkDelete(r); err != nil {
		return nil, err
	}
	if err := s.authorize(ctx, "KV/DeleteRange", spanRight(r.Key, r.RangeEnd, fsm.AccessWrite)); err != nil {
		return nil, err
	}
	if fw, err := s.forward(ctx); err != nil || fw != nil {
		if err != nil {
			return nil, err
		}
		resp, err := pb.NewKVClient(fw.conn).DeleteRange(fw.ctx, r)
		return relay(s, resp, err)
	}
	if r.PrevKv {
		var costErr error
		s.front.Read(func(st *fsm.State) {
			var cost answerCost
			cost.deleteCost(st, r)
			costErr = s.checkCost(cost)
		})
		if costErr != nil {
			return nil, costErr
		}
	}
	res, err := s.propose(ctx, &fsmpb.KVDelete{Key: string(r.Key), RangeEnd: r.RangeEnd})
	if err != nil {
		return nil, toGRPC(err)
	}
	out := &pb.DeleteRangeResponse{Header: s.header(res.Revision), Deleted: res.KV.Deleted}
	if r.PrevKv {
		out.PrevKvs = keyValues(res.KV.Prev)
	}
	return out, nil
}

// RangeStream implements etcd's KV.RangeStream: not supported.
func (k *kvServer) RangeStream(*pb.RangeRequest, pb.KV_RangeStreamServer) error {
	return errUnsupported("RangeStream")
}
