package fsm

import (
	"fmt"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// maxKVValueLenV2 is the largest value a key may hold below cluster
// version 3: MaxKVValueLen was 1 MiB until version 3 raised it to etcd's
// request limit, and every member of an older release refuses more.
const maxKVValueLenV2 = 1 << 20

// checkValueLens refuses puts with a value above what the cluster
// version allows (MaxKVValueLen from version 3, maxKVValueLenV2 before),
// changing nothing.
func (s *State) checkValueLens(puts []*fsmpb.KVPut) error {
	if s.at(3) {
		return nil // validateKVPut checked MaxKVValueLen
	}
	for _, p := range puts {
		if len(p.GetValue()) > maxKVValueLenV2 {
			return fmt.Errorf("%w: value is %d bytes, the limit is %d (cluster version %d; version 3 raises it to %d)", ErrInvalid, len(p.GetValue()), maxKVValueLenV2, s.ClusterVersion(), MaxKVValueLen)
		}
	}
	return nil
}
