package etcdcompat

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// putRev puts key with etcdctl and returns the revision of the put.
func putRev(t *testing.T, ep, key, value string) int64 {
	t.Helper()
	var out struct {
		Header struct {
			Revision int64 `json:"revision"`
		} `json:"header"`
	}
	if err := json.Unmarshal([]byte(etcdctl(t, ep, "", "put", key, value, "-w", "json")), &out); err != nil || out.Header.Revision == 0 {
		t.Fatalf("put %s -w json: %v %+v", key, err, out)
	}
	return out.Header.Revision
}

// TestEtcdctlHistory: etcdctl get --rev reads a key as it was after it
// changed; etcdctl compaction compacts, after which get --rev below the
// compaction and a watch from before it answer "compacted", as etcd does.
func TestEtcdctlHistory(t *testing.T) {
	ep := startTenure(t).Etcd
	waitHistory(t, client(t, ep))
	r1 := putRev(t, ep, "hist", "one")
	r2 := putRev(t, ep, "hist", "two")
	putRev(t, ep, "other", "x")
	if got := lines(etcdctl(t, ep, "", "get", "hist", fmt.Sprintf("--rev=%d", r1))); strings.Join(got, "|") != "hist|one" {
		t.Fatalf("get --rev=%d: %q", r1, got)
	}
	if got := lines(etcdctl(t, ep, "", "get", "hist", "--rev", strconv.FormatInt(r2, 10), "--print-value-only")); strings.Join(got, "|") != "two" {
		t.Fatalf("get --rev %d: %q", r2, got)
	}
	if out := etcdctl(t, ep, "", "compaction", strconv.FormatInt(r2, 10), "--physical"); !strings.Contains(out, fmt.Sprintf("compacted revision %d", r2)) {
		t.Fatalf("compaction: %q", out)
	}
	out, errOut, err := etcdctlRun(ep, "", "get", "hist", fmt.Sprintf("--rev=%d", r1))
	if err == nil || !strings.Contains(errOut, "required revision has been compacted") {
		t.Fatalf("get --rev=%d after the compaction: %v %q %q", r1, err, out, errOut)
	}
	out, errOut, err = etcdctlRun(ep, "", "compaction", strconv.FormatInt(r2, 10))
	if err == nil || !strings.Contains(errOut, "required revision has been compacted") {
		t.Fatalf("compaction again: %v %q %q", err, out, errOut)
	}
	if got := lines(etcdctl(t, ep, "", "get", "hist", fmt.Sprintf("--rev=%d", r2))); strings.Join(got, "|") != "hist|two" {
		t.Fatalf("get --rev=%d at the compaction: %q", r2, got)
	}
	// A watch from before the compaction is cancelled: etcdctl says so
	// and exits.
	out, errOut, err = etcdctlRun(ep, "", "watch", "hist", fmt.Sprintf("--rev=%d", r1))
	if !strings.Contains(out+errOut, "compacted") {
		t.Fatalf("watch --rev=%d: %v %q %q", r1, err, out, errOut)
	}
}

// TestEtcdctlEndpointHashKV: etcdctl endpoint hashkv --cluster answers
// the same hash from the three members of a cluster at one revision.
func TestEtcdctlEndpointHashKV(t *testing.T) {
	ns := startCluster(t, 3)
	eps := strings.Join(etcdEndpoints(ns), ",")
	cli := client(t, etcdEndpoints(ns)...)
	waitHistory(t, cli)
	waitFor(t, 30*time.Second, "writes through every member (the leader publishes its etcd address first)", func() bool {
		for _, ep := range etcdEndpoints(ns) {
			if _, _, err := etcdctlRun(ep, "", "put", "hk/probe", "x"); err != nil {
				return false
			}
		}
		return true
	})
	var rev int64
	for i := range 10 {
		rev = putRev(t, eps, fmt.Sprint("hk/", i%3), fmt.Sprint(i))
	}
	type hashOut struct {
		Endpoint string
		HashKV   struct {
			Header struct {
				Revision int64 `json:"revision"`
			} `json:"header"`
			Hash            uint32 `json:"hash"`
			CompactRevision int64  `json:"compact_revision"`
			HashRevision    int64  `json:"hash_revision"`
		}
	}
	var got []hashOut
	waitFor(t, 30*time.Second, "every member's hash at the last put", func() bool {
		out, _, err := etcdctlRun(eps, "", "endpoint", "hashkv", "--rev", strconv.FormatInt(rev, 10), "-w", "json")
		got = nil
		return err == nil && json.Unmarshal([]byte(out), &got) == nil && len(got) == 3
	})
	for _, h := range got {
		if h.HashKV.Hash != got[0].HashKV.Hash || h.HashKV.HashRevision != rev || h.HashKV.CompactRevision != got[0].HashKV.CompactRevision || h.HashKV.Hash == 0 {
			t.Fatalf("endpoint hashkv --rev %d: %+v", rev, got)
		}
	}
	if out := etcdctl(t, eps, "", "endpoint", "hashkv", "-w", "table"); strings.Count(out, "127.0.0.1:") != 3 {
		t.Fatalf("endpoint hashkv table:\n%s", out)
	}
}
