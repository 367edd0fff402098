package fsm

// Ranges of keys with etcd's Range options: an interval of keys, a limit,
// a sort, keys only, count only and revision filters, with etcd's answers
// (internal/etcdapi serves etcd's API on them). The same code answers a
// read of the state and a range inside a transaction, so both agree.

import (
	"bytes"
	"fmt"
	"sort"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// Sort orders and targets of a RangeQuery; the numbers match etcd's
// RangeRequest enums.
const (
	SortNone    = 0
	SortAscend  = 1
	SortDescend = 2

	SortByKey     = 0
	SortByVersion = 1
	SortByCreate  = 2
	SortByMod     = 3
	SortByValue   = 4
)

// CompareLease compares the session or lease a key is bound to (0: none);
// the other targets are in kv.go.
const CompareLease = 5

// The page of a range: a paged range (RangeQuery.Paged, a paged
// transaction's ranges, the API's plain ranges) answers at most
// MaxPageItems keys and MaxPageBytes bytes (each key counted as
// AnswerSize), and at least one key, so that paging goes on; more says
// that the page was cut short. The largest key (MaxNameLen) with the
// largest value (MaxKVValueLen) fits a page.
const (
	MaxPageItems = 10_000
	MaxPageBytes = 2 << 20
	// answerOverhead bounds what a key's answer takes beside its key and
	// value: the field tags and lengths and its four revisions and
	// session as varints.
	answerOverhead = 64
)

// AnswerSize is the bytes kv takes in an answer (its value left out when
// keysOnly): its key, its value and a bound on the encoding of the rest.
// Pages and the transactions' max_answer_bytes count it.
func AnswerSize(kv *KV, keysOnly bool) int {
	if keysOnly {
		return len(kv.Key) + answerOverhead
	}
	return len(kv.Key) + len(kv.Value) + answerOverhead
}

// RangeQuery is a read of the key-value store with etcd's Range options.
type RangeQuery struct {
	// Key is the first key. End, in etcd's convention: empty reads Key
	// alone, the single byte 0 every key from Key on, anything else the
	// keys in [Key, End).
	Key string
	End []byte
	// Limit bounds the keys answered (0: no bound).
	Limit int64
	// SortOrder and SortTarget: see the Sort constants. A target other
	// than the key with no order sorts ascending, as etcd does.
	SortOrder, SortTarget uint32
	// KeysOnly leaves the values out; CountOnly answers the count alone.
	KeysOnly, CountOnly bool
	// The revision filters keep only the keys within them (0: no filter).
	MinModRevision, MaxModRevision       uint64
	MinCreateRevision, MaxCreateRevision uint64
	// Count counts every key of the range, the limit and the filters
	// aside, as etcd's count does; without it Count is not computed
	// (except with CountOnly) and the scan stops at the limit.
	Count bool
	// Paged answers at most one page (MaxPageItems, MaxPageBytes) after
	// the limit; More then says whether keys were left out.
	Paged bool
	// Revision reads the keys as they were at this revision (0: the
	// current ones); it must be inside the history window
	// (State.CheckKVRevision).
	Revision uint64
}

// RangeAnswer is what a RangeQuery reads.
type RangeAnswer struct {
	// KVs share their values with the state: read only.
	KVs []KV
	// More: there were more keys than the limit.
	More bool
	// Count: see RangeQuery.Count.
	Count int64
}

// keyRange is an interval of keys: key alone (single), or [start, end),
// with no end when toEnd.
type keyRange struct {
	start  string
	end    string
	single bool
	toEnd  bool
}

// rangeOf is the interval of a key with prefix or an etcd range end.
func rangeOf(key string, prefix bool, end []byte) keyRange {
	switch {
	case prefix:
		pe := PrefixEnd([]byte(key))
		if len(pe) == 1 && pe[0] == 0 {
			return keyRange{start: key, toEnd: true}
		}
		return keyRange{start: key, end: string(pe)}
	case len(end) == 0:
		return keyRange{start: key, single: true}
	case len(end) == 1 && end[0] == 0:
		return keyRange{start: key, toEnd: true}
	}
	return keyRange{start: key, end: string(end)}
}

// PrefixEnd is etcd's range end of the keys starting with prefix: the
// prefix with its last byte below 0xff incremented and what follows cut
// off; the single byte 0 (every key) when there is none.
func PrefixEnd(prefix []byte) []byte {
	end := bytes.Clone(prefix)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return []byte{0}
}

// contains reports whether key is in r.
func (r keyRange) contains(key string) bool {
	switch {
	case r.single:
		return key == r.start
	case r.toEnd:
		return key >= r.start
	}
	return key >= r.start && key < r.end
}

// ascend calls fn on every key of r in key order until it returns false.
func (s *State) ascend(r keyRange, fn func(KV) bool) {
	if r.single {
		if kv, ok := s.kv.tree.Get(KV{Key: r.start}); ok {
			fn(kv)
		}
		return
	}
	if !r.toEnd && r.end <= r.start {
		return
	}
	s.kv.tree.AscendGreaterOrEqual(KV{Key: r.start}, func(kv KV) bool {
		if !r.toEnd && kv.Key >= r.end {
			return false
		}
		return fn(kv)
	})
}

func (q *RangeQuery) defaultOrder() bool {
	return q.SortOrder == SortNone || (q.SortTarget == SortByKey && q.SortOrder == SortAscend)
}

func (q *RangeQuery) filtered() bool {
	return q.MinModRevision != 0 || q.MaxModRevision != 0 || q.MinCreateRevision != 0 || q.MaxCreateRevision != 0
}

func (q *RangeQuery) keep(kv *KV) bool {
	switch {
	case q.MaxModRevision != 0 && kv.ModRevision > q.MaxModRevision,
		q.MinModRevision != 0 && kv.ModRevision < q.MinModRevision,
		q.MaxCreateRevision != 0 && kv.CreateRevision > q.MaxCreateRevision,
		q.MinCreateRevision != 0 && kv.CreateRevision < q.MinCreateRevision:
		return false
	}
	return true
}

// ValidateRangeQuery checks a query's key, range end and options.
func ValidateRangeQuery(q *RangeQuery) error {
	if err := validateKVBytes(q.Key, len(q.End) > 0); err != nil {
		return err
	}
	if len(q.End) > MaxNameLen {
		return fmt.Errorf("%w: range end is %d bytes, the limit is %d", ErrInvalid, len(q.End), MaxNameLen)
	}
	if q.SortOrder > SortDescend || q.SortTarget > SortByValue {
		return fmt.Errorf("%w: invalid sort option", ErrInvalid)
	}
	if q.Limit < 0 {
		return fmt.Errorf("%w: negative limit", ErrInvalid)
	}
	return nil
}

// Range answers q the way etcd's Range does: the keys of the interval
// (counted, with Count, before anything else), then the revision filters,
// the sort and the limit, in that order. The query must be valid
// (ValidateRangeQuery).
func (s *State) Range(q RangeQuery) RangeAnswer {
	return s.rangeIn(rangeOf(q.Key, false, q.End), q)
}

func (s *State) rangeIn(r keyRange, q RangeQuery) RangeAnswer {
	var out RangeAnswer
	// Keys to collect: all for a sort or filters (applied after), else
	// one past the limit or the page (to tell whether there are more).
	want := int64(-1)
	if q.defaultOrder() && !q.filtered() {
		if q.Limit > 0 {
			want = q.Limit + 1
		}
		if q.Paged && (want < 0 || want > MaxPageItems+1) {
			want = MaxPageItems + 1
		}
	}
	counting := q.Count || q.CountOnly
	collecting, bytes := true, 0
	s.ascendAt(r, q.Revision, func(kv KV) bool {
		out.Count++
		if q.CountOnly {
			return true
		}
		if collecting {
			out.KVs = append(out.KVs, kv)
			bytes += AnswerSize(&kv, q.KeysOnly)
			if want >= 0 && (int64(len(out.KVs)) >= want || (q.Paged && bytes > MaxPageBytes)) {
				collecting = false
			}
		}
		return counting || collecting
	})
	if q.CountOnly {
		return RangeAnswer{Count: out.Count}
	}
	if !counting {
		out.Count = 0
	}
	if q.filtered() {
		kept := out.KVs[:0]
		for i := range out.KVs {
			if q.keep(&out.KVs[i]) {
				kept = append(kept, out.KVs[i])
			}
		}
		out.KVs = kept
	}
	sortKVs(out.KVs, q.SortOrder, q.SortTarget)
	if q.Limit > 0 && int64(len(out.KVs)) > q.Limit {
		out.KVs, out.More = out.KVs[:q.Limit], true
	}
	if q.Paged {
		if n := pageCut(out.KVs, q.KeysOnly); n < len(out.KVs) {
			clear(out.KVs[n:]) // the state's values are not kept alive by the cut
			out.KVs, out.More = out.KVs[:n], true
		}
	}
	if q.KeysOnly {
		for i := range out.KVs {
			out.KVs[i].Value = nil
		}
	}
	if len(out.KVs) == 0 {
		out.KVs = nil
	}
	return out
}

// pageCut is how many of kvs, from the first, make one page.
func pageCut(kvs []KV, keysOnly bool) int {
	bytes := 0
	for i := range kvs {
		bytes += AnswerSize(&kvs[i], keysOnly)
		if i == MaxPageItems || (i > 0 && bytes > MaxPageBytes) {
			return i
		}
	}
	return len(kvs)
}

// rangeSize is the bytes (AnswerSize) of the keys q answers on r, counted
// without collecting them when the range is in key order and unfiltered;
// it may stop counting once past stop.
func (s *State) rangeSize(r keyRange, q RangeQuery, stop uint64) uint64 {
	if q.CountOnly {
		return 0
	}
	var n uint64
	if !q.defaultOrder() || q.filtered() {
		a := s.rangeIn(r, q)
		for i := range a.KVs {
			n += uint64(AnswerSize(&a.KVs[i], false)) // KeysOnly already cut the values
		}
		return n
	}
	limit := q.Limit
	if q.Paged && (limit <= 0 || limit > MaxPageItems) {
		limit = MaxPageItems
	}
	var items int64
	s.ascendAt(r, q.Revision, func(kv KV) bool {
		size := uint64(AnswerSize(&kv, q.KeysOnly))
		if q.Paged && items > 0 && n+size > MaxPageBytes {
			return false
		}
		n += size
		items++
		return (limit <= 0 || items < limit) && n <= stop
	})
	return n
}

// kvSort sorts KVs with etcd's comparisons and sort.Sort, so that keys
// that tie end in the same order as etcd's.
type kvSort struct {
	kvs  []KV
	less func(a, b *KV) bool
}

func (k kvSort) Len() int           { return len(k.kvs) }
func (k kvSort) Swap(i, j int)      { k.kvs[i], k.kvs[j] = k.kvs[j], k.kvs[i] }
func (k kvSort) Less(i, j int) bool { return k.less(&k.kvs[i], &k.kvs[j]) }

func sortKVs(kvs []KV, order, target uint32) {
	if target != SortByKey && order == SortNone {
		order = SortAscend
	}
	if order == SortNone || (target == SortByKey && order == SortAscend) {
		return // the scan's order
	}
	var less func(a, b *KV) bool
	switch target {
	case SortByKey:
		less = func(a, b *KV) bool { return a.Key < b.Key }
	case SortByVersion:
		less = func(a, b *KV) bool { return a.Version < b.Version }
	case SortByCreate:
		less = func(a, b *KV) bool { return a.CreateRevision < b.CreateRevision }
	case SortByMod:
		less = func(a, b *KV) bool { return a.ModRevision < b.ModRevision }
	case SortByValue:
		less = func(a, b *KV) bool { return bytes.Compare(a.Value, b.Value) < 0 }
	default:
		return
	}
	var srt sort.Interface = kvSort{kvs, less}
	if order == SortDescend {
		srt = sort.Reverse(srt)
	}
	sort.Sort(srt)
}

// rangeOp is the query of a range op of a transaction; paged: the
// transaction's.
func rangeOp(r *fsmpb.KVRange, paged bool) (keyRange, RangeQuery) {
	q := RangeQuery{
		Key: r.GetKey(), End: r.GetRangeEnd(), Limit: r.GetLimit(),
		SortOrder: r.GetSortOrder(), SortTarget: r.GetSortTarget(), KeysOnly: r.GetKeysOnly(), CountOnly: r.GetCountOnly(),
		MinModRevision: r.GetMinModRevision(), MaxModRevision: r.GetMaxModRevision(),
		MinCreateRevision: r.GetMinCreateRevision(), MaxCreateRevision: r.GetMaxCreateRevision(),
		Count: r.GetCount(), Paged: paged, Revision: r.GetRevision(),
	}
	kr := rangeOf(r.GetKey(), r.GetPrefix(), r.GetRangeEnd())
	if r.GetPrefix() && r.GetStartKey() > kr.start {
		kr.start = r.GetStartKey()
	}
	if q.Limit < 0 {
		q.Limit = 0
	}
	return kr, q
}

func validateRangeOp(r *fsmpb.KVRange) error {
	if err := validateKVBytes(r.GetKey(), r.GetPrefix() || len(r.GetRangeEnd()) > 0); err != nil {
		return err
	}
	switch {
	case len(r.GetStartKey()) > MaxNameLen:
		return fmt.Errorf("%w: start key is %d bytes, the limit is %d", ErrInvalid, len(r.GetStartKey()), MaxNameLen)
	case len(r.GetRangeEnd()) > MaxNameLen:
		return fmt.Errorf("%w: range end is %d bytes, the limit is %d", ErrInvalid, len(r.GetRangeEnd()), MaxNameLen)
	case r.GetSortOrder() > SortDescend || r.GetSortTarget() > SortByValue:
		return fmt.Errorf("%w: invalid sort option", ErrInvalid)
	}
	return nil
}
