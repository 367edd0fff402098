package etcdapi

import (
	"testing"
	"time"
)

func TestParseAutoCompaction(t *testing.T) {
	cases := []struct {
		mode, retention string
		want            AutoCompaction
		bad             bool
	}{
		{"periodic", "0", AutoCompaction{}, false},
		{"periodic", "1h", AutoCompaction{Mode: "periodic", Period: time.Hour}, false},
		{"periodic", "72", AutoCompaction{Mode: "periodic", Period: 72 * time.Hour}, false},
		{"periodic", "0.5", AutoCompaction{Mode: "periodic", Period: 30 * time.Minute}, false},
		{"revision", "1000", AutoCompaction{Mode: "revision", Revisions: 1000}, false},
		{"revision", "0", AutoCompaction{}, false},
		{"revision", "1h", AutoCompaction{}, true},
		{"periodic", "soon", AutoCompaction{}, true},
		{"hourly", "1", AutoCompaction{}, true},
	}
	for _, c := range cases {
		got, err := ParseAutoCompaction(c.mode, c.retention)
		if (err != nil) != c.bad || got != c.want {
			t.Errorf("%s %s: %+v %v", c.mode, c.retention, got, err)
		}
	}
}

// TestCompactorPolicies: etcd's policies, driven by the time given. The
// periodic mode keeps the last period (compacting to the revision sampled
// a period ago, every period, at most every hour); the revision mode keeps
// the last N revisions, every 5 minutes.
func TestCompactorPolicies(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	p := &compactor{policy: AutoCompaction{Mode: CompactionPeriodic, Period: 10 * time.Minute}}
	step := p.policy.interval()
	if step != time.Minute {
		t.Fatalf("periodic interval %s", step)
	}
	var compacted []uint64
	for i := range 31 { // one revision per second
		now := t0.Add(time.Duration(i) * step)
		if rev, ok := p.tick(now, uint64(100+60*i)); ok {
			compacted = append(compacted, rev)
		}
	}
	// At minutes 10, 20 and 30: the revision of minutes 0, 10 and 20.
	if len(compacted) != 3 || compacted[0] != 100 || compacted[1] != 700 || compacted[2] != 1300 {
		t.Fatalf("periodic compactions %v", compacted)
	}
	p.reset()
	if _, ok := p.tick(t0.Add(time.Hour), 5000); ok {
		t.Fatal("compacted at once after a reset (a new leader)")
	}

	r := &compactor{policy: AutoCompaction{Mode: CompactionRevision, Revisions: 1000}}
	compacted = nil
	for i := range 12 { // a minute apart
		if rev, ok := r.tick(t0.Add(time.Duration(i)*time.Minute), uint64(500+i*500)); ok {
			compacted = append(compacted, rev)
		}
	}
	// At minutes 5 and 10: the revision 1000 before the current.
	if len(compacted) != 2 || compacted[0] != 2000 || compacted[1] != 4500 {
		t.Fatalf("revision compactions %v", compacted)
	}
}
