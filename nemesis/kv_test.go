//go:build linux || darwin

package nemesis

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/store"
)

// TestNemesisKV drives puts, linearizable gets and compare-and-swap
// transactions on a few keys of a 3-node cluster while the nemesis kills
// the leader or a follower, partitions nodes and restarts the whole
// cluster; then it checks that each key's history is linearizable
// (porcupine). Every client talks to one node at a time and never retries
// a write on its own: a write whose answer was lost is recorded with an
// unknown outcome (it may take effect at any point after its call, or
// never). It runs once on each raft log engine: a kill -9 in the middle of
// an append and a follower cutting its log's tail on rejoining are where
// an engine's crash safety shows.
func TestNemesisKV(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) { nemesisKV(t, engine) })
	}
}

func nemesisKV(t *testing.T, logStore string) {
	const (
		keys     = 4
		clients  = 2 // per key
		workload = 12 * time.Second
		// Short histories with think time keep the check decidable in
		// seconds even with writes of unknown outcome in them.
		checkTimeout = 15 * time.Second
	)
	c := startCluster(t, clusterConfig{n: 3, logStore: logStore})
	rec := newRecorder()
	seed := *flagSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	eps := strings.Split(c.eps, ",")

	var mu sync.Mutex
	var ops []kvOp
	wctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	for k := range keys {
		key := fmt.Sprint("nemesis-kv-", k)
		for i := range clients {
			w := &kvWorker{id: fmt.Sprintf("kv%d.%d", k, i), cid: k*clients + i, key: key, eps: eps, rnd: rand.New(rand.NewPCG(seed, uint64(1000+10*k+i))), rec: rec}
			wg.Go(func() {
				got := w.run(wctx)
				mu.Lock()
				ops = append(ops, got...)
				mu.Unlock()
			})
		}
	}
	nm := &nemesis{c: c, rec: rec, rnd: rand.New(rand.NewPCG(seed, 1<<33)), logf: t.Logf}
	schedule := []string{faultKillLeader, faultPartLeader, faultRestartAll, faultKillFollower, faultOneWay}
	nctx, cancel := context.WithTimeout(context.Background(), workload-3*time.Second)
	if err := nm.run(nctx, schedule, len(schedule)); err != nil {
		t.Errorf("nemesis: %v", err)
	}
	cancel()
	pace(context.Background(), 2*time.Second) // fault-free tail
	stop()
	wg.Wait()
	_, faults := rec.snapshot()

	byKey := make(map[string][]kvOp)
	counts := make(map[string]int)
	for _, o := range ops {
		byKey[o.key] = append(byKey[o.key], o)
		counts[o.kind+"/"+o.outcome()]++
	}
	t.Logf("seed %d; %d faults; operations %v", seed, len(faults), counts)
	if counts["put/ok"]+counts["cas/ok"] == 0 || counts["get/ok"] == 0 {
		t.Fatalf("the workload did not run: %v", counts)
	}
	if len(faults) == 0 {
		t.Errorf("no fault was injected")
	}
	decided := 0
	for _, key := range slices.Sorted(maps.Keys(byKey)) {
		hist := byKey[key]
		var po []porcupine.Operation
		for _, o := range hist {
			ret := o.complete
			if o.unknown {
				ret = math.MaxInt64
			}
			po = append(po, porcupine.Operation{ClientId: o.client, Input: o, Call: o.invoke, Output: o, Return: ret})
		}
		switch porcupine.CheckOperationsTimeout(kvModel, po, checkTimeout) {
		case porcupine.Ok:
			decided++
			t.Logf("%s: linearizable (%d ops)", key, len(po))
		case porcupine.Illegal:
			decided++
			t.Errorf("%s: the history of %d puts, gets and CAS is not linearizable", key, len(po))
		default:
			t.Logf("%s: linearizability undecided within %v (%d ops)", key, checkTimeout, len(po))
		}
	}
	if decided == 0 {
		t.Errorf("no key's history could be decided within %v: the check proved nothing", checkTimeout)
	}
}

// kvOp is one recorded operation: input and output together.
type kvOp struct {
	client           int
	kind             string // put, get, cas
	key              string
	value            string // put, cas: the value written; get: the value read
	expect           string // cas: the value compared
	found            bool   // get
	ok               bool   // cas: succeeded
	unknown          bool   // a write whose answer was lost
	invoke, complete int64
}

func (o kvOp) outcome() string {
	switch {
	case o.unknown:
		return "unknown"
	case o.kind == "cas" && !o.ok:
		return "failed"
	}
	return "ok"
}

type kvState struct {
	value string
	found bool
}

// kvModel is one key: put sets it, get reads it, cas sets it only when it
// holds the expected value (a missing key holds nothing).
var kvModel = porcupine.Model{
	Init: func() interface{} { return kvState{} },
	Step: func(state, input, _ interface{}) (bool, interface{}) {
		s, o := state.(kvState), input.(kvOp)
		switch o.kind {
		case "put":
			return true, kvState{value: o.value, found: true}
		case "get":
			return o.found == s.found && o.value == s.value, s
		}
		holds := s.found && s.value == o.expect
		if o.unknown {
			if holds {
				return true, kvState{value: o.value, found: true}
			}
			return true, s
		}
		if o.ok != holds {
			return false, s
		}
		if holds {
			return true, kvState{value: o.value, found: true}
		}
		return true, s
	},
	DescribeOperation: func(input, _ interface{}) string {
		o := input.(kvOp)
		switch o.kind {
		case "get":
			return fmt.Sprintf("get → %q (found %v)", o.value, o.found)
		case "put":
			return fmt.Sprintf("put %q (%s)", o.value, o.outcome())
		}
		return fmt.Sprintf("cas %q → %q (%s)", o.expect, o.value, o.outcome())
	},
}

type kvWorker struct {
	id   string
	cid  int
	key  string
	eps  []string
	rnd  *rand.Rand
	rec  *recorder
	seq  int
	cur  int
	conn *client.Client
}

// run performs operations until ctx ends; it returns what it recorded.
func (w *kvWorker) run(ctx context.Context) []kvOp {
	var out []kvOp
	cid := w.cid
	last := "" // the last value this worker saw or wrote
	defer func() {
		if w.conn != nil {
			w.conn.Close()
		}
	}()
	for ctx.Err() == nil {
		if w.conn == nil {
			c, err := dialClient(ctx, w.eps[w.cur%len(w.eps)])
			if err != nil {
				return out
			}
			w.conn = c
		}
		// Send only to a node that believes it leads: a write refused by a
		// follower, or sent into an election, would only add outcomes
		// the checker must treat as unknown.
		sctx, scancel := context.WithTimeout(ctx, time.Second)
		st, err := w.conn.Status(sctx)
		scancel()
		if err != nil || st.GetLeader() != st.GetNode() {
			w.conn.Close()
			w.conn = nil
			w.cur++
			pace(ctx, 50*time.Millisecond)
			continue
		}
		w.seq++
		v := fmt.Sprintf("%s-%d", w.id, w.seq)
		op := kvOp{client: cid, key: w.key, invoke: w.rec.now()}
		octx, cancel := context.WithTimeout(ctx, 2*time.Second)
		switch r := w.rnd.IntN(10); {
		case r < 3:
			op.kind, op.value = "put", v
			_, err = w.conn.Put(octx, w.key, []byte(v))
		case r < 7:
			op.kind = "get"
			var res client.RangeResult
			res, err = w.conn.Get(octx, w.key)
			if err == nil && len(res.KVs) == 1 {
				op.found, op.value = true, string(res.KVs[0].Value)
				last = op.value
			}
		default:
			op.kind, op.value, op.expect = "cas", v, last
			var res client.TxnResult
			res, err = w.conn.Txn(octx, []client.Compare{client.ValueIs(w.key, client.Equal, []byte(last))}, []client.Op{client.OpPut(w.key, []byte(v))}, nil)
			op.ok = err == nil && res.Succeeded
		}
		cancel()
		op.complete = w.rec.now()
		if err != nil {
			if op.kind == "get" || errors.Is(err, client.ErrInvalid) {
				// A failed read tells nothing; move to another node.
			} else {
				op.unknown = true
				out = append(out, op)
			}
			w.conn.Close()
			w.conn = nil
			w.cur++
			pace(ctx, 50*time.Millisecond)
			continue
		}
		if op.kind != "get" && (op.kind == "put" || op.ok) {
			last = v
		}
		out = append(out, op)
		pace(ctx, time.Duration(40+w.rnd.IntN(80))*time.Millisecond)
	}
	return out
}

// TestKVModelCatchesAnomalies: the KV checker rejects a stale read, a CAS
// that succeeded against the wrong value and a lost write, and accepts
// writes of unknown outcome taking effect late or never.
func TestKVModelCatchesAnomalies(t *testing.T) {
	op := func(client int, kind, value, expect string, found, ok, unknown bool, call, ret int64) porcupine.Operation {
		o := kvOp{client: client, kind: kind, value: value, expect: expect, found: found, ok: ok, unknown: unknown}
		if unknown {
			ret = math.MaxInt64
		}
		return porcupine.Operation{ClientId: client, Input: o, Call: call, Output: o, Return: ret}
	}
	for _, tc := range []struct {
		name string
		hist []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"stale read", []porcupine.Operation{
			op(0, "put", "a", "", false, false, false, 0, 1),
			op(0, "put", "b", "", false, false, false, 2, 3),
			op(1, "get", "a", "", true, false, false, 4, 5),
		}, porcupine.Illegal},
		{"CAS against the wrong value", []porcupine.Operation{
			op(0, "put", "a", "", false, false, false, 0, 1),
			op(1, "cas", "c", "b", false, true, false, 2, 3),
		}, porcupine.Illegal},
		{"lost write", []porcupine.Operation{
			op(0, "put", "a", "", false, false, false, 0, 1),
			op(1, "get", "", "", false, false, false, 2, 3),
		}, porcupine.Illegal},
		{"unknown write taking effect late", []porcupine.Operation{
			op(0, "put", "a", "", false, false, true, 0, 1),
			op(1, "get", "", "", false, false, false, 2, 3),
			op(1, "get", "a", "", true, false, false, 4, 5),
		}, porcupine.Ok},
		{"concurrent CAS, one wins", []porcupine.Operation{
			op(0, "put", "a", "", false, false, false, 0, 1),
			op(1, "cas", "b", "a", false, true, false, 2, 5),
			op(2, "cas", "c", "a", false, false, false, 3, 4),
			op(0, "get", "b", "", true, false, false, 6, 7),
		}, porcupine.Ok},
	} {
		if got := porcupine.CheckOperationsTimeout(kvModel, tc.hist, 5*time.Second); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
