package fsm

// RangeCost is what answering a RangeQuery takes, measured without
// building the answer, so that a server can refuse a request whose answer
// would be too large before it is built (internal/etcdapi bounds a
// transaction's ranges together this way).
type RangeCost struct {
	// Keys is how many keys the answer holds (after the filters and the
	// limit), Bytes at most how many bytes of keys and values they have
	// (values left out with KeysOnly; nothing with CountOnly).
	Keys, Bytes int64
	// Collected is how many keys the read gathers before its sort,
	// filters and limit: every key of the interval for a sorted or
	// filtered query, at most the limit + 1 otherwise.
	Collected int64
}

// RangeCost measures the answer of q as Range would give it, in one pass
// over the keys of its interval that keeps nothing. For a sort with a
// limit the bytes are bounded by the largest key-value pairs (an upper
// bound, not the exact figure). The query must be valid
// (ValidateRangeQuery).
func (s *State) RangeCost(q RangeQuery) RangeCost {
	var c RangeCost
	if q.CountOnly {
		return c
	}
	want := int64(-1)
	if q.Limit > 0 && q.defaultOrder() && !q.filtered() {
		want = q.Limit // the answer; the read gathers one more
	}
	var largest int64
	s.ascendAt(rangeOf(q.Key, false, q.End), q.Revision, func(kv KV) bool {
		if want < 0 || c.Collected <= want {
			c.Collected++
		}
		if !q.keep(&kv) {
			return true
		}
		n := int64(len(kv.Key))
		if !q.KeysOnly {
			n += int64(len(kv.Value))
		}
		largest = max(largest, n)
		if want < 0 || c.Keys < want {
			c.Keys++
			c.Bytes += n
		}
		// Without a sort or filters the scan may stop past the limit,
		// as Range's does when it does not count.
		return want < 0 || c.Keys < want
	})
	if q.Limit > 0 && c.Keys > q.Limit {
		c.Keys = q.Limit
		c.Bytes = min(c.Bytes, q.Limit*largest)
	}
	return c
}
