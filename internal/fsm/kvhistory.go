package fsm

// The key-value store's history window: the past versions of keys that
// etcd's API reads at a revision (etcd's MVCC store), from cluster version
// 3 on.
//
// Every change of a key (a put, a delete, an ephemeral key ended with its
// session or lease) appends a record to a log in revision order: the key
// as written, or its delete, and the key before the change. The version a
// change superseded is indexed by (key, mod revision) with the revision
// it stayed current until, so the version of a key at revision R is the
// current one if its mod revision is at or below R, else the indexed one
// with mod revision <= R < until; a key deleted at or before R and not
// put again has none. The window holds every change from its start, the
// compact revision, on: a read at a revision at or after it answers what
// etcd would; one before it is ErrCompactedRevision.
//
// The window is bounded where it is applied, by two replicated limits:
// max-kv-history-revisions (it spans at most that many revisions before
// the change being written) and max-kv-history-bytes (the bytes its
// records hold: each superseded value, its key and a fixed overhead).
// Each change past a bound compacts the oldest revisions away, never the
// revision being written. KVHistoryCompact (etcd's Compact, proposed by a
// client or by the leader's auto-compaction) moves the start on too.
//
// Below cluster version 3 nothing is recorded: the compact revision is
// the current one (a read names the current revision or nothing), as
// before. Raising the version to 3 starts the window empty at the
// revision of the raise.

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"iter"
	"slices"

	"github.com/google/btree"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// historyVersion is the cluster version from which the history is kept.
const historyVersion = 3

// kvRecordOverhead is what a record takes beside its key and the value it
// keeps alive: the record in the log (with the log's spare capacity), the
// copy of the previous key and its index entry (measured:
// BenchmarkKVHistoryWindow). max-kv-history-bytes counts it.
const kvRecordOverhead = 256

// kvRecord is one change of a key.
type kvRecord struct {
	rev uint64
	put bool
	// kv: of a put the key as written; of a delete its Key and
	// ModRevision (the delete's revision) only.
	kv KV
	// prev is the key before the change; nil: it did not exist. Shared
	// with the index and with readers: never modified.
	prev *KV
}

// indexed reports whether the version the record superseded is in the
// index: one written at an earlier revision. A version written and
// superseded at the same revision (a transaction that writes a key twice)
// was current at no revision, and would share its (key, mod revision)
// with the one that superseded it.
func (r *kvRecord) indexed() bool { return r.prev != nil && r.prev.ModRevision < r.rev }

func (r *kvRecord) size() uint64 {
	n := uint64(len(r.kv.Key) + kvRecordOverhead)
	if r.prev != nil {
		n += uint64(len(r.prev.Value))
	}
	return n
}

// kvVersion is a version of a key that a later change superseded: it was
// the key's version at the revisions [kv.ModRevision, until).
type kvVersion struct {
	kv    *KV
	until uint64
}

func kvVersionLess(a, b kvVersion) bool {
	if a.kv.Key != b.kv.Key {
		return a.kv.Key < b.kv.Key
	}
	return a.kv.ModRevision < b.kv.ModRevision
}

// kvHistory is the window.
type kvHistory struct {
	// compactRev is the window's start: the oldest revision a read may
	// name (0 and 1 read the same: nothing is older).
	compactRev uint64
	// log[head:] are the changes from compactRev on, in revision order.
	// Records are never modified once appended, and the records before
	// head are not cleared: a snapshot shares the slice (historyCopy)
	// while Apply appends and compacts. Compaction copies the rest to a
	// new array once head passes a quarter of it, so the dropped records
	// keep at most a third of the window's size alive.
	log  []kvRecord
	head int
	// versions indexes the records' prev by (key, mod revision).
	versions *btree.BTreeG[kvVersion]
	bytes    uint64
}

func newKVHistory() kvHistory {
	return kvHistory{versions: btree.NewG(32, kvVersionLess)}
}

func (h *kvHistory) records() []kvRecord { return h.log[h.head:] }

// compactTo drops the changes before revision c and makes c the start.
func (h *kvHistory) compactTo(c uint64) {
	for h.head < len(h.log) && h.log[h.head].rev < c {
		rec := &h.log[h.head]
		if rec.indexed() {
			h.versions.Delete(kvVersion{kv: rec.prev})
		}
		h.bytes -= rec.size()
		h.head++
	}
	switch {
	case h.head == len(h.log):
		h.log, h.head = nil, 0
	case h.head > 1024 && 4*h.head > len(h.log):
		h.log, h.head = slices.Clone(h.log[h.head:]), 0
	}
	h.compactRev = max(h.compactRev, c)
}

// add appends a record.
func (h *kvHistory) add(rec kvRecord) {
	h.log = append(h.log, rec)
	if rec.indexed() {
		h.versions.ReplaceOrInsert(kvVersion{kv: rec.prev, until: rec.rev})
	}
	h.bytes += rec.size()
}

// kvRecordChange records a change of a key applied at rev (kvPut,
// kvRemove) and applies the window's bounds; nothing below cluster
// version 3.
func (s *State) kvRecordChange(put bool, kv KV, prev *KV, rev uint64) {
	if !s.at(historyVersion) {
		return
	}
	if !put {
		kv = KV{Key: kv.Key, ModRevision: rev}
	}
	h := &s.kv.hist
	h.add(kvRecord{rev: rev, put: put, kv: kv, prev: prev})
	if m := s.limits.MaxKVHistoryRevisions; m > 0 && rev > m && rev-m > h.compactRev {
		h.compactTo(rev - m)
	}
	if m := s.limits.MaxKVHistoryBytes; m > 0 {
		for h.bytes > m && h.head < len(h.log) && h.log[h.head].rev < rev {
			h.compactTo(h.log[h.head].rev + 1)
		}
	}
}

// startKVHistory starts the window empty at the current revision: the
// cluster version was raised to 3.
func (s *State) startKVHistory() {
	s.kv.hist = newKVHistory()
	s.kv.hist.compactRev = s.revision
}

// KVCompactRevision is the start of the history window: the oldest
// revision a read of the key-value store may name. Below cluster version
// 3 it is the current revision (no history is kept).
func (s *State) KVCompactRevision() uint64 {
	if !s.at(historyVersion) {
		return s.revision
	}
	return s.kv.hist.compactRev
}

// KVHistoryKept reports whether the history window is kept: from cluster
// version 3 on.
func (s *State) KVHistoryKept() bool { return s.at(historyVersion) }

// KVHistoryStats reports the window: its records and the bytes they count
// against max-kv-history-bytes.
func (s *State) KVHistoryStats() (records int, bytes uint64) {
	return len(s.kv.hist.records()), s.kv.hist.bytes
}

// CheckKVRevision checks a revision a read names (0: the current one):
// ErrFutureRevision above the state's revision, ErrCompactedRevision
// before the window's start.
func (s *State) CheckKVRevision(rev uint64) error {
	switch {
	case rev == 0:
		return nil
	case rev > s.revision:
		return ErrFutureRevision
	case rev < s.KVCompactRevision():
		return ErrCompactedRevision
	}
	return nil
}

// kvCompact applies KVHistoryCompact: etcd's Compact. It takes no
// revision.
func (s *State) kvCompact(c *fsmpb.KVHistoryCompact) Result {
	rev := c.GetRevision()
	switch {
	case rev > s.revision:
		return Result{Err: ErrFutureRevision}
	case rev <= s.kv.hist.compactRev:
		return Result{Err: ErrCompactedRevision}
	}
	s.kv.hist.compactTo(rev)
	return Result{}
}

// kvAt is the version of key at revision rev, inside the window.
func (s *State) kvAt(key string, rev uint64) (KV, bool) {
	if kv, ok := s.kv.tree.Get(KV{Key: key}); ok && kv.ModRevision <= rev {
		return kv, true
	}
	var out KV
	found := false
	s.kv.hist.versions.DescendLessOrEqual(kvVersion{kv: &KV{Key: key, ModRevision: rev}}, func(v kvVersion) bool {
		if v.kv.Key == key && rev < v.until {
			out, found = *v.kv, true
		}
		return false
	})
	return out, found
}

// ascendAt is ascend at revision rev (0, or at or after the current
// revision: the current keys): the version of every key of r at rev, in
// key order. rev must be inside the window (CheckKVRevision).
func (s *State) ascendAt(r keyRange, rev uint64, fn func(KV) bool) {
	if rev == 0 || rev >= s.revision || !s.at(historyVersion) {
		s.ascend(r, fn)
		return
	}
	if r.single {
		if kv, ok := s.kvAt(r.start, rev); ok {
			fn(kv)
		}
		return
	}
	if !r.toEnd && r.end <= r.start {
		return
	}
	// The superseded versions visible at rev, in key order (a key has at
	// most one), merged with the current keys written at or before rev; a
	// key has a version in one of the two at most.
	past := func(yield func(KV) bool) {
		s.kv.hist.versions.AscendGreaterOrEqual(kvVersion{kv: &KV{Key: r.start}}, func(v kvVersion) bool {
			if !r.toEnd && v.kv.Key >= r.end {
				return false
			}
			if v.kv.ModRevision <= rev && rev < v.until {
				return yield(*v.kv)
			}
			return true
		})
	}
	next, stop := iter.Pull(past)
	defer stop()
	p, more := next()
	done := false
	s.ascend(r, func(kv KV) bool {
		if kv.ModRevision > rev {
			return true
		}
		for more && p.Key < kv.Key {
			if !fn(p) {
				done = true
				return false
			}
			p, more = next()
		}
		if !fn(kv) {
			done = true
			return false
		}
		return true
	})
	for !done && more {
		if !fn(p) {
			return
		}
		p, more = next()
	}
}

// HashKV is a hash of the key-value store at revision rev (0: the
// current one) as every member computes it alike: CRC-32C of every key
// visible at rev (key, value, create and mod revision, version, lease) in
// key order, then of the window's changes from its start up to rev. It
// answers the revision hashed and the window's start; rev outside the
// window is ErrFutureRevision or ErrCompactedRevision. It costs a walk of
// every key and of the window: callers that may run it on a large state
// walk a KVView (kvview.go), not the state under its lock, which would
// stop Apply for the whole walk.
func (s *State) HashKV(rev uint64) (hash uint32, hashRev, compactRev uint64, err error) {
	if err := s.CheckKVRevision(rev); err != nil {
		return 0, 0, 0, err
	}
	if rev == 0 {
		rev = s.revision
	}
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	var buf []byte
	writeKV := func(kv *KV) {
		buf = buf[:0]
		buf = binary.AppendUvarint(buf, uint64(len(kv.Key)))
		buf = append(buf, kv.Key...)
		buf = binary.AppendUvarint(buf, uint64(len(kv.Value)))
		buf = append(buf, kv.Value...)
		for _, n := range []uint64{kv.CreateRevision, kv.ModRevision, kv.Version, kv.Session} {
			buf = binary.AppendUvarint(buf, n)
		}
		h.Write(buf)
	}
	s.ascendAt(keyRange{toEnd: true}, rev, func(kv KV) bool {
		writeKV(&kv)
		return true
	})
	for i := range s.kv.hist.records() {
		rec := &s.kv.hist.records()[i]
		if rec.rev > rev {
			break
		}
		mark := []byte{'d'}
		if rec.put {
			mark[0] = 'p'
		}
		h.Write(mark)
		writeKV(&rec.kv)
	}
	return h.Sum32(), rev, s.KVCompactRevision(), nil
}

// historyCopy is what a snapshot takes of the window: O(1), the records
// are shared (kvHistory's log is never modified in place).
type historyCopy struct {
	on         bool
	compactRev uint64
	log        []kvRecord
}

func (s *State) copyKVHistory() historyCopy {
	if !s.at(historyVersion) {
		return historyCopy{}
	}
	h := &s.kv.hist
	return historyCopy{on: true, compactRev: h.compactRev, log: h.records()}
}

func kvStateOf(kv *KV) *fsmpb.KVState {
	return &fsmpb.KVState{Value: kv.Value, CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision, Version: kv.Version, Session: kv.Session}
}

// exportKVHistory adds the window to snap: its start and its records,
// each key's prev written with its first record only.
func exportKVHistory(snap *fsmpb.Snapshot, c historyCopy) {
	if !c.on {
		return
	}
	snap.KvCompactRevision = max(c.compactRev, 1)
	if len(c.log) == 0 {
		return
	}
	seen := make(map[string]bool)
	snap.KvHistory = make([]*fsmpb.KVHistoryRecord, len(c.log))
	for i := range c.log {
		rec := &c.log[i]
		out := &fsmpb.KVHistoryRecord{Revision: rec.rev, Key: rec.kv.Key, Put: rec.put}
		binKey(&out.Key, &out.KeyBin) // a key that is not UTF-8 (keysbin.go)
		if rec.put {
			out.Kv = kvStateOf(&rec.kv)
		}
		if !seen[rec.kv.Key] {
			seen[rec.kv.Key] = true
			if rec.prev != nil {
				out.Prev = kvStateOf(rec.prev)
			}
		}
		snap.KvHistory[i] = out
	}
}

// importKVHistory loads the window of snap (after the cluster version).
func (s *State) importKVHistory(snap *fsmpb.Snapshot) error {
	if !s.at(historyVersion) {
		if len(snap.GetKvHistory()) > 0 {
			return fmt.Errorf("snapshot: key-value history in a snapshot of cluster version %d", s.ClusterVersion())
		}
		return nil
	}
	h := newKVHistory()
	h.compactRev = snap.GetKvCompactRevision()
	if h.compactRev == 0 { // written before the history was kept
		h.compactRev = s.revision
	}
	last := make(map[string]*kvRecord)
	var prevRev uint64
	for _, r := range snap.GetKvHistory() {
		rec := kvRecord{rev: r.GetRevision(), put: r.GetPut()}
		key := r.GetKey()
		fromBin(&key, &r.KeyBin) // a key that is not UTF-8 (keysbin.go)
		switch {
		case rec.rev < h.compactRev || rec.rev > s.revision || rec.rev < prevRev:
			return fmt.Errorf("snapshot: key-value history record at revision %d outside %d..%d or out of order", rec.rev, h.compactRev, s.revision)
		case validateKVBytes(key, false) != nil:
			return fmt.Errorf("snapshot: key-value history record with an invalid key %q", key)
		}
		prevRev = rec.rev
		rec.kv = KV{Key: key, ModRevision: rec.rev}
		if rec.put {
			k := r.GetKv()
			rec.kv = KV{Key: key, Value: k.GetValue(), CreateRevision: k.GetCreateRevision(), ModRevision: rec.rev, Version: k.GetVersion(), Session: k.GetSession()}
		}
		if l := last[rec.kv.Key]; l != nil {
			if l.put {
				kv := l.kv
				rec.prev = &kv
			}
		} else if p := r.GetPrev(); p != nil {
			rec.prev = &KV{Key: key, Value: p.GetValue(), CreateRevision: p.GetCreateRevision(), ModRevision: p.GetModRevision(), Version: p.GetVersion(), Session: p.GetSession()}
		}
		h.add(rec)
		last[rec.kv.Key] = &h.log[len(h.log)-1]
	}
	s.kv.hist = h
	return nil
}

// KVChange is one change of a key in the history window.
type KVChange struct {
	// Put: the key was written; else deleted, and KV holds only its Key
	// and ModRevision (the delete's revision).
	Put bool
	KV  KV
	// Prev is the key before the change; nil: it did not exist. Read
	// only.
	Prev *KV
}

// KVChangesFrom returns the window's changes at revision from and after,
// in revision order: at most about limit, never half of a revision.
// through is the revision up to which they are complete: the state's
// revision once they reach the end of the window. A revision before the
// window's start (or any, below cluster version 3) is
// ErrCompactedRevision.
func (s *State) KVChangesFrom(from uint64, limit int) (changes []KVChange, through uint64, err error) {
	if !s.at(historyVersion) || from < s.kv.hist.compactRev {
		return nil, 0, ErrCompactedRevision
	}
	recs := s.kv.hist.records()
	i, _ := slices.BinarySearchFunc(recs, from, func(r kvRecord, rev uint64) int {
		switch {
		case r.rev < rev:
			return -1
		case r.rev > rev:
			return 1
		}
		return 0
	})
	for ; i < len(recs); i++ {
		r := &recs[i]
		if len(changes) >= limit && r.rev != changes[len(changes)-1].KV.ModRevision {
			return changes, changes[len(changes)-1].KV.ModRevision, nil
		}
		changes = append(changes, KVChange{Put: r.put, KV: r.kv, Prev: r.prev})
	}
	return changes, max(s.revision, from-1), nil
}
