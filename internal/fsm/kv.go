package fsm

// The key-value store: keys in a B-tree ordered by key, each with its
// create revision, mod revision and version, optionally bound to a
// session (ephemeral). Every change carries the global revision; a
// transaction is one revision, shared by all its writes. A delete of
// nothing changes nothing and takes no revision (as etcd).

import (
	"bytes"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/google/btree"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// Hard limits of the key-value store. Like the other limits they are part
// of the replicated contract; the server's admission limits (configurable,
// lower by default) are checked before a command is proposed.
const (
	// MaxKVValueLen is the largest value a key may hold, bytes: etcd's
	// request limit (--max-request-bytes, 1.5 MiB), from cluster version 3
	// (1 MiB before it, kvvalue.go). Keys are bounded by MaxNameLen.
	MaxKVValueLen = 3 << 19
	// MaxTxnOps bounds the compares and the ops of each branch of a
	// transaction.
	MaxTxnOps = 10_000
)

// Event kinds of the key-value store. Numbered apart from the lock events
// so that other features can extend the list without renumbering.
const (
	// EventKVPut: KV was written at Revision (KV.ModRevision).
	EventKVPut EventKind = 40
	// EventKVDelete: KV.Key was deleted at Revision.
	EventKVDelete EventKind = 41
	// EventApplied ends the events of one applied batch: the state is at
	// Revision and every event up to it has been emitted.
	EventApplied EventKind = 42
	// EventRestored: the state was replaced by a snapshot at Revision;
	// events before it are not replayed.
	EventRestored EventKind = 43
)

// Compare targets and results; the numbers match the API's enums.
const (
	CompareValue          = 1
	CompareVersion        = 2
	CompareCreateRevision = 3
	CompareModRevision    = 4

	CompareEqual    = 1
	CompareNotEqual = 2
	CompareGreater  = 3
	CompareLess     = 4
)

// KV is one key with its metadata. Value is never modified in place once
// stored, so a KV may be shared by readers.
type KV struct {
	Key   string
	Value []byte
	// CreateRevision is the revision of the put that created the key.
	CreateRevision uint64
	// ModRevision is the revision of the key's last change.
	ModRevision uint64
	// Version counts puts since creation (1 for a new key).
	Version uint64
	// Session binds an ephemeral key to a session (0: none).
	Session uint64
}

// KVResult is the key-value part of a Result.
type KVResult struct {
	// Deleted counts the keys a KVDelete removed.
	Deleted int64
	// Prev: of a KVPut the key before it (if it existed), of a KVDelete
	// the keys it removed, in key order. They share their values with
	// the state: read only.
	Prev []KV
	// Succeeded: the transaction's compares all held.
	Succeeded bool
	// Ops has one entry per op of the transaction's branch taken.
	Ops []KVOpResult
}

// KVOpResult is the result of one op inside a transaction.
type KVOpResult struct {
	Range   []KV  // a range op: its keys (see RangeQuery)
	More    bool  // a range op: cut short by its limit
	Count   int64 // a range op with count or count_only
	Deleted int64
	Prev    []KV      // a put or a delete: as KVResult.Prev
	Txn     *KVResult // a nested transaction: its result
}

// Errors of the key-value store's etcd options. Both are ErrInvalid too.
var (
	// ErrKeyNotFound: a put that keeps the key's value or lease found no
	// key.
	ErrKeyNotFound = fmt.Errorf("%w: key not found", ErrInvalid)
	// ErrFutureRevision: a read at a revision the state has not reached.
	ErrFutureRevision = fmt.Errorf("%w: required revision is a future revision", ErrInvalid)
	// ErrCompactedRevision: a read at a revision older than the state.
	ErrCompactedRevision = fmt.Errorf("%w: required revision has been compacted", ErrInvalid)
)

func kvLess(a, b KV) bool { return a.Key < b.Key }

// kvStore holds the keys and, per session, its ephemeral keys.
type kvStore struct {
	tree      *btree.BTreeG[KV]
	ephemeral map[uint64]map[string]struct{}
	bytes     uint64    // of every key and value (max-kv-bytes)
	hist      kvHistory // past versions, from cluster version 3 (kvhistory.go)
}

func newKVStore() kvStore {
	return kvStore{tree: btree.NewG(32, kvLess), ephemeral: make(map[uint64]map[string]struct{}), hist: newKVHistory()}
}

func (k *kvStore) bind(session uint64, key string) {
	m := k.ephemeral[session]
	if m == nil {
		m = make(map[string]struct{})
		k.ephemeral[session] = m
	}
	m[key] = struct{}{}
}

func (k *kvStore) unbind(session uint64, key string) {
	if session == 0 {
		return
	}
	delete(k.ephemeral[session], key)
	if len(k.ephemeral[session]) == 0 {
		delete(k.ephemeral, session)
	}
}

// ValidateKVKey checks a key, or with prefix a key prefix ("" allowed),
// as Tenure's own API takes them: UTF-8 text. The state machine takes any
// bytes (validateKVBytes): the etcd API's keys are bytes.
func ValidateKVKey(key string, prefix bool) error {
	if !utf8.ValidString(key) {
		return fmt.Errorf("%w: key is not valid UTF-8", ErrInvalid)
	}
	return validateKVBytes(key, prefix)
}

// validateKVBytes checks a key, or with prefix a key prefix ("" allowed), of
// any bytes (keysbin.go).
func validateKVBytes(key string, prefix bool) error {
	if !prefix {
		switch {
		case key == "":
			return fmt.Errorf("%w: key must not be empty", ErrInvalid)
		case len(key) > MaxNameLen:
			return fmt.Errorf("%w: key is %d bytes, the limit is %d", ErrInvalid, len(key), MaxNameLen)
		}
		return nil
	}
	if len(key) > MaxNameLen {
		return fmt.Errorf("%w: key prefix is %d bytes, the limit is %d", ErrInvalid, len(key), MaxNameLen)
	}
	return nil
}

func validateKVPut(p *fsmpb.KVPut) error {
	if err := validateKVBytes(p.GetKey(), false); err != nil {
		return err
	}
	switch {
	case len(p.GetValue()) > MaxKVValueLen:
		return fmt.Errorf("%w: value is %d bytes, the limit is %d", ErrInvalid, len(p.GetValue()), MaxKVValueLen)
	case p.GetSession() != 0 && p.GetLease() != 0:
		return fmt.Errorf("%w: a put binds a key to a session or to a lease, not both", ErrInvalid)
	case p.GetIgnoreValue() && len(p.GetValue()) != 0:
		return fmt.Errorf("%w: a value is given with ignore_value", ErrInvalid)
	case p.GetIgnoreLease() && (p.GetSession() != 0 || p.GetLease() != 0):
		return fmt.Errorf("%w: a lease is given with ignore_lease", ErrInvalid)
	}
	return nil
}

// checkPut refuses a put whose lease is not a live etcd lease, whose
// session is not live, or that keeps the value or lease of a key that
// does not exist; it changes nothing.
func (s *State) checkPut(p *fsmpb.KVPut) error {
	if p.GetSession() != 0 {
		if _, ok := s.sessions[p.GetSession()]; !ok {
			return ErrSessionNotFound
		}
	}
	if p.GetLease() != 0 {
		if err := s.CheckEtcdLease(p.GetLease()); err != nil {
			return err
		}
	}
	if p.GetIgnoreValue() || p.GetIgnoreLease() {
		if _, ok := s.kv.tree.Get(KV{Key: p.GetKey()}); !ok {
			return fmt.Errorf("%w: %q", ErrKeyNotFound, p.GetKey())
		}
	}
	return nil
}

func validateKVOps(ops []*fsmpb.KVOp, depth int) error {
	if len(ops) > MaxTxnOps {
		return fmt.Errorf("%w: %d ops in a transaction branch, the limit is %d", ErrInvalid, len(ops), MaxTxnOps)
	}
	for _, op := range ops {
		var err error
		switch o := op.GetOp().(type) {
		case *fsmpb.KVOp_Put:
			err = validateKVPut(o.Put)
		case *fsmpb.KVOp_Delete:
			err = validateKVDelete(o.Delete)
		case *fsmpb.KVOp_Range:
			err = validateRangeOp(o.Range)
		case *fsmpb.KVOp_Txn:
			err = validateNestedTxn(o.Txn, depth+1)
		default:
			err = fmt.Errorf("%w: empty transaction op", ErrInvalid)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func validateKVDelete(d *fsmpb.KVDelete) error {
	if err := validateKVBytes(d.GetKey(), d.GetPrefix() || len(d.GetRangeEnd()) > 0); err != nil {
		return err
	}
	if len(d.GetRangeEnd()) > MaxNameLen {
		return fmt.Errorf("%w: range end is %d bytes, the limit is %d", ErrInvalid, len(d.GetRangeEnd()), MaxNameLen)
	}
	return nil
}

func validateKVCompare(c *fsmpb.KVCompare) error {
	if err := validateKVBytes(c.GetKey(), len(c.GetRangeEnd()) > 0); err != nil {
		return err
	}
	if len(c.GetRangeEnd()) > MaxNameLen {
		return fmt.Errorf("%w: range end is %d bytes, the limit is %d", ErrInvalid, len(c.GetRangeEnd()), MaxNameLen)
	}
	if c.GetTarget() < CompareValue || c.GetTarget() > CompareLease {
		return fmt.Errorf("%w: unknown compare target %d", ErrInvalid, c.GetTarget())
	}
	if c.GetResult() < CompareEqual || c.GetResult() > CompareLess {
		return fmt.Errorf("%w: unknown compare result %d", ErrInvalid, c.GetResult())
	}
	return nil
}

// ValidateKVTxn checks a transaction's arguments (not the sessions).
func ValidateKVTxn(t *fsmpb.KVTxn) error { return validateKVTxnAt(t, 0) }

// validateKVTxnAt is ValidateKVTxn of a transaction nested depth deep.
func validateKVTxnAt(t *fsmpb.KVTxn, depth int) error {
	if len(t.GetCompares()) > MaxTxnOps {
		return fmt.Errorf("%w: %d compares in a transaction, the limit is %d", ErrInvalid, len(t.GetCompares()), MaxTxnOps)
	}
	for _, c := range t.GetCompares() {
		if err := validateKVCompare(c); err != nil {
			return err
		}
	}
	if err := validateKVOps(t.GetSuccess(), depth); err != nil {
		return err
	}
	return validateKVOps(t.GetFailure(), depth)
}

// revisionOnce hands out one new revision on first use and the same one
// after: all writes of one command share a revision.
type revisionOnce struct {
	s   *State
	rev uint64
}

func (r *revisionOnce) get() uint64 {
	if r.rev == 0 {
		r.rev = r.s.bump()
	}
	return r.rev
}

func (s *State) kvApplyPut(p *fsmpb.KVPut, emit EventSink) Result {
	if err := validateKVPut(p); err != nil {
		return Result{Err: err}
	}
	if err := s.checkPut(p); err != nil {
		return Result{Err: err}
	}
	if err := s.admitKVPuts([]*fsmpb.KVPut{p}); err != nil {
		return Result{Err: err}
	}
	return Result{KV: &KVResult{Prev: s.kvPut(p, s.bump(), emit)}}
}

func (s *State) kvApplyDelete(d *fsmpb.KVDelete, emit EventSink) Result {
	if err := validateKVDelete(d); err != nil {
		return Result{Err: err}
	}
	rev := revisionOnce{s: s}
	victims := s.kvDelete(rangeOf(d.GetKey(), d.GetPrefix(), d.GetRangeEnd()), &rev, emit)
	return Result{KV: &KVResult{Deleted: int64(len(victims)), Prev: victims}}
}

// txnBranch evaluates a transaction's compares, with those of its nested
// transactions (planTxn), and checks the ops of the branches they choose,
// changing nothing: the transaction is all or nothing. ops are the
// branches' puts, deletes and ranges in the order they run.
func (s *State) txnBranch(t *fsmpb.KVTxn) (plan *txnPlan, ops []*fsmpb.KVOp, err error) {
	plan = s.planTxn(t)
	ops = plan.flat()
	for _, op := range ops {
		if p := op.GetPut(); p != nil {
			if err := s.checkPut(p); err != nil {
				return plan, nil, err
			}
		}
		if r := op.GetRange(); r != nil {
			if err := s.CheckKVRevision(r.GetRevision()); err != nil {
				return plan, nil, err
			}
		}
	}
	return plan, ops, nil
}

// ReadTxn evaluates a transaction whose ops are all ranges without
// applying it (etcd serves such a transaction as a read): the same
// compares and ranges as applying it would give. A transaction with any
// other op is ErrInvalid.
func (s *State) ReadTxn(t *fsmpb.KVTxn) (KVResult, error) {
	if err := ValidateKVTxn(t); err != nil {
		return KVResult{}, err
	}
	if err := s.checkNestedVersion(t); err != nil {
		return KVResult{}, err
	}
	if !rangesOnly(t) {
		return KVResult{}, fmt.Errorf("%w: a transaction read holds ranges only", ErrInvalid)
	}
	plan, ops, err := s.txnBranch(t)
	if err != nil {
		return KVResult{}, err
	}
	if err := s.admitTxnAnswer(t, ops); err != nil {
		return KVResult{}, err
	}
	return *s.runPlan(plan, t.GetPaged(), &revisionOnce{s: s}, nil), nil
}

// rangesOnly reports whether every op of t's branches, and of its nested
// transactions', is a range.
func rangesOnly(t *fsmpb.KVTxn) bool {
	for _, branch := range [][]*fsmpb.KVOp{t.GetSuccess(), t.GetFailure()} {
		for _, op := range branch {
			if nt := op.GetTxn(); nt != nil {
				if !rangesOnly(nt) {
					return false
				}
			} else if op.GetRange() == nil {
				return false
			}
		}
	}
	return true
}

func (s *State) kvApplyTxn(t *fsmpb.KVTxn, emit EventSink) Result {
	if err := ValidateKVTxn(t); err != nil {
		return Result{Err: err}
	}
	if err := s.checkNestedVersion(t); err != nil {
		return Result{Err: err}
	}
	plan, ops, err := s.txnBranch(t)
	if err != nil {
		return Result{Err: err}
	}
	var puts []*fsmpb.KVPut
	for _, op := range ops {
		if p := op.GetPut(); p != nil {
			puts = append(puts, p)
		}
	}
	if err := s.admitKVPuts(puts); err != nil {
		return Result{Err: err}
	}
	if s.at(2) { // the answer's bound came with version 2 (version.go)
		if err := s.admitTxnAnswer(t, ops); err != nil {
			return Result{Err: err}
		}
	}
	return Result{KV: s.runPlan(plan, t.GetPaged(), &revisionOnce{s: s}, emit)}
}

// ErrAnswerTooLarge: a transaction's range answers could take more bytes
// than its max_answer_bytes; nothing was written. It is ErrLimit too.
var ErrAnswerTooLarge = fmt.Errorf("%w: response too large", ErrLimit)

// CheckTxnAnswer is the check Apply makes of t's max_answer_bytes
// (ErrAnswerTooLarge), made on the state as it is: a node refuses an
// obvious case before proposing it. Apply checks again.
func (s *State) CheckTxnAnswer(t *fsmpb.KVTxn) error {
	if t.GetMaxAnswerBytes() == 0 || ValidateKVTxn(t) != nil {
		return nil // Apply answers an invalid one
	}
	_, ops, err := s.txnBranch(t)
	if err != nil {
		return nil // Apply answers it
	}
	return s.admitTxnAnswer(t, ops)
}

// admitTxnAnswer refuses a transaction whose branch ops could answer more
// than its max_answer_bytes, before anything is written or collected. The
// bound is computed on the state before the branch: the answer of each
// range (paged if the transaction is), plus every put before the range in
// the branch that lands in it, counted whole (a put may add a key or grow
// one; a delete only takes away). Each range's scan stops at its page or
// at the budget, so the check costs at most what the answer would.
func (s *State) admitTxnAnswer(t *fsmpb.KVTxn, ops []*fsmpb.KVOp) error {
	budget := t.GetMaxAnswerBytes()
	if budget == 0 {
		return nil
	}
	var total uint64
	for i, op := range ops {
		r := op.GetRange()
		if r == nil {
			continue
		}
		kr, q := rangeOp(r, t.GetPaged())
		n := s.rangeSize(kr, q, budget-total)
		if !q.CountOnly {
			for _, before := range ops[:i] {
				p := before.GetPut()
				if p == nil || !kr.contains(p.GetKey()) {
					continue
				}
				n += uint64(len(p.GetKey()) + len(p.GetValue()) + answerOverhead)
				if p.GetIgnoreValue() {
					if old, ok := s.kv.tree.Get(KV{Key: p.GetKey()}); ok {
						n += uint64(len(old.Value))
					}
				}
			}
		}
		if q.Paged {
			n = min(n, MaxPageBytes) // a page never takes more (one key is less)
		}
		if total += n; total > budget {
			return fmt.Errorf("%w: the response would exceed --max-response-bytes (%d bytes); page the ranges (a limit, start_key) or split the transaction", ErrAnswerTooLarge, budget)
		}
	}
	return nil
}

// admitKVPuts applies max-keys and max-kv-bytes to puts applied in order
// (a transaction's branch): the keys they would create and the bytes they
// would add. Deletes in the same transaction are not counted as freeing
// room, so the check errs on the side of refusing.
func (s *State) admitKVPuts(puts []*fsmpb.KVPut) error {
	if err := s.checkValueLens(puts); err != nil {
		return err
	}
	var newKeys, grow uint64
	size := make(map[string]int, len(puts)) // key -> value size after the puts so far
	for _, p := range puts {
		before, seen := size[p.GetKey()]
		if !seen {
			if old, ok := s.kv.tree.Get(KV{Key: p.GetKey()}); ok {
				before, seen = len(old.Value), true
			}
		}
		n := len(p.GetValue())
		if p.GetIgnoreValue() {
			n = before // the value is kept
		}
		if !seen {
			newKeys++
			grow += uint64(len(p.GetKey()) + n)
		} else if n > before {
			grow += uint64(n - before)
		}
		size[p.GetKey()] = n
	}
	if newKeys > 0 {
		if err := overLimit("max-keys", s.limits.MaxKeys, "keys", uint64(s.kv.tree.Len()), newKeys); err != nil {
			return err
		}
	}
	if grow > 0 {
		return overLimit("max-kv-bytes", s.limits.MaxKVBytes, "bytes in the key-value store", s.kv.bytes, grow)
	}
	return nil
}

// kvCompare evaluates c on its key, or on every key of its range (all
// must hold; none compares as one absent key, as etcd does).
func (s *State) kvCompare(c *fsmpb.KVCompare) bool {
	if len(c.GetRangeEnd()) == 0 {
		kv, found := s.kv.tree.Get(KV{Key: c.GetKey()})
		return compareKV(c, &kv, found)
	}
	ok, any := true, false
	s.ascend(rangeOf(c.GetKey(), false, c.GetRangeEnd()), func(kv KV) bool {
		any = true
		ok = compareKV(c, &kv, true)
		return ok
	})
	if !any {
		return compareKV(c, &KV{}, false)
	}
	return ok
}

func compareKV(c *fsmpb.KVCompare, kv *KV, found bool) bool {
	var cmp int
	switch c.GetTarget() {
	case CompareValue:
		if !found {
			return false // nothing to compare the value with, as etcd
		}
		cmp = bytes.Compare(kv.Value, c.GetValue())
	default:
		var n uint64
		switch c.GetTarget() {
		case CompareVersion:
			n = kv.Version
		case CompareCreateRevision:
			n = kv.CreateRevision
		case CompareModRevision:
			n = kv.ModRevision
		case CompareLease:
			n = kv.Session
		}
		if c.GetSigned() {
			a, b := int64(n), int64(c.GetNumber())
			switch {
			case a < b:
				cmp = -1
			case a > b:
				cmp = 1
			}
			break
		}
		switch {
		case n < c.GetNumber():
			cmp = -1
		case n > c.GetNumber():
			cmp = 1
		}
	}
	switch c.GetResult() {
	case CompareEqual:
		return cmp == 0
	case CompareNotEqual:
		return cmp != 0
	case CompareGreater:
		return cmp > 0
	case CompareLess:
		return cmp < 0
	}
	return false
}

// kvPut writes p at rev and returns the key as it was before, if it
// existed. A put without a session or lease makes an ephemeral key
// persistent; with one it binds the key to it. ignore_value and
// ignore_lease keep the key's value and binding (checkPut made sure the
// key exists).
func (s *State) kvPut(p *fsmpb.KVPut, rev uint64, emit EventSink) (prev []KV) {
	bound := p.GetSession()
	if p.GetLease() != 0 {
		bound = p.GetLease()
	}
	kv := KV{Key: p.GetKey(), ModRevision: rev, Session: bound, CreateRevision: rev, Version: 1}
	old, existed := s.kv.tree.Get(kv)
	switch {
	case p.GetIgnoreValue() && existed:
		kv.Value = old.Value // never changed in place: shared
	default:
		kv.Value = append([]byte(nil), p.GetValue()...)
	}
	if p.GetIgnoreLease() && existed {
		kv.Session = old.Session
	}
	var oldp *KV
	if existed {
		kv.CreateRevision, kv.Version = old.CreateRevision, old.Version+1
		if old.Session != kv.Session {
			s.kv.unbind(old.Session, kv.Key)
		}
		s.kv.bytes -= uint64(len(old.Key) + len(old.Value))
		prev, oldp = []KV{old}, &old
	}
	s.kv.bytes += uint64(len(kv.Key) + len(kv.Value))
	if kv.Session != 0 {
		s.kv.bind(kv.Session, kv.Key)
	}
	s.kv.tree.ReplaceOrInsert(kv)
	s.kvRecordChange(true, kv, oldp, rev)
	emit(Event{Kind: EventKVPut, Name: kv.Key, Revision: rev, KV: &kv, Prev: oldp})
	return prev
}

// kvDelete deletes the keys of r in key order, all at one revision, taken
// only if something is deleted, and returns them.
func (s *State) kvDelete(r keyRange, rev *revisionOnce, emit EventSink) []KV {
	var victims []KV
	s.ascend(r, func(kv KV) bool {
		victims = append(victims, kv)
		return true
	})
	for _, kv := range victims {
		s.kvRemove(kv, rev.get(), emit)
	}
	return victims
}

func (s *State) kvRemove(kv KV, rev uint64, emit EventSink) {
	s.kv.tree.Delete(kv)
	s.kv.unbind(kv.Session, kv.Key)
	s.kv.bytes -= uint64(len(kv.Key) + len(kv.Value))
	s.kvRecordChange(false, kv, &kv, rev)
	emit(Event{Kind: EventKVDelete, Name: kv.Key, Revision: rev, KV: &KV{Key: kv.Key, ModRevision: rev}, Prev: &kv})
}

// kvEndSession deletes the ephemeral keys of a session that ends, in key
// order, at one new revision.
func (s *State) kvEndSession(id uint64, emit EventSink) {
	keys := s.kv.ephemeral[id]
	if len(keys) == 0 {
		return
	}
	rev := s.bump()
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if kv, ok := s.kv.tree.Get(KV{Key: k}); ok {
			s.kvRemove(kv, rev, emit)
		}
	}
	delete(s.kv.ephemeral, id)
}

// KVGet returns one key.
func (s *State) KVGet(key string) (KV, bool) { return s.kv.tree.Get(KV{Key: key}) }

// KVRange returns key, or with prefix every key starting with it, in key
// order; at most limit keys when limit > 0 (more then says whether some
// were left out). The KVs share their values with the state: read only.
func (s *State) KVRange(key string, prefix bool, limit int64) (kvs []KV, more bool) {
	if !prefix {
		if kv, ok := s.kv.tree.Get(KV{Key: key}); ok {
			kvs = append(kvs, kv)
		}
		return kvs, false
	}
	return s.KVRangeFrom(key, key, limit)
}

// KVRangeFrom is KVRange of prefix starting at the key start (inclusive;
// a start before the prefix starts at the prefix): paging.
func (s *State) KVRangeFrom(prefix, start string, limit int64) (kvs []KV, more bool) {
	for kv := range s.KVFrom(prefix, start) {
		if limit > 0 && int64(len(kvs)) == limit {
			return kvs, true
		}
		kvs = append(kvs, kv)
	}
	return kvs, false
}

// KVFrom yields the keys starting with prefix from the key start on
// (inclusive; a start before the prefix starts at the prefix), in key
// order: finding the first costs O(log n). The KVs share their values with
// the state: read only. It must be consumed under the state's lock.
func (s *State) KVFrom(prefix, start string) iter.Seq[KV] {
	return func(yield func(KV) bool) {
		s.kv.tree.AscendGreaterOrEqual(KV{Key: max(start, prefix)}, func(kv KV) bool {
			return strings.HasPrefix(kv.Key, prefix) && yield(kv)
		})
	}
}

// KVCount is the number of keys.
func (s *State) KVCount() int { return s.kv.tree.Len() }

// exportKV appends every key of tree to snap, in key order.
func exportKV(snap *fsmpb.Snapshot, tree *btree.BTreeG[KV]) {
	snap.Kv = make([]*fsmpb.KVState, 0, tree.Len())
	tree.Ascend(func(kv KV) bool {
		snap.Kv = append(snap.Kv, kvStateRecord(&kv))
		return true
	})
	if len(snap.Kv) == 0 {
		snap.Kv = nil
	}
}

// importKV loads the keys of snap; sessions must be loaded already.
func (s *State) importKV(snap *fsmpb.Snapshot) error {
	for _, ks := range snap.GetKv() {
		kv := KV{Key: keyOfState(ks), Value: ks.GetValue(), CreateRevision: ks.GetCreateRevision(), ModRevision: ks.GetModRevision(), Version: ks.GetVersion(), Session: ks.GetSession()}
		if kv.Session != 0 {
			if _, ok := s.sessions[kv.Session]; !ok {
				return fmt.Errorf("snapshot: key %q bound to unknown session %d", kv.Key, kv.Session)
			}
			s.kv.bind(kv.Session, kv.Key)
		}
		s.kv.tree.ReplaceOrInsert(kv)
		s.kv.bytes += uint64(len(kv.Key) + len(kv.Value))
	}
	return nil
}
