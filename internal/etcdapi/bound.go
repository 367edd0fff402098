package etcdapi

// Answer bounds. etcd's API has no pages: a Range answers every key of
// its span, a Txn every key of each of its ranges, a DeleteRange with
// prev_kv every key it deleted. So that no single request can make a node
// build (and marshal) more than a bounded answer, the answer's size is
// measured on the state before anything is built (fsm.RangeCost), for
// every range of a request together, and a request whose answer would
// pass Config.MaxResponseBytes is refused with RESOURCE_EXHAUSTED naming
// the limit; the keys its ranges gather before their sorts and filters
// are bounded too (maxCollectedKeys).

import (
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenure-io/tenure/internal/fsm"
)

// kvWireOverhead is at most what a key-value pair adds to an answer
// besides its key and value: its revisions, version, lease and framing.
const kvWireOverhead = 48

// maxCollectedKeys bounds the keys the ranges of one request gather
// together before their sorts, filters and limits (a sort reads its whole
// span): about 100 MiB of the state's entries at most.
const maxCollectedKeys = 1 << 20

// answerCost is what the ranges of one request take together.
type answerCost struct{ keys, bytes, collected int64 }

func (a *answerCost) add(c fsm.RangeCost) {
	a.keys += c.Keys
	a.bytes += c.Bytes
	a.collected += c.Collected
}

// rangeCost adds what answering r takes.
func (a *answerCost) rangeCost(st *fsm.State, r *pb.RangeRequest) {
	q, _ := rangeQuery(r)
	a.add(st.RangeCost(q))
}

// deleteCost adds what the previous values of d take (nothing without
// prev_kv).
func (a *answerCost) deleteCost(st *fsm.State, d *pb.DeleteRangeRequest) {
	if d.PrevKv {
		a.add(st.RangeCost(fsm.RangeQuery{Key: string(d.Key), End: d.RangeEnd}))
	}
}

// txnCost adds what the ranges and deletes of both branches of r, and of
// its nested transactions, take (which branch runs is not known before
// the compares).
func (a *answerCost) txnCost(st *fsm.State, r *pb.TxnRequest) {
	for _, branch := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range branch {
			switch o := op.Request.(type) {
			case *pb.RequestOp_RequestRange:
				a.rangeCost(st, o.RequestRange)
			case *pb.RequestOp_RequestDeleteRange:
				a.deleteCost(st, o.RequestDeleteRange)
			case *pb.RequestOp_RequestTxn:
				a.txnCost(st, o.RequestTxn)
			}
		}
	}
}

// check refuses an answer past the limits.
func (s *Server) checkCost(a answerCost) error {
	if total := a.bytes + a.keys*kvWireOverhead; total > int64(s.cfg.MaxResponseBytes) {
		return status.Errorf(codes.ResourceExhausted, "etcdserver: the answer would hold %d keys in about %d bytes, the limit is %d (--max-response-bytes): read fewer keys at a time (a limit and the next key, a narrower range, keys only or count only)", a.keys, total, s.cfg.MaxResponseBytes)
	}
	if a.collected > maxCollectedKeys {
		return status.Errorf(codes.ResourceExhausted, "etcdserver: the request's ranges would read %d keys together, the limit is %d: read fewer keys at a time (a narrower range, or no sort)", a.collected, maxCollectedKeys)
	}
	return nil
}
