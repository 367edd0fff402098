package fsm_test

import (
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

func cmdEtcdLease(ttlMs int64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: "etcd", TtlMs: ttlMs, EtcdLease: true}}}
}

func cmdKVPutOp(p *fsmpb.KVPut) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: p}}
}

// TestEtcdLeasesApartFromSessions: an etcd lease is a session without a
// secret, which the etcd API reaches by id (CheckEtcdLease) and Tenure's
// API cannot use (CheckSession); a Tenure session is never an etcd lease.
func TestEtcdLeasesApartFromSessions(t *testing.T) {
	st := fsm.NewState()
	r, _ := apply(t, st, cmdEtcdLease(fsm.MaxEtcdLeaseTTLMs))
	if r.Err != nil {
		t.Fatalf("an etcd lease of etcd's maximum TTL: %v", r.Err)
	}
	lease := r.Session
	native, _ := apply(t, st, cmdCreateSessionSecret("app", 10_000, []byte("secret")))
	if err := st.CheckEtcdLease(lease); err != nil {
		t.Fatal(err)
	}
	if err := st.CheckEtcdLease(native.Session); !errors.Is(err, fsm.ErrSessionNotFound) {
		t.Fatalf("a Tenure session as an etcd lease: %v", err)
	}
	if err := st.CheckSession(lease, []byte("anything")); !errors.Is(err, fsm.ErrPermissionDenied) {
		t.Fatalf("an etcd lease as a Tenure session: %v", err)
	}
	for _, c := range []struct {
		name string
		cmd  *fsmpb.Command
	}{
		{"a secret", &fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{TtlMs: 5000, EtcdLease: true, SecretHash: fsm.HashSecret([]byte("x"))}}}},
		{"a TTL above etcd's", cmdEtcdLease(fsm.MaxEtcdLeaseTTLMs + 1)},
		{"a Tenure session above 1h", cmdCreateSessionSecret("app", fsm.MaxSessionTTLMs+1, []byte("s"))},
	} {
		if r, _ := apply(t, st, c.cmd); !errors.Is(r.Err, fsm.ErrInvalid) {
			t.Fatalf("%s: %v", c.name, r.Err)
		}
	}
	if r, _ := apply(t, st, cmdKVPutOp(&fsmpb.KVPut{Key: "k", Lease: native.Session})); !errors.Is(r.Err, fsm.ErrSessionNotFound) {
		t.Fatalf("a key put with a Tenure session as its lease: %v", r.Err)
	}
	apply(t, st, cmdKVPutOp(&fsmpb.KVPut{Key: "k", Lease: lease}))
	apply(t, st, cmdKVPutOp(&fsmpb.KVPut{Key: "j", Lease: lease}))
	if got := st.SessionKeys(lease); !reflect.DeepEqual(got, []string{"j", "k"}) {
		t.Fatalf("keys of the lease: %v", got)
	}
	if got := st.EtcdLeases(); !reflect.DeepEqual(got, []uint64{lease}) {
		t.Fatalf("etcd leases: %v", got)
	}
	// A snapshot keeps what a lease is.
	back, err := fsm.Import(st.Export())
	if err != nil {
		t.Fatal(err)
	}
	if back.CheckEtcdLease(lease) != nil || back.CheckEtcdLease(native.Session) == nil || len(back.SessionKeys(lease)) != 2 {
		t.Fatal("the snapshot lost the lease's kind or keys")
	}
	// The lease's end deletes its keys, each delete event carrying the key
	// as it was.
	_, evs := apply(t, st, &fsmpb.Command{Op: &fsmpb.Command_CloseSession{CloseSession: &fsmpb.CloseSession{Session: lease}}})
	deleted := 0
	for _, e := range evs {
		if e.Kind == fsm.EventKVDelete {
			deleted++
			if e.Prev == nil || e.Prev.Session != lease || e.Prev.Key != e.KV.Key {
				t.Fatalf("delete event %+v prev %+v", e.KV, e.Prev)
			}
		}
	}
	if deleted != 2 || st.KVCount() != 0 {
		t.Fatalf("%d deletes, %d keys left", deleted, st.KVCount())
	}
}

// TestPutKeepsValueOrLease: ignore_value and ignore_lease keep what the
// key has, need the key, and the previous key comes back.
func TestPutKeepsValueOrLease(t *testing.T) {
	st := fsm.NewState()
	lease := applied(t, st, cmdEtcdLease(10_000)).Session
	r := applied(t, st, cmdKVPutOp(&fsmpb.KVPut{Key: "k", Value: []byte("v1"), Lease: lease}))
	if len(r.KV.Prev) != 0 {
		t.Fatalf("prev of a new key: %v", r.KV.Prev)
	}
	r, evs := apply(t, st, cmdKVPutOp(&fsmpb.KVPut{Key: "k", Value: []byte("v2"), IgnoreLease: true}))
	if r.Err != nil || len(r.KV.Prev) != 1 || string(r.KV.Prev[0].Value) != "v1" || evs[0].Prev == nil || string(evs[0].Prev.Value) != "v1" {
		t.Fatalf("prev %+v, event %+v", r, evs)
	}
	kv, _ := st.KVGet("k")
	if kv.Session != lease || string(kv.Value) != "v2" || kv.Version != 2 {
		t.Fatalf("ignore_lease: %+v", kv)
	}
	applied(t, st, cmdKVPutOp(&fsmpb.KVPut{Key: "k", IgnoreValue: true}))
	kv, _ = st.KVGet("k")
	if kv.Session != 0 || string(kv.Value) != "v2" || kv.Version != 3 || len(st.SessionKeys(lease)) != 0 {
		t.Fatalf("ignore_value: %+v", kv)
	}
	for _, p := range []*fsmpb.KVPut{{Key: "absent", IgnoreValue: true}, {Key: "absent", IgnoreLease: true}} {
		if r, _ := apply(t, st, cmdKVPutOp(p)); !errors.Is(r.Err, fsm.ErrKeyNotFound) {
			t.Fatalf("%v: %v", p, r.Err)
		}
	}
	for _, p := range []*fsmpb.KVPut{{Key: "k", IgnoreValue: true, Value: []byte("x")}, {Key: "k", IgnoreLease: true, Lease: lease}, {Key: "k", Session: lease, Lease: lease}} {
		if r, _ := apply(t, st, cmdKVPutOp(p)); !errors.Is(r.Err, fsm.ErrInvalid) {
			t.Fatalf("%v: %v", p, r.Err)
		}
	}
}

func applied(t *testing.T, st *fsm.State, cmd *fsmpb.Command) fsm.Result {
	t.Helper()
	r, _ := apply(t, st, cmd)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	return r
}

// TestRangeQueryInTxn: a range in a transaction answers what State.Range
// answers for the same query (one code path for reads and transactions),
// and a read-only transaction (ReadTxn) what applying it answers.
func TestRangeQueryInTxn(t *testing.T) {
	st := fsm.NewState()
	for i, k := range []string{"p/c", "p/a", "p/d", "p/b", "q"} {
		applied(t, st, cmdKVPut(k, fmt.Sprint(5-i), 0))
	}
	applied(t, st, cmdKVPut("p/a", "9", 0))
	queries := []fsm.RangeQuery{
		{Key: "p/", End: []byte("p0"), Count: true},
		{Key: "p/", End: []byte("p0"), Limit: 2, Count: true},
		{Key: "p/", End: []byte("p0"), Limit: 2},
		{Key: "p/", End: []byte("p0"), SortTarget: fsm.SortByCreate, SortOrder: fsm.SortDescend, Limit: 1, Count: true},
		{Key: "p/", End: []byte("p0"), SortTarget: fsm.SortByValue, Count: true, KeysOnly: true},
		{Key: "p/", End: []byte("p0"), MaxCreateRevision: 3, Count: true},
		{Key: "p/b", End: []byte{0}, MinModRevision: 4, Limit: 1, Count: true},
		{Key: "p/", End: []byte("p0"), CountOnly: true},
		{Key: "q"},
	}
	for i, q := range queries {
		want := st.Range(q)
		op := &fsmpb.KVRange{Key: q.Key, RangeEnd: q.End, Limit: q.Limit, SortOrder: q.SortOrder, SortTarget: q.SortTarget, KeysOnly: q.KeysOnly,
			CountOnly: q.CountOnly, MinModRevision: q.MinModRevision, MaxCreateRevision: q.MaxCreateRevision, Count: q.Count}
		txn := &fsmpb.KVTxn{Success: []*fsmpb.KVOp{{Op: &fsmpb.KVOp_Range{Range: op}}}}
		read, err := st.ReadTxn(txn)
		if err != nil {
			t.Fatal(err)
		}
		res := applied(t, st, cmdKVTxn(txn))
		for _, got := range []fsm.KVOpResult{read.Ops[0], res.KV.Ops[0]} {
			if !reflect.DeepEqual(got.Range, want.KVs) || got.More != want.More || got.Count != want.Count {
				t.Fatalf("query %d: txn %+v, Range %+v", i, got, want)
			}
		}
	}
	// The counts and limits are etcd's: the count ignores the limit.
	if a := st.Range(queries[1]); a.Count != 4 || len(a.KVs) != 2 || !a.More {
		t.Fatalf("limit 2 of 4: %+v", a)
	}
	if a := st.Range(queries[3]); a.KVs[0].Key != "p/b" {
		t.Fatalf("last created: %+v", a)
	}
	if _, err := st.ReadTxn(&fsmpb.KVTxn{Success: []*fsmpb.KVOp{opPut("x", "1", 0)}}); !errors.Is(err, fsm.ErrInvalid) {
		t.Fatalf("ReadTxn of a put: %v", err)
	}
}

func cmdCreateSessionSecret(owner string, ttlMs int64, secret []byte) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{Owner: owner, TtlMs: ttlMs, SecretHash: fsm.HashSecret(secret)}}}
}

// TestEtcdURLs: the members' etcd API addresses are replicated state,
// bounded, kept by snapshots, and a repeated address takes no revision.
func TestEtcdURLs(t *testing.T) {
	st := fsm.NewState()
	set := func(member, url string) *fsmpb.Command {
		return &fsmpb.Command{Op: &fsmpb.Command_SetEtcdUrl{SetEtcdUrl: &fsmpb.SetEtcdURL{Member: member, Url: url}}}
	}
	r := applied(t, st, set("n1", "http://127.0.0.1:2379"))
	if again := applied(t, st, set("n1", "http://127.0.0.1:2379")); again.Revision != r.Revision {
		t.Fatal("an unchanged address took a revision")
	}
	back, err := fsm.Import(st.Export())
	if err != nil || back.EtcdURL("n1") != "http://127.0.0.1:2379" {
		t.Fatalf("after a snapshot: %q %v", back.EtcdURL("n1"), err)
	}
	applied(t, st, set("n1", ""))
	if st.EtcdURL("n1") != "" {
		t.Fatal("the address was not removed")
	}
	for i := range fsm.MaxEtcdURLs {
		applied(t, st, set(fmt.Sprint("m", i), "http://x"))
	}
	if r, _ := apply(t, st, set("one-more", "http://x")); !errors.Is(r.Err, fsm.ErrLimit) {
		t.Fatalf("past the bound: %v", r.Err)
	}
}

// TestClientAddrs: the members' Tenure API addresses are replicated state,
// bounded, kept by snapshots, and never take a revision (a replica that
// does not know the command keeps the same revisions).
func TestClientAddrs(t *testing.T) {
	st := fsm.NewState()
	set := func(member, addr string) *fsmpb.Command {
		return &fsmpb.Command{Op: &fsmpb.Command_SetClientAddr{SetClientAddr: &fsmpb.SetEtcdURL{Member: member, Url: addr}}}
	}
	before := st.Revision()
	applied(t, st, set("n1", "127.0.0.1:7070"))
	applied(t, st, set("n1", "127.0.0.1:7071"))
	if st.Revision() != before || st.ClientAddr("n1") != "127.0.0.1:7071" {
		t.Fatalf("revision %d (was %d), address %q", st.Revision(), before, st.ClientAddr("n1"))
	}
	back, err := fsm.Import(st.Export())
	if err != nil || back.ClientAddr("n1") != "127.0.0.1:7071" {
		t.Fatalf("after a snapshot: %q %v", back.ClientAddr("n1"), err)
	}
	applied(t, st, set("n1", ""))
	if st.ClientAddr("n1") != "" {
		t.Fatal("an empty address did not remove the member's")
	}
	for i := range fsm.MaxClientAddrs {
		applied(t, st, set(fmt.Sprint("m", i), "127.0.0.1:1"))
	}
	if r := st.Apply(set("one-too-many", "127.0.0.1:1"), nil); !errors.Is(r.Err, fsm.ErrLimit) {
		t.Fatalf("past the bound: %v", r.Err)
	}
	if r := st.Apply(set("", "127.0.0.1:1"), nil); !errors.Is(r.Err, fsm.ErrInvalid) {
		t.Fatalf("no member: %v", r.Err)
	}
}
