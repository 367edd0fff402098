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
	// MaxKVValueLen is the largest value a key may hold, bytes. Keys are
	// bounded by MaxNameLen.
	MaxKVValueLen = 1 << 20
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
	// Succeeded: the transaction's compares all held.
	Succeeded bool
	// Ops has one entry per op of the transaction's branch taken.
	Ops []KVOpResult
}

// KVOpResult is the result of one op inside a transaction.
type KVOpResult struct {
	Range   []KV // a range op: keys in key order
	More    bool // a range op: cut short by its limit
	Deleted int64
}

func kvLess(a, b KV) bool { return a.Key < b.Key }

// kvStore holds the keys and, per session, its ephemeral keys.
type kvStore struct {
	tree      *btree.BTreeG[KV]
	ephemeral map[uint64]map[string]struct{}
	bytes     uint64 // of every key and value (max-kv-bytes)
}

func newKVStore() kvStore {
	return kvStore{tree: btree.NewG(32, kvLess), ephemeral: make(map[uint64]map[string]struct{})}
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

// ValidateKVKey checks a key, or with prefix a key prefix ("" allowed).
func ValidateKVKey(key string, prefix bool) error {
	if !prefix {
		return ValidateName("key", key)
	}
	switch {
	case len(key) > MaxNameLen:
		return fmt.Errorf("%w: key prefix is %d bytes, the limit is %d", ErrInvalid, len(key), MaxNameLen)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: key prefix is not valid UTF-8", ErrInvalid)
	}
	return nil
}

func validateKVPut(p *fsmpb.KVPut) error {
	if err := ValidateKVKey(p.GetKey(), false); err != nil {
		return err
	}
	if len(p.GetValue()) > MaxKVValueLen {
		return fmt.Errorf("%w: value is %d bytes, the limit is %d", ErrInvalid, len(p.GetValue()), MaxKVValueLen)
	}
	return nil
}

func validateKVOps(ops []*fsmpb.KVOp) error {
	if len(ops) > MaxTxnOps {
		return fmt.Errorf("%w: %d ops in a transaction branch, the limit is %d", ErrInvalid, len(ops), MaxTxnOps)
	}
	for _, op := range ops {
		var err error
		switch o := op.GetOp().(type) {
		case *fsmpb.KVOp_Put:
			err = validateKVPut(o.Put)
		case *fsmpb.KVOp_Delete:
			err = ValidateKVKey(o.Delete.GetKey(), o.Delete.GetPrefix())
		case *fsmpb.KVOp_Range:
			err = ValidateKVKey(o.Range.GetKey(), o.Range.GetPrefix())
			if err == nil && len(o.Range.GetStartKey()) > MaxNameLen {
				err = fmt.Errorf("%w: start key is %d bytes, the limit is %d", ErrInvalid, len(o.Range.GetStartKey()), MaxNameLen)
			}
		default:
			err = fmt.Errorf("%w: empty transaction op", ErrInvalid)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func validateKVCompare(c *fsmpb.KVCompare) error {
	if err := ValidateKVKey(c.GetKey(), false); err != nil {
		return err
	}
	if c.GetTarget() < CompareValue || c.GetTarget() > CompareModRevision {
		return fmt.Errorf("%w: unknown compare target %d", ErrInvalid, c.GetTarget())
	}
	if c.GetResult() < CompareEqual || c.GetResult() > CompareLess {
		return fmt.Errorf("%w: unknown compare result %d", ErrInvalid, c.GetResult())
	}
	return nil
}

// ValidateKVTxn checks a transaction's arguments (not the sessions).
func ValidateKVTxn(t *fsmpb.KVTxn) error {
	if len(t.GetCompares()) > MaxTxnOps {
		return fmt.Errorf("%w: %d compares in a transaction, the limit is %d", ErrInvalid, len(t.GetCompares()), MaxTxnOps)
	}
	for _, c := range t.GetCompares() {
		if err := validateKVCompare(c); err != nil {
			return err
		}
	}
	if err := validateKVOps(t.GetSuccess()); err != nil {
		return err
	}
	return validateKVOps(t.GetFailure())
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
	if p.GetSession() != 0 {
		if _, ok := s.sessions[p.GetSession()]; !ok {
			return Result{Err: ErrSessionNotFound}
		}
	}
	if err := s.admitKVPuts([]*fsmpb.KVPut{p}); err != nil {
		return Result{Err: err}
	}
	s.kvPut(p, s.bump(), emit)
	return Result{KV: &KVResult{}}
}

func (s *State) kvApplyDelete(d *fsmpb.KVDelete, emit EventSink) Result {
	if err := ValidateKVKey(d.GetKey(), d.GetPrefix()); err != nil {
		return Result{Err: err}
	}
	rev := revisionOnce{s: s}
	n := s.kvDelete(d.GetKey(), d.GetPrefix(), &rev, emit)
	return Result{KV: &KVResult{Deleted: n}}
}

func (s *State) kvApplyTxn(t *fsmpb.KVTxn, emit EventSink) Result {
	if err := ValidateKVTxn(t); err != nil {
		return Result{Err: err}
	}
	ok := true
	for _, c := range t.GetCompares() {
		if !s.kvCompare(c) {
			ok = false
			break
		}
	}
	ops := t.GetSuccess()
	if !ok {
		ops = t.GetFailure()
	}
	// Refuse before changing anything: the transaction is all or nothing.
	for _, op := range ops {
		if p := op.GetPut(); p != nil && p.GetSession() != 0 {
			if _, live := s.sessions[p.GetSession()]; !live {
				return Result{Err: ErrSessionNotFound}
			}
		}
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
	out := &KVResult{Succeeded: ok, Ops: make([]KVOpResult, len(ops))}
	rev := revisionOnce{s: s}
	for i, op := range ops {
		switch o := op.GetOp().(type) {
		case *fsmpb.KVOp_Put:
			s.kvPut(o.Put, rev.get(), emit)
		case *fsmpb.KVOp_Delete:
			out.Ops[i].Deleted = s.kvDelete(o.Delete.GetKey(), o.Delete.GetPrefix(), &rev, emit)
		case *fsmpb.KVOp_Range:
			if o.Range.GetPrefix() && o.Range.GetStartKey() != "" {
				out.Ops[i].Range, out.Ops[i].More = s.KVRangeFrom(o.Range.GetKey(), o.Range.GetStartKey(), o.Range.GetLimit())
			} else {
				out.Ops[i].Range, out.Ops[i].More = s.KVRange(o.Range.GetKey(), o.Range.GetPrefix(), o.Range.GetLimit())
			}
		}
	}
	return Result{KV: out}
}

// admitKVPuts applies max-keys and max-kv-bytes to puts applied in order
// (a transaction's branch): the keys they would create and the bytes they
// would add. Deletes in the same transaction are not counted as freeing
// room, so the check errs on the side of refusing.
func (s *State) admitKVPuts(puts []*fsmpb.KVPut) error {
	var newKeys, grow uint64
	size := make(map[string]int, len(puts)) // key -> value size after the puts so far
	for _, p := range puts {
		before, seen := size[p.GetKey()]
		if !seen {
			if old, ok := s.kv.tree.Get(KV{Key: p.GetKey()}); ok {
				before, seen = len(old.Value), true
			}
		}
		if !seen {
			newKeys++
			grow += uint64(len(p.GetKey()) + len(p.GetValue()))
		} else if n := len(p.GetValue()); n > before {
			grow += uint64(n - before)
		}
		size[p.GetKey()] = len(p.GetValue())
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

func (s *State) kvCompare(c *fsmpb.KVCompare) bool {
	kv, found := s.kv.tree.Get(KV{Key: c.GetKey()})
	var cmp int
	switch c.GetTarget() {
	case CompareValue:
		if !found {
			return false
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

// kvPut writes p at rev. A put without a session makes an ephemeral key
// persistent; with one it binds the key to that session.
func (s *State) kvPut(p *fsmpb.KVPut, rev uint64, emit EventSink) {
	kv := KV{Key: p.GetKey(), Value: append([]byte(nil), p.GetValue()...), ModRevision: rev, Session: p.GetSession(), CreateRevision: rev, Version: 1}
	if old, ok := s.kv.tree.Get(kv); ok {
		kv.CreateRevision, kv.Version = old.CreateRevision, old.Version+1
		if old.Session != kv.Session {
			s.kv.unbind(old.Session, kv.Key)
		}
		s.kv.bytes -= uint64(len(old.Key) + len(old.Value))
	}
	s.kv.bytes += uint64(len(kv.Key) + len(kv.Value))
	if kv.Session != 0 {
		s.kv.bind(kv.Session, kv.Key)
	}
	s.kv.tree.ReplaceOrInsert(kv)
	emit(Event{Kind: EventKVPut, Name: kv.Key, Revision: rev, KV: &kv})
}

// kvDelete deletes key (or every key under the prefix) in key order, all
// at one revision, taken only if something is deleted.
func (s *State) kvDelete(key string, prefix bool, rev *revisionOnce, emit EventSink) int64 {
	var victims []KV
	if prefix {
		s.kv.tree.AscendGreaterOrEqual(KV{Key: key}, func(kv KV) bool {
			if !strings.HasPrefix(kv.Key, key) {
				return false
			}
			victims = append(victims, kv)
			return true
		})
	} else if kv, ok := s.kv.tree.Get(KV{Key: key}); ok {
		victims = append(victims, kv)
	}
	for _, kv := range victims {
		s.kvRemove(kv, rev.get(), emit)
	}
	return int64(len(victims))
}

func (s *State) kvRemove(kv KV, rev uint64, emit EventSink) {
	s.kv.tree.Delete(kv)
	s.kv.unbind(kv.Session, kv.Key)
	s.kv.bytes -= uint64(len(kv.Key) + len(kv.Value))
	emit(Event{Kind: EventKVDelete, Name: kv.Key, Revision: rev, KV: &KV{Key: kv.Key, ModRevision: rev}})
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
		snap.Kv = append(snap.Kv, &fsmpb.KVState{Key: kv.Key, Value: kv.Value, CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision, Version: kv.Version, Session: kv.Session})
		return true
	})
	if len(snap.Kv) == 0 {
		snap.Kv = nil
	}
}

// importKV loads the keys of snap; sessions must be loaded already.
func (s *State) importKV(snap *fsmpb.Snapshot) error {
	for _, ks := range snap.GetKv() {
		kv := KV{Key: ks.GetKey(), Value: ks.GetValue(), CreateRevision: ks.GetCreateRevision(), ModRevision: ks.GetModRevision(), Version: ks.GetVersion(), Session: ks.GetSession()}
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
