package store

import (
	"io"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestTimeAppends: every append is timed, reads pass through, and the
// timed store is monotonic exactly when the engine's is (raft deletes the
// whole log after a restore only for a monotonic store).
func TestTimeAppends(t *testing.T) {
	for _, engine := range Engines {
		t.Run(engine, func(t *testing.T) {
			s, err := Open(t.TempDir(), engine, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var times []time.Duration
			log := TimeAppends(s.Log, func(d time.Duration) { times = append(times, d) })
			if err := log.StoreLog(&raft.Log{Index: 1, Term: 1, Data: []byte("a")}); err != nil {
				t.Fatal(err)
			}
			if err := log.StoreLogs([]*raft.Log{{Index: 2, Term: 1}, {Index: 3, Term: 1}}); err != nil {
				t.Fatal(err)
			}
			if len(times) != 2 || times[0] <= 0 {
				t.Fatalf("appends timed: %v", times)
			}
			var got raft.Log
			if err := log.GetLog(1, &got); err != nil || string(got.Data) != "a" {
				t.Fatalf("GetLog: %+v %v", got, err)
			}
			inner, _ := s.Log.(raft.MonotonicLogStore)
			want := inner != nil && inner.IsMonotonic()
			if got := log.(raft.MonotonicLogStore).IsMonotonic(); got != want || (engine == "wal") != want {
				t.Fatalf("IsMonotonic %v, the engine's %v", got, want)
			}
		})
	}
}
