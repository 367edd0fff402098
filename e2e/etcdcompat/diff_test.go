package etcdcompat

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/status"
)

// startEtcd runs a single-node etcd 3.7.3 (built from bench/etcd) on free
// loopback ports, with its defaults.
func startEtcd(t *testing.T) string {
	t.Helper()
	client, peer := freeAddr(t), freeAddr(t)
	startProc(t, "", filepath.Join(bin, "etcd-server"), "--name", "diff", "--data-dir", t.TempDir(),
		"--listen-client-urls", "http://"+client, "--advertise-client-urls", "http://"+client,
		"--listen-peer-urls", "http://"+peer, "--initial-advertise-peer-urls", "http://"+peer,
		"--initial-cluster", "diff=http://"+peer, "--initial-cluster-state", "new", "--log-level", "error")
	waitFor(t, 30*time.Second, "etcd healthy", func() bool {
		r, err := http.Get("http://" + client + "/health")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == 200
	})
	return client
}

// recorder runs the workload against one server and writes down what it
// answers, with the revisions and lease ids replaced by what is the same
// on both: a revision by the number of key changes up to it (Tenure's
// revision also counts lease grants and other state), a lease by the
// order it was granted in.
type recorder struct {
	cli    *clientv3.Client
	writes []int64 // revisions of the changes of keys, in order
	leases map[clientv3.LeaseID]string
	lids   []clientv3.LeaseID
	out    []string
}

func (r *recorder) wrote(rev int64) { r.writes = append(r.writes, rev) }

// rev renders revision v as the number of key changes at or before it.
func (r *recorder) rev(v int64) string {
	if v == 0 {
		return "0"
	}
	return fmt.Sprint(sort.Search(len(r.writes), func(i int) bool { return r.writes[i] > v }))
}

func (r *recorder) lease(id int64) string {
	if id == 0 {
		return "-"
	}
	if s, ok := r.leases[clientv3.LeaseID(id)]; ok {
		return s
	}
	return "unknown"
}

func (r *recorder) kv(kv *mvccpb.KeyValue) string {
	if kv == nil {
		return "nil"
	}
	return fmt.Sprintf("%s=%q c%s m%s v%d l%s", kv.Key, kv.Value, r.rev(kv.CreateRevision), r.rev(kv.ModRevision), kv.Version, r.lease(kv.Lease))
}

func (r *recorder) kvs(kvs []*mvccpb.KeyValue) string {
	var s []string
	for _, kv := range kvs {
		s = append(s, r.kv(kv))
	}
	return "[" + strings.Join(s, ", ") + "]"
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	if st, ok := status.FromError(err); ok {
		return fmt.Sprintf(" ERR %s %s", st.Code(), st.Message())
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return fmt.Sprintf(" ERR %s %s", ee.Code(), ee.Error())
	}
	return " ERR " + err.Error()
}

func (r *recorder) log(f string, a ...any) { r.out = append(r.out, fmt.Sprintf(f, a...)) }

// step is one request of the workload.
type step func(ctx context.Context, r *recorder)

func put(key, val string, opts ...clientv3.OpOption) step {
	return func(ctx context.Context, r *recorder) {
		resp, err := r.cli.Put(ctx, key, val, opts...)
		if err != nil {
			r.log("put %s%s", key, errText(err))
			return
		}
		r.wrote(resp.Header.Revision)
		r.log("put %s rev %s prev %s", key, r.rev(resp.Header.Revision), r.kv(resp.PrevKv))
	}
}

func putLease(key, val string, lease int, opts ...clientv3.OpOption) step {
	return func(ctx context.Context, r *recorder) {
		put(key, val, append(opts, clientv3.WithLease(r.lids[lease]))...)(ctx, r)
	}
}

func get(key string, opts ...clientv3.OpOption) step {
	return getAt(key, func(*recorder) []clientv3.OpOption { return opts })
}

// at is the revision of the n-th change of a key (from 1): the same
// point of the workload on both servers, whatever else each counts in its
// revisions (Tenure's first key need not be at revision 2, as etcd's is).
func (r *recorder) at(n int) int64 { return r.writes[n-1] }

// getAt is get with options that name revisions through the recorder.
func getAt(key string, opts func(*recorder) []clientv3.OpOption) step {
	return func(ctx context.Context, r *recorder) {
		resp, err := r.cli.Get(ctx, key, opts(r)...)
		if err != nil {
			r.log("get %s%s", key, errText(err))
			return
		}
		r.log("get %s rev %s count %d more %v %s", key, r.rev(resp.Header.Revision), resp.Count, resp.More, r.kvs(resp.Kvs))
	}
}

func del(key string, opts ...clientv3.OpOption) step {
	return func(ctx context.Context, r *recorder) {
		resp, err := r.cli.Delete(ctx, key, opts...)
		if err != nil {
			r.log("del %s%s", key, errText(err))
			return
		}
		if resp.Deleted > 0 {
			r.wrote(resp.Header.Revision)
		}
		r.log("del %s rev %s deleted %d prev %s", key, r.rev(resp.Header.Revision), resp.Deleted, r.kvs(resp.PrevKvs))
	}
}

func txn(cmps []clientv3.Cmp, then, els []clientv3.Op) step {
	return func(ctx context.Context, r *recorder) {
		resp, err := r.cli.Txn(ctx).If(cmps...).Then(then...).Else(els...).Commit()
		if err != nil {
			r.log("txn%s", errText(err))
			return
		}
		ops := then
		if !resp.Succeeded {
			ops = els
		}
		wrote := false
		for i, op := range ops {
			if op.IsPut() || (op.IsDelete() && resp.Responses[i].GetResponseDeleteRange().Deleted > 0) {
				wrote = true
			}
		}
		if wrote {
			r.wrote(resp.Header.Revision)
		}
		s := fmt.Sprintf("txn rev %s succeeded %v", r.rev(resp.Header.Revision), resp.Succeeded)
		for _, o := range resp.Responses {
			switch {
			case o.GetResponseRange() != nil:
				g := o.GetResponseRange()
				s += fmt.Sprintf(" | range rev %s count %d more %v %s", r.rev(g.Header.Revision), g.Count, g.More, r.kvs(g.Kvs))
			case o.GetResponsePut() != nil:
				p := o.GetResponsePut()
				s += fmt.Sprintf(" | put rev %s prev %s", r.rev(p.Header.Revision), r.kv(p.PrevKv))
			case o.GetResponseDeleteRange() != nil:
				d := o.GetResponseDeleteRange()
				s += fmt.Sprintf(" | del rev %s deleted %d prev %s", r.rev(d.Header.Revision), d.Deleted, r.kvs(d.PrevKvs))
			}
		}
		r.log("%s", s)
	}
}

func grant(ttl int64) step {
	return func(ctx context.Context, r *recorder) {
		resp, err := r.cli.Grant(ctx, ttl)
		if err != nil {
			r.log("grant %d%s", ttl, errText(err))
			return
		}
		r.lids = append(r.lids, resp.ID)
		r.leases[resp.ID] = fmt.Sprintf("L%d", len(r.lids))
		r.log("grant %d: %s ttl %d", ttl, r.lease(int64(resp.ID)), resp.TTL)
	}
}

func timeToLive(lease int, keys bool) step {
	return func(ctx context.Context, r *recorder) {
		var opts []clientv3.LeaseOption
		if keys {
			opts = append(opts, clientv3.WithAttachedKeys())
		}
		resp, err := r.cli.TimeToLive(ctx, r.lids[lease], opts...)
		if err != nil {
			r.log("timetolive%s", errText(err))
			return
		}
		var ks []string
		for _, k := range resp.Keys {
			ks = append(ks, string(k))
		}
		slices.Sort(ks) // etcd lists them in its map's order, which varies
		// The seconds left depend on timing: only whether any are.
		r.log("timetolive %s granted %d left>0 %v keys %v", r.lease(int64(resp.ID)), resp.GrantedTTL, resp.TTL > 0, ks)
	}
}

func keepAliveOnce(lease int) step {
	return func(ctx context.Context, r *recorder) {
		resp, err := r.cli.KeepAliveOnce(ctx, r.lids[lease])
		if err != nil {
			r.log("keepalive%s", errText(err))
			return
		}
		r.log("keepalive %s ttl %d", r.lease(int64(resp.ID)), resp.TTL)
	}
}

func revoke(lease int, keys int) step {
	return func(ctx context.Context, r *recorder) {
		resp, err := r.cli.Revoke(ctx, r.lids[lease])
		if err != nil {
			r.log("revoke%s", errText(err))
			return
		}
		if keys > 0 {
			r.wrote(resp.Header.Revision)
		}
		r.log("revoke rev %s", r.rev(resp.Header.Revision))
	}
}

func leases() step {
	return func(ctx context.Context, r *recorder) {
		resp, err := r.cli.Leases(ctx)
		if err != nil {
			r.log("leases%s", errText(err))
			return
		}
		var ls []string
		for _, l := range resp.Leases {
			ls = append(ls, r.lease(int64(l.ID)))
		}
		sort.Strings(ls)
		r.log("leases %v", ls)
	}
}

// workload is the same sequence of requests for both servers.
func workload() []step {
	cmp := clientv3.Compare
	return []step{
		put("d/a", "1"), put("d/b", "2"), put("d/c", "3"), put("d/a", "4", clientv3.WithPrevKV()), put("e", "5"),
		get("d/a"), get("d/", clientv3.WithPrefix()), get("d/b", clientv3.WithFromKey()), get("", clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		get("d/", clientv3.WithPrefix(), clientv3.WithLimit(2)),
		get("d/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByValue, clientv3.SortDescend)),
		get("d/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortAscend), clientv3.WithLimit(1)),
		get("d/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByVersion, clientv3.SortDescend)),
		get("d/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend)),
		get("d/", clientv3.WithPrefix(), clientv3.WithCountOnly()),
		get("d/", clientv3.WithFirstCreate()...), get("d/", clientv3.WithLastCreate()...), get("d/", clientv3.WithLastKey()...),
		getAt("d/", func(r *recorder) []clientv3.OpOption {
			return []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithMinModRev(r.at(2))}
		}),
		getAt("d/", func(r *recorder) []clientv3.OpOption {
			return []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithMaxCreateRev(r.at(1)), clientv3.WithLimit(1)}
		}),
		get("d/", clientv3.WithPrefix(), clientv3.WithSerializable()),
		get("absent"), get("d/x", clientv3.WithRange("d/z")),
		get("d/a", clientv3.WithRev(100000)),
		put("", "x"), put("d/none", "", clientv3.WithIgnoreValue()), put("d/none", "x", clientv3.WithIgnoreLease()),
		grant(1), revoke(0, 0), grant(30), grant(9_000_000_001),
		putLease("l/1", "x", 1), putLease("l/2", "y", 1), put("l/3", "z", clientv3.WithLease(987654321)),
		put("l/1", "", clientv3.WithIgnoreValue()), get("l/", clientv3.WithPrefix()),
		put("l/2", "y2", clientv3.WithIgnoreLease()), get("l/2"),
		timeToLive(1, true), timeToLive(0, false), keepAliveOnce(1), keepAliveOnce(0), leases(),
		txn([]clientv3.Cmp{cmp(clientv3.Value("d/a"), "=", "4")}, []clientv3.Op{clientv3.OpPut("d/t", "t"), clientv3.OpGet("d/", clientv3.WithPrefix())}, nil),
		txn([]clientv3.Cmp{cmp(clientv3.Version("d/a"), ">", 5)}, nil, []clientv3.Op{clientv3.OpGet("d/a"), clientv3.OpDelete("d/b", clientv3.WithPrevKV()), clientv3.OpGet("d/", clientv3.WithPrefix(), clientv3.WithCountOnly())}),
		txn([]clientv3.Cmp{cmp(clientv3.CreateRevision("d/zz"), "=", 0), cmp(clientv3.ModRevision("d/a"), ">", 0)}, []clientv3.Op{clientv3.OpPut("d/zz", "z", clientv3.WithPrevKV())}, nil),
		txn([]clientv3.Cmp{cmp(clientv3.LeaseValue("l/1"), "!=", 0)}, []clientv3.Op{clientv3.OpGet("l/1")}, nil),
		txn([]clientv3.Cmp{cmp(clientv3.Value("d/").WithPrefix(), ">", "0")}, []clientv3.Op{clientv3.OpGet("d/c")}, nil),
		txn(nil, []clientv3.Op{clientv3.OpPut("dup", "1"), clientv3.OpPut("dup", "2")}, nil),
		txn(nil, []clientv3.Op{clientv3.OpDelete("d/", clientv3.WithPrefix()), clientv3.OpPut("d/q", "2")}, nil),
		txn(nil, []clientv3.Op{clientv3.OpDelete("zzz", clientv3.WithFromKey()), clientv3.OpPut("d/q", "2")}, nil),
		txn(nil, []clientv3.Op{clientv3.OpGet("d/a")}, nil),
		del("d/c", clientv3.WithPrevKV()), del("d/c"), del("d/", clientv3.WithPrefix(), clientv3.WithPrevKV()),
		revoke(1, 2), get("l/", clientv3.WithPrefix()), timeToLive(1, false), keepAliveOnce(1), revoke(1, 0), leases(),
		put("z", "last"), get("", clientv3.WithFromKey(), clientv3.WithKeysOnly()),
	}
}

// run runs the workload against endpoint, with a watch on "d/" and one
// on "l/" (prev_kv) open throughout, and returns the record.
func runWorkload(t *testing.T, endpoint string) []string {
	t.Helper()
	r := &recorder{cli: client(t, endpoint), leases: map[clientv3.LeaseID]string{}}
	ctx := tctx(t)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wd := r.cli.Watch(wctx, "d/", clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithCreatedNotify())
	wl := r.cli.Watch(wctx, "l/", clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	<-wd
	<-wl
	for _, s := range workload() {
		s(ctx, r)
	}
	// The watches saw every change; read up to the last revision.
	last := r.writes[len(r.writes)-1]
	// In a fixed order: both runs' logs are compared line by line.
	for _, watch := range []struct {
		name string
		w    clientv3.WatchChan
	}{{"watch d/", wd}, {"watch l/ (no puts)", wl}} {
		name, w := watch.name, watch.w
		waitDone := time.After(10 * time.Second)
		var evs []string
		for done := false; !done; {
			select {
			case resp := <-w:
				for _, ev := range resp.Events {
					evs = append(evs, fmt.Sprintf("%s %s prev %s", ev.Type, r.kv(ev.Kv), r.kv(ev.PrevKv)))
				}
				// A progress request tells when the watch has caught up.
				if resp.Header.Revision >= last && len(resp.Events) == 0 {
					done = true
				}
			case <-time.After(200 * time.Millisecond):
				_ = r.cli.RequestProgress(wctx)
			case <-waitDone:
				done = true
			}
		}
		r.log("%s: %s", name, strings.Join(evs, "; "))
	}
	return r.out
}

// TestDifferential runs the same workload against a real etcd 3.7.3 and
// against Tenure's etcd API, and compares every answer, modulo revision
// numbers and lease ids (see recorder).
func TestDifferential(t *testing.T) {
	etcdOut := runWorkload(t, startEtcd(t))
	tenureOut := runWorkload(t, startTenure(t).Etcd)
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
