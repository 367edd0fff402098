package fsm

// Nested transactions (KVOp.txn), as etcd 3.3+ runs them: every compare
// of a transaction, its nested transactions' included, is evaluated on
// the state before the transaction, which decides the branch of each
// (txnPlan); the branches' checks (a put's lease, ignore_value's key, a
// range's revision) are made on that state too; then the ops run in
// order, a nested transaction's where it stands in its branch, all the
// writes at one revision. Gated at cluster version 3 (Gates).

import (
	"fmt"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// MaxTxnDepth bounds how deeply transactions nest (etcd's own bound is
// its ops limit, spent one level at a time: 128 by default).
const MaxTxnDepth = 128

// nestedTxnVersion is the cluster version that runs nested transactions.
const nestedTxnVersion = 3

// txnPlan is the branch a transaction takes and, for each op of it that
// is a nested transaction, that transaction's plan.
type txnPlan struct {
	ok  bool
	ops []*fsmpb.KVOp
	sub []*txnPlan // by op index; nil for an op that is not a transaction
}

// planTxn evaluates t's compares, and those of the nested transactions of
// the branches they choose, on the state as it is.
func (s *State) planTxn(t *fsmpb.KVTxn) *txnPlan {
	p := &txnPlan{ok: true}
	for _, c := range t.GetCompares() {
		if !s.kvCompare(c) {
			p.ok = false
			break
		}
	}
	p.ops = t.GetSuccess()
	if !p.ok {
		p.ops = t.GetFailure()
	}
	for i, op := range p.ops {
		if nt := op.GetTxn(); nt != nil {
			if p.sub == nil {
				p.sub = make([]*txnPlan, len(p.ops))
			}
			p.sub[i] = s.planTxn(nt)
		}
	}
	return p
}

// flat is the plan's puts, deletes and ranges in the order they run, the
// nested transactions' in their place.
func (p *txnPlan) flat() []*fsmpb.KVOp {
	if p.sub == nil {
		return p.ops
	}
	var out []*fsmpb.KVOp
	for i, op := range p.ops {
		if p.sub[i] != nil {
			out = append(out, p.sub[i].flat()...)
		} else {
			out = append(out, op)
		}
	}
	return out
}

// nested reports whether a branch of t holds a transaction.
func nested(t *fsmpb.KVTxn) bool {
	for _, branch := range [][]*fsmpb.KVOp{t.GetSuccess(), t.GetFailure()} {
		for _, op := range branch {
			if op.GetTxn() != nil {
				return true
			}
		}
	}
	return false
}

// checkNestedVersion refuses a nested transaction while the cluster
// version is below nestedTxnVersion, changing nothing (a member of an
// older release does not know the op, and refuses it as empty).
func (s *State) checkNestedVersion(t *fsmpb.KVTxn) error {
	if !s.at(nestedTxnVersion) && nested(t) {
		return &VersionError{What: "a nested transaction (tenure.fsm.v1.KVOp.txn)", Need: nestedTxnVersion, Cluster: s.ClusterVersion()}
	}
	return nil
}

// validateNestedTxn checks a nested transaction at depth (1: inside the
// outermost).
func validateNestedTxn(t *fsmpb.KVTxn, depth int) error {
	if depth > MaxTxnDepth {
		return fmt.Errorf("%w: transactions nested more than %d deep", ErrInvalid, MaxTxnDepth)
	}
	return validateKVTxnAt(t, depth)
}

// runPlan runs the ops of plan p in order, each nested transaction's
// where it stands, its writes at rev, and returns their results.
func (s *State) runPlan(p *txnPlan, paged bool, rev *revisionOnce, emit EventSink) *KVResult {
	out := &KVResult{Succeeded: p.ok, Ops: make([]KVOpResult, len(p.ops))}
	for i, op := range p.ops {
		switch o := op.GetOp().(type) {
		case *fsmpb.KVOp_Put:
			out.Ops[i].Prev = s.kvPut(o.Put, rev.get(), emit)
		case *fsmpb.KVOp_Delete:
			victims := s.kvDelete(rangeOf(o.Delete.GetKey(), o.Delete.GetPrefix(), o.Delete.GetRangeEnd()), rev, emit)
			out.Ops[i].Deleted, out.Ops[i].Prev = int64(len(victims)), victims
		case *fsmpb.KVOp_Range:
			a := s.rangeIn(rangeOp(o.Range, paged))
			out.Ops[i].Range, out.Ops[i].More, out.Ops[i].Count = a.KVs, a.More, a.Count
		case *fsmpb.KVOp_Txn:
			out.Ops[i].Txn = s.runPlan(p.sub[i], paged, rev, emit)
		}
	}
	return out
}
