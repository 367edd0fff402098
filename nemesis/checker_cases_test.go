//go:build linux || darwin

package nemesis

import (
	"slices"
	"testing"
	"time"
)

// TestChecker runs the checker on small hand-written histories: a correct
// one, and one for each violation it must catch.
func TestChecker(t *testing.T) {
	const ms = int64(time.Millisecond)
	const key = "r"
	grant := func(client string, token uint64, inv, comp int64) Op {
		return Op{Client: client, Kind: kindAcquire, Key: "l", Invoke: inv * ms, Complete: comp * ms, Outcome: outOK, Token: token}
	}
	put := func(client, value string, token uint64, inv, comp int64, outcome string, rev, result uint64) Op {
		o := Op{Client: client, Kind: kindPut, Key: key, Invoke: inv * ms, Complete: comp * ms, Outcome: outcome,
			Token: token, Value: value, OpID: value, Revision: rev, ResultToken: result}
		if outcome == outUnknown {
			o.Complete = never
		}
		return o
	}
	get := func(client, value string, token uint64, inv, comp int64) Op {
		return Op{Client: client, Kind: kindGet, Key: key, Invoke: inv * ms, Complete: comp * ms, Outcome: outOK, Value: value, Token: token, Found: value != ""}
	}
	final := func(value string, token, rev uint64, inv int64) Op {
		return Op{Client: "final", Kind: kindFinalGet, Key: key, Invoke: inv * ms, Complete: (inv + 1) * ms, Outcome: outOK, Value: value, Token: token, Found: true, Revision: rev}
	}
	// a holds token 10 and writes; b gets 12 and writes; a's late write
	// with 10 is refused.
	clean := []Op{
		grant("a", 10, 0, 1),
		get("a", "", 0, 2, 3),
		put("a", "a1", 10, 4, 5, outAccepted, 11, 10),
		grant("b", 12, 2, 6),
		get("b", "a1", 10, 7, 8),
		put("b", "b1", 12, 9, 10, outAccepted, 13, 12),
		put("a", "a2", 10, 11, 12, outStale, 0, 12),
		final("b1", 12, 13, 20),
	}
	with := func(base []Op, i int, o Op) []Op {
		out := slices.Clone(base)
		if i < 0 {
			return append(out, o)
		}
		out[i] = o
		return out
	}
	restart := []Fault{{Kind: faultRestartAll, Start: 13 * ms, End: 15 * ms}}

	cases := []struct {
		name   string
		ops    []Op
		faults []Fault
		want   []string // checks that must report; nil: none may
	}{
		{name: "correct", ops: clean},
		{name: "correct with a restart", ops: with(clean, -1, grant("c", 20, 16, 17)), faults: restart},
		{name: "unknown write that took effect", ops: with(with(clean, 6, put("a", "a2", 14, 11, 0, outUnknown, 0, 0)), 7, final("a2", 14, 15, 20))},
		{name: "unknown write that did not", ops: with(clean, 6, put("a", "a2", 14, 11, 0, outUnknown, 0, 0))},
		{
			name: "stale write accepted",
			ops:  with(with(clean, 6, put("a", "a2", 10, 11, 12, outAccepted, 14, 10)), 7, final("a2", 10, 14, 20)),
			want: []string{checkRegisterOrder, checkLinearizable},
		},
		{
			name: "token granted twice",
			ops:  with(clean, 3, grant("b", 10, 2, 6)),
			want: []string{checkTokenUnique, checkTokenOrder},
		},
		{
			name: "token not above one granted earlier",
			ops:  with(clean, -1, grant("c", 11, 7, 8)),
			want: []string{checkTokenOrder},
		},
		{
			name:   "token reused after a restart",
			ops:    with(clean, -1, grant("c", 9, 16, 17)),
			faults: restart,
			want:   []string{checkTokenOrder, checkTokenFault},
		},
		{
			name: "final value is not the last write",
			ops:  with(clean, 7, final("a1", 10, 11, 20)),
			want: []string{checkFinal, checkLinearizable},
		},
		{
			name: "stale read",
			ops:  with(clean, -1, get("c", "a1", 10, 14, 15)),
			want: []string{checkLinearizable},
		},
		{
			name: "stale answer with a lower register token",
			ops:  with(clean, 6, put("a", "a2", 10, 11, 12, outStale, 0, 9)),
			want: []string{checkRegisterStale, checkLinearizable},
		},
		{
			name: "value never written",
			ops:  with(clean, 7, final("zz", 12, 13, 20)),
			want: []string{checkFinal, checkLinearizable},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := check(tc.ops, tc.faults, []string{key}, "", 10*time.Second)
			got := r.byCheck()
			for _, c := range tc.want {
				if got[c] == 0 {
					t.Errorf("check %s reported nothing", c)
				}
			}
			for c := range got {
				if !slices.Contains(tc.want, c) {
					t.Errorf("unexpected anomaly from %s", c)
				}
			}
			if t.Failed() {
				for _, a := range r.anomalies {
					t.Logf("[%s] %s", a.Check, a.Msg)
				}
			}
		})
	}
}
