package etcdcompat

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// kvOp is one recorded operation of the fault test: input and output.
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

type kvState struct {
	value string
	found bool
}

// kvModel is one key: put sets it, get reads it, cas sets it only when it
// holds the expected value (a missing key holds nothing); a write of
// unknown outcome may take effect or not.
var kvModel = porcupine.Model{
	Init: func() any { return kvState{} },
	Step: func(state, input, _ any) (bool, any) {
		s, o := state.(kvState), input.(kvOp)
		switch o.kind {
		case "put":
			return true, kvState{value: o.value, found: true}
		case "get":
			return o.found == s.found && o.value == s.value, s
		}
		holds := s.found && s.value == o.expect
		if !o.unknown && o.ok != holds {
			return false, s
		}
		if holds {
			return true, kvState{value: o.value, found: true}
		}
		return true, s
	},
}

// restart starts a killed member again, on its data directory.
func (m *node) restart(t *testing.T) {
	t.Helper()
	m.p = startProc(t, "", m.p.cmd.Path, m.p.cmd.Args[1:]...)
}

// TestFaultsKVLinearizable is the KV fault test through clientv3: puts,
// linearizable gets and compare-and-swap transactions on a few keys of a
// 3-node cluster, every client given every endpoint (a follower forwards
// to the leader), while the leader and a follower are killed with SIGKILL
// and restarted, and paused with SIGSTOP. Each key's history must be
// linearizable (porcupine). A write whose answer was lost is recorded
// with an unknown outcome; nothing is retried.
func TestFaultsKVLinearizable(t *testing.T) {
	const (
		keys         = 3
		workers      = 2 // per key
		checkTimeout = 20 * time.Second
	)
	ns := startCluster(t, 3)
	ctx := tctx(t)
	start := time.Now()
	now := func() int64 { return time.Since(start).Nanoseconds() }
	seed := uint64(time.Now().UnixNano())

	var (
		mu  sync.Mutex
		ops []kvOp
		wg  sync.WaitGroup
	)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	for k := range keys {
		key := fmt.Sprint("fault/", k)
		for i := range workers {
			cid := k*workers + i
			cli := client(t, etcdEndpoints(ns)...)
			rnd := rand.New(rand.NewPCG(seed, uint64(cid)))
			wg.Go(func() {
				var mine []kvOp
				last := ""
				for seq := 0; wctx.Err() == nil; seq++ {
					v := fmt.Sprintf("c%d-%d", cid, seq)
					op := kvOp{client: cid, key: key, invoke: now()}
					octx, cancel := context.WithTimeout(wctx, 2*time.Second)
					var err error
					switch r := rnd.IntN(10); {
					case r < 3:
						op.kind, op.value = "put", v
						_, err = cli.Put(octx, key, v)
					case r < 7:
						op.kind = "get"
						var g *clientv3.GetResponse
						if g, err = cli.Get(octx, key); err == nil && len(g.Kvs) == 1 {
							op.found, op.value = true, string(g.Kvs[0].Value)
							last = op.value
						}
					default:
						op.kind, op.value, op.expect = "cas", v, last
						var tr *clientv3.TxnResponse
						tr, err = cli.Txn(octx).If(clientv3.Compare(clientv3.Value(key), "=", last)).Then(clientv3.OpPut(key, v)).Commit()
						op.ok = err == nil && tr.Succeeded
					}
					cancel()
					op.complete = now()
					switch {
					case err != nil && op.kind == "get":
						// A failed read tells nothing.
					case err != nil:
						op.unknown = true
						mine = append(mine, op)
					default:
						if op.kind == "put" || op.ok {
							last = v
						}
						mine = append(mine, op)
					}
					select {
					case <-wctx.Done():
					case <-time.After(time.Duration(20+rnd.IntN(60)) * time.Millisecond):
					}
				}
				mu.Lock()
				ops = append(ops, mine...)
				mu.Unlock()
			})
		}
	}

	// The faults, one after another, each healed before the next.
	pause := func(d time.Duration) {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	signal := func(m *node, sig syscall.Signal) {
		if err := syscall.Kill(-m.p.cmd.Process.Pid, sig); err != nil {
			t.Fatal(err)
		}
	}
	follower := func(leader *node) *node {
		for _, m := range ns {
			if m != leader {
				return m
			}
		}
		return nil
	}
	pause(time.Second)
	for i, fault := range []string{"kill leader", "pause follower", "kill follower", "pause leader"} {
		leader := leaderNode(t, ctx, ns)
		victim := leader
		if strings.Contains(fault, "follower") {
			victim = follower(leader)
		}
		t.Logf("fault %d: %s (%s)", i, fault, victim.id)
		if strings.HasPrefix(fault, "kill") {
			signal(victim, syscall.SIGKILL)
			<-victim.p.done
			pause(1500 * time.Millisecond)
			victim.restart(t)
		} else {
			signal(victim, syscall.SIGSTOP)
			pause(1500 * time.Millisecond)
			signal(victim, syscall.SIGCONT)
		}
		pause(1500 * time.Millisecond)
	}
	pause(time.Second) // a fault-free tail
	stop()
	wg.Wait()

	byKey := map[string][]porcupine.Operation{}
	counts := map[string]int{}
	for _, o := range ops {
		ret := o.complete
		if o.unknown {
			ret = math.MaxInt64
		}
		byKey[o.key] = append(byKey[o.key], porcupine.Operation{ClientId: o.client, Input: o, Call: o.invoke, Output: o, Return: ret})
		outcome := "ok"
		switch {
		case o.unknown:
			outcome = "unknown"
		case o.kind == "cas" && !o.ok:
			outcome = "failed"
		}
		counts[o.kind+"/"+outcome]++
	}
	t.Logf("seed %d; operations %v", seed, counts)
	if counts["put/ok"]+counts["cas/ok"] == 0 || counts["get/ok"] == 0 {
		t.Fatalf("the workload did not run: %v", counts)
	}
	var names []string
	for k := range byKey {
		names = append(names, k)
	}
	sort.Strings(names)
	decided := 0
	for _, key := range names {
		switch porcupine.CheckOperationsTimeout(kvModel, byKey[key], checkTimeout) {
		case porcupine.Ok:
			decided++
			t.Logf("%s: linearizable (%d ops)", key, len(byKey[key]))
		case porcupine.Illegal:
			decided++
			t.Errorf("%s: the history of %d puts, gets and CAS through clientv3 is not linearizable", key, len(byKey[key]))
		default:
			t.Logf("%s: undecided within %v (%d ops)", key, checkTimeout, len(byKey[key]))
		}
	}
	if decided == 0 {
		t.Errorf("no key's history could be decided within %v", checkTimeout)
	}
}

// TestKVModelCatchesAnomalies: the fault test's checker rejects a stale
// read, a CAS that succeeded against the wrong value and a lost write,
// and accepts a write of unknown outcome taking effect late.
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
		{"stale read", []porcupine.Operation{op(0, "put", "a", "", false, false, false, 0, 1), op(0, "put", "b", "", false, false, false, 2, 3), op(1, "get", "a", "", true, false, false, 4, 5)}, porcupine.Illegal},
		{"CAS against the wrong value", []porcupine.Operation{op(0, "put", "a", "", false, false, false, 0, 1), op(1, "cas", "c", "b", false, true, false, 2, 3)}, porcupine.Illegal},
		{"lost write", []porcupine.Operation{op(0, "put", "a", "", false, false, false, 0, 1), op(1, "get", "", "", false, false, false, 2, 3)}, porcupine.Illegal},
		{"unknown write taking effect late", []porcupine.Operation{op(0, "put", "a", "", false, false, true, 0, 1), op(1, "get", "", "", false, false, false, 2, 3), op(1, "get", "a", "", true, false, false, 4, 5)}, porcupine.Ok},
	} {
		if got := porcupine.CheckOperationsTimeout(kvModel, tc.hist, 5*time.Second); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
