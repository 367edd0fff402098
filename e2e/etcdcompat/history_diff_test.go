package etcdcompat

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// waitHistory waits until the server answers a read at a past revision
// (a Tenure cluster keeps its history window once the leader has raised
// the cluster version to 3, shortly after it starts; etcd at once). Its
// writes are not recorded: the workload's revisions count only its own.
func waitHistory(t *testing.T, cli *clientv3.Client) {
	t.Helper()
	ctx := tctx(t)
	waitFor(t, 30*time.Second, "reads at a past revision", func() bool {
		p, err := cli.Put(ctx, "probe", "1")
		if err != nil {
			return false
		}
		if _, err := cli.Put(ctx, "probe", "2"); err != nil {
			return false
		}
		r, err := cli.Get(ctx, "probe", clientv3.WithRev(p.Header.Revision))
		return err == nil && len(r.Kvs) == 1 && string(r.Kvs[0].Value) == "1"
	})
}

// at returns options that read at the revision of the n-th change.
func atRev(n int, more ...clientv3.OpOption) func(*recorder) []clientv3.OpOption {
	return func(r *recorder) []clientv3.OpOption {
		return append([]clientv3.OpOption{clientv3.WithRev(r.at(n))}, more...)
	}
}

func compact(n int, future bool) step {
	return func(ctx context.Context, r *recorder) {
		var rev int64
		if future {
			rev = r.writes[len(r.writes)-1] + 1000
		} else {
			rev = r.at(n)
		}
		_, err := r.cli.Compact(ctx, rev, clientv3.WithCompactPhysical())
		r.log("compact %d future %v:%s", n, future, errText(err))
	}
}

// txnGetAt is a transaction whose one op reads prefix at the n-th change.
func txnGetAt(prefix string, n int) step {
	return func(ctx context.Context, r *recorder) {
		txn(nil, []clientv3.Op{clientv3.OpGet(prefix, clientv3.WithPrefix(), clientv3.WithRev(r.at(n)))}, nil)(ctx, r)
	}
}

// watchAt watches prefix from the n-th change up to the last one and
// writes down its events, or its compaction.
func watchAt(prefix string, n int) step {
	return func(ctx context.Context, r *recorder) {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		w := r.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(r.at(n)), clientv3.WithPrevKV())
		last := r.writes[len(r.writes)-1]
		var evs []string
		for {
			select {
			case resp, ok := <-w:
				if !ok {
					r.log("watch %s from %d: closed after %s", prefix, n, strings.Join(evs, "; "))
					return
				}
				if resp.CompactRevision != 0 || resp.Canceled {
					r.log("watch %s from %d: compacted at %s canceled %v%s", prefix, n, r.rev(resp.CompactRevision), resp.Canceled, errText(resp.Err()))
					return
				}
				for _, ev := range resp.Events {
					evs = append(evs, fmt.Sprintf("%s %s prev %s", ev.Type, r.kv(ev.Kv), r.kv(ev.PrevKv)))
				}
				if resp.Header.Revision >= last && len(resp.Events) == 0 {
					r.log("watch %s from %d: %s", prefix, n, strings.Join(evs, "; "))
					return
				}
			case <-time.After(200 * time.Millisecond):
				_ = r.cli.RequestProgress(wctx)
			case <-wctx.Done():
				r.log("watch %s from %d: timed out after %s", prefix, n, strings.Join(evs, "; "))
				return
			}
		}
	}
}

// historyWorkload reads at past revisions and compacts.
func historyWorkload() []step {
	prefix := clientv3.WithPrefix()
	steps := []step{
		put("h/a", "1"), put("h/b", "1"), put("h/c", "1"), put("h/a", "2"), del("h/b"), put("h/b", "2"),
		txn(nil, []clientv3.Op{clientv3.OpPut("h/c", "2"), clientv3.OpPut("h/d", "1")}, nil), put("h/a", "3"),
	}
	for n := 1; n <= 8; n++ {
		steps = append(steps, getAt("h/", atRev(n, prefix)))
	}
	steps = append(steps,
		getAt("h/", atRev(3, prefix, clientv3.WithLimit(1))),
		getAt("h/", atRev(4, prefix, clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortDescend))),
		getAt("h/", atRev(6, prefix, clientv3.WithSort(clientv3.SortByVersion, clientv3.SortAscend), clientv3.WithLimit(2))),
		getAt("h/", atRev(5, prefix, clientv3.WithCountOnly())),
		getAt("h/", atRev(5, prefix, clientv3.WithKeysOnly())),
		getAt("h/", func(r *recorder) []clientv3.OpOption {
			return []clientv3.OpOption{prefix, clientv3.WithRev(r.at(6)), clientv3.WithMinModRev(r.at(2)), clientv3.WithMaxCreateRev(r.at(3))}
		}),
		getAt("h/b", atRev(5)), getAt("h/a", atRev(4, clientv3.WithSerializable())),
		getAt("h/", func(r *recorder) []clientv3.OpOption {
			return []clientv3.OpOption{prefix, clientv3.WithRev(r.writes[len(r.writes)-1] + 1000)}
		}),
		txnGetAt("h/", 3),
		watchAt("h/", 2),
		compact(4, false),
		getAt("h/", atRev(3, prefix)), getAt("h/", atRev(4, prefix)), getAt("h/", atRev(8, prefix)),
		txnGetAt("h/", 3), txnGetAt("h/", 5),
		compact(4, false), compact(2, false), compact(0, true),
		watchAt("h/", 2), watchAt("h/", 4),
		put("h/e", "1"), del("h/a", clientv3.WithPrevKV()), put("h/c", "3"),
		compact(10, false),
		getAt("h/", atRev(9, prefix)), getAt("h/", atRev(10, prefix)), getAt("h/", atRev(11, prefix)),
		watchAt("h/", 5), watchAt("h/", 10),
		// Deletes made exactly at the compact revision: etcd's compaction
		// keeps the index entry of a key's newest change at or before the
		// compact revision, a tombstone included (keyIndex.compact), so a
		// watch from that revision replays the deletes, without prev_kv
		// (the previous versions are compacted); the next compaction past
		// them drops them. A range delete of two keys, a lease's revoke,
		// and a key put again after its delete.
		put("h/f", "1"), put("h/g", "1"), del("h/f", clientv3.WithRange("h/h")), put("h/x", "1"), // 12..15
		compact(14, false),
		getAt("h/", atRev(14, prefix)), getAt("h/f", atRev(14, clientv3.WithRange("h/h"), clientv3.WithCountOnly())),
		watchAt("h/", 14), watchAt("h/x", 14),
		grant(60), putLease("h/l", "1", 0), revoke(0, 1), put("h/z", "1"), // 16..18
		compact(17, false),
		getAt("h/l", atRev(17)), watchAt("h/", 17),
		put("h/l", "2"), // 19
		compact(18, false),
		watchAt("h/", 18), getAt("h/", atRev(18, prefix, clientv3.WithKeysOnly())),
	)
	return steps
}

// TestDifferentialHistory runs the history workload against a real etcd
// 3.7.3 and against Tenure's etcd API and compares every answer, modulo
// revision numbers and lease ids (see recorder): reads at past revisions
// with the range options, a transaction's read at a revision, watches
// from past revisions, Compact and what it refuses afterwards.
func TestDifferentialHistory(t *testing.T) {
	run := func(endpoint string) []string {
		r := &recorder{cli: client(t, endpoint), leases: map[clientv3.LeaseID]string{}}
		waitHistory(t, r.cli)
		ctx := tctx(t)
		for _, s := range historyWorkload() {
			s(ctx, r)
		}
		return r.out
	}
	etcdOut := run(startEtcd(t))
	tenureOut := run(startTenure(t).Etcd)
	if len(etcdOut) != len(tenureOut) {
		t.Fatalf("%d answers from etcd, %d from Tenure", len(etcdOut), len(tenureOut))
	}
	bad := 0
	for i := range etcdOut {
		if etcdOut[i] != tenureOut[i] {
			t.Errorf("step %d:\n  etcd:   %s\n  tenure: %s", i, etcdOut[i], tenureOut[i])
			bad++
		}
	}
	if bad == 0 {
		t.Logf("%d answers, all equal:\n%s", len(etcdOut), strings.Join(etcdOut, "\n"))
	}
}
