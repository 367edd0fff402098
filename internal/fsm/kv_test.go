package fsm_test

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

func cmdKVPut(key, value string, session uint64) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_KvPut{KvPut: &fsmpb.KVPut{Key: key, Value: []byte(value), Session: session}}}
}

func cmdKVDelete(key string, prefix bool) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_KvDelete{KvDelete: &fsmpb.KVDelete{Key: key, Prefix: prefix}}}
}

func cmdKVTxn(t *fsmpb.KVTxn) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_KvTxn{KvTxn: t}}
}

func opPut(key, value string, session uint64) *fsmpb.KVOp {
	return &fsmpb.KVOp{Op: &fsmpb.KVOp_Put{Put: &fsmpb.KVPut{Key: key, Value: []byte(value), Session: session}}}
}

func opDelete(key string, prefix bool) *fsmpb.KVOp {
	return &fsmpb.KVOp{Op: &fsmpb.KVOp_Delete{Delete: &fsmpb.KVDelete{Key: key, Prefix: prefix}}}
}

func opRange(key string, prefix bool) *fsmpb.KVOp {
	return &fsmpb.KVOp{Op: &fsmpb.KVOp_Range{Range: &fsmpb.KVRange{Key: key, Prefix: prefix}}}
}

func apply(t *testing.T, st *fsm.State, cmd *fsmpb.Command) (fsm.Result, []fsm.Event) {
	t.Helper()
	var evs []fsm.Event
	r := st.Apply(cmd, func(e fsm.Event) { evs = append(evs, e) })
	return r, evs
}

func TestKVRevisionsAndVersions(t *testing.T) {
	st := fsm.NewState()
	r, evs := apply(t, st, cmdKVPut("a", "1", 0))
	if r.Err != nil || r.Revision != 1 || len(evs) != 1 || evs[0].Kind != fsm.EventKVPut || evs[0].Revision != 1 {
		t.Fatalf("first put: %+v %+v", r, evs)
	}
	apply(t, st, cmdKVPut("b", "x", 0)) // rev 2
	apply(t, st, cmdKVPut("a", "2", 0)) // rev 3
	kv, ok := st.KVGet("a")
	if want := (fsm.KV{Key: "a", Value: []byte("2"), CreateRevision: 1, ModRevision: 3, Version: 2}); !ok || !reflect.DeepEqual(kv, want) {
		t.Fatalf("a = %+v, want %+v", kv, want)
	}
	// Deleting nothing takes no revision and emits nothing.
	if r, evs := apply(t, st, cmdKVDelete("zzz", false)); r.Err != nil || r.Revision != 3 || r.KV.Deleted != 0 || len(evs) != 0 {
		t.Fatalf("delete of nothing: %+v %+v", r, evs)
	}
	if r, evs := apply(t, st, cmdKVDelete("a", false)); r.Revision != 4 || r.KV.Deleted != 1 || len(evs) != 1 || evs[0].Kind != fsm.EventKVDelete {
		t.Fatalf("delete: %+v %+v", r, evs)
	}
	// A re-created key starts over: new create revision, version 1.
	apply(t, st, cmdKVPut("a", "3", 0))
	if kv, _ := st.KVGet("a"); kv.CreateRevision != 5 || kv.Version != 1 {
		t.Fatalf("re-created a = %+v", kv)
	}
	for _, c := range []*fsmpb.Command{cmdKVPut("", "v", 0), cmdKVPut(strings.Repeat("k", fsm.MaxNameLen+1), "v", 0), cmdKVPut("k", strings.Repeat("v", fsm.MaxKVValueLen+1), 0)} {
		if r, _ := apply(t, st, c); !errors.Is(r.Err, fsm.ErrInvalid) {
			t.Fatalf("invalid put accepted: %+v", r)
		}
	}
}

func TestKVPrefixRangeAndDelete(t *testing.T) {
	st := fsm.NewState()
	for _, k := range []string{"a", "a/1", "a/2", "ab", "b"} {
		apply(t, st, cmdKVPut(k, k, 0))
	}
	keys := func(kvs []fsm.KV) (out []string) {
		for _, kv := range kvs {
			out = append(out, kv.Key)
		}
		return out
	}
	if kvs, more := st.KVRange("a/", true, 0); !reflect.DeepEqual(keys(kvs), []string{"a/1", "a/2"}) || more {
		t.Fatalf("range a/: %v %v", keys(kvs), more)
	}
	if kvs, more := st.KVRange("a", true, 2); !reflect.DeepEqual(keys(kvs), []string{"a", "a/1"}) || !more {
		t.Fatalf("range a limit 2: %v %v", keys(kvs), more)
	}
	r, evs := apply(t, st, cmdKVDelete("a", true))
	if r.KV.Deleted != 4 || r.Revision != 6 || len(evs) != 4 {
		t.Fatalf("delete prefix: %+v %+v", r, evs)
	}
	for i, k := range []string{"a", "a/1", "a/2", "ab"} { // key order, one revision
		if evs[i].KV.Key != k || evs[i].Revision != 6 {
			t.Fatalf("event %d: %+v", i, evs[i])
		}
	}
	if kvs, _ := st.KVRange("", true, 0); !reflect.DeepEqual(keys(kvs), []string{"b"}) {
		t.Fatalf("left: %v", keys(kvs))
	}
}

func TestKVTxn(t *testing.T) {
	st := fsm.NewState()
	sess := mustSession(t, st)                // rev 1
	apply(t, st, cmdKVPut("lock", "me", 0))   // rev 2
	apply(t, st, cmdKVPut("counter", "1", 0)) // rev 3
	cas := func(expect string, n int) *fsmpb.KVTxn {
		return &fsmpb.KVTxn{
			Compares: []*fsmpb.KVCompare{{Key: "counter", Target: fsm.CompareValue, Result: fsm.CompareEqual, Value: []byte(expect)}},
			Success:  []*fsmpb.KVOp{opPut("counter", "2", 0), opPut("other", "x", 0), opRange("counter", false)},
			Failure:  []*fsmpb.KVOp{opRange("counter", false)},
		}
	}
	r, evs := apply(t, st, cmdKVTxn(cas("1", 0)))
	if r.Err != nil || !r.KV.Succeeded || r.Revision != 4 || len(evs) != 2 || evs[0].Revision != 4 || evs[1].Revision != 4 {
		t.Fatalf("txn: %+v %+v", r, evs)
	}
	// A range after a put in the same transaction sees it.
	if got := r.KV.Ops[2].Range; len(got) != 1 || string(got[0].Value) != "2" || got[0].ModRevision != 4 {
		t.Fatalf("range in txn: %+v", got)
	}
	// The compare fails now: the else branch, no revision.
	if r, evs := apply(t, st, cmdKVTxn(cas("1", 0))); r.Err != nil || r.KV.Succeeded || r.Revision != 4 || len(evs) != 0 || string(r.KV.Ops[0].Range[0].Value) != "2" {
		t.Fatalf("failed compare: %+v %+v", r, evs)
	}
	// Compares on version, revisions and absence (version 0).
	for _, c := range []struct {
		cmp  *fsmpb.KVCompare
		want bool
	}{
		{&fsmpb.KVCompare{Key: "counter", Target: fsm.CompareVersion, Result: fsm.CompareEqual, Number: 2}, true},
		{&fsmpb.KVCompare{Key: "counter", Target: fsm.CompareModRevision, Result: fsm.CompareGreater, Number: 3}, true},
		{&fsmpb.KVCompare{Key: "counter", Target: fsm.CompareCreateRevision, Result: fsm.CompareLess, Number: 3}, false},
		{&fsmpb.KVCompare{Key: "counter", Target: fsm.CompareCreateRevision, Result: fsm.CompareNotEqual, Number: 3}, false},
		{&fsmpb.KVCompare{Key: "missing", Target: fsm.CompareVersion, Result: fsm.CompareEqual, Number: 0}, true},
		{&fsmpb.KVCompare{Key: "missing", Target: fsm.CompareValue, Result: fsm.CompareNotEqual, Value: []byte("x")}, false},
		{&fsmpb.KVCompare{Key: "lock", Target: fsm.CompareValue, Result: fsm.CompareGreater, Value: []byte("ma")}, true},
	} {
		r, _ := apply(t, st, cmdKVTxn(&fsmpb.KVTxn{Compares: []*fsmpb.KVCompare{c.cmp}}))
		if r.Err != nil || r.KV.Succeeded != c.want {
			t.Errorf("%v: %+v, want succeeded=%v", c.cmp, r, c.want)
		}
	}
	// All or nothing: an ephemeral put naming a dead session refuses the
	// whole branch, including the writes before it.
	before := exportBytes(t, st)
	r, evs = apply(t, st, cmdKVTxn(&fsmpb.KVTxn{Success: []*fsmpb.KVOp{opPut("x", "1", 0), opDelete("lock", false), opPut("y", "1", 999)}}))
	if !errors.Is(r.Err, fsm.ErrSessionNotFound) || len(evs) != 0 || !bytes.Equal(before, exportBytes(t, st)) {
		t.Fatalf("txn with a dead session: %+v %+v", r, evs)
	}
	// Invalid args in the branch not taken are refused too.
	if r, _ := apply(t, st, cmdKVTxn(&fsmpb.KVTxn{Failure: []*fsmpb.KVOp{opPut("", "1", 0)}})); !errors.Is(r.Err, fsm.ErrInvalid) {
		t.Fatalf("invalid else branch: %+v", r)
	}
	_ = sess
}

func mustSession(t *testing.T, st *fsm.State) uint64 {
	t.Helper()
	r, _ := apply(t, st, cmdCreate("o", 10_000))
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	return r.Session
}

func TestKVEphemeralKeys(t *testing.T) {
	st := fsm.NewState()
	s1 := mustSession(t, st)
	s2 := mustSession(t, st)
	apply(t, st, cmdKVPut("svc/b", "1", s1))
	apply(t, st, cmdKVPut("svc/a", "1", s1))
	apply(t, st, cmdKVPut("svc/c", "1", s2))
	apply(t, st, cmdKVPut("keep", "1", s1))
	apply(t, st, cmdKVPut("keep", "2", 0)) // a put without a session makes it persistent
	if r, _ := apply(t, st, cmdKVPut("x", "1", 12345)); !errors.Is(r.Err, fsm.ErrSessionNotFound) {
		t.Fatalf("put bound to a dead session: %+v", r)
	}
	// Survives a snapshot round trip.
	st2, err := fsm.Import(st.Export())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*fsm.State{st, st2} {
		rev := s.Revision()
		_, evs := apply(t, s, cmdExpire(s1))
		var dels []string
		for _, e := range evs {
			if e.Kind == fsm.EventKVDelete {
				dels = append(dels, e.KV.Key)
				if e.Revision != rev+2 { // the session's end, then the deletions
					t.Fatalf("deletion at %d, want %d", e.Revision, rev+2)
				}
			}
		}
		if !reflect.DeepEqual(dels, []string{"svc/a", "svc/b"}) {
			t.Fatalf("deleted %v", dels)
		}
		if kvs, _ := s.KVRange("", true, 0); len(kvs) != 2 || kvs[0].Key != "keep" || kvs[1].Key != "svc/c" {
			t.Fatalf("left %+v", kvs)
		}
	}
	if !bytes.Equal(exportBytes(t, st), exportBytes(t, st2)) {
		t.Fatal("restored copy diverged")
	}
}

// The property test drives the key-value store with random puts (some
// ephemeral), deletes, prefix deletes, transactions and session ends, and
// checks after every step against a plain map model:
//   - the state equals the model (values, create/mod revisions, versions);
//   - a command that changes keys takes exactly one new revision, carried
//     by every write; one that changes nothing takes none;
//   - a transaction is all or nothing;
//   - a session's end deletes exactly its ephemeral keys;
//   - replaying the events alone rebuilds the state (the event sequence is
//     the committed history, which is what watchers receive);
//   - a copy restored from a snapshot taken before the step reaches the same
//     state, results and events.

var (
	kvPropKeys     = []string{"a", "a/1", "a/2", "ab", "b"}
	kvPropPrefixes = []string{"", "a", "a/", "b", "z"}
	kvPropValues   = []string{"", "x", "y"}
)

type kvModel struct {
	st       *fsm.State
	keys     map[string]fsm.KV
	live     []uint64
	replay   map[string]fsm.KV // built from the events only
	eventRev uint64            // revision of the last event
}

func (m *kvModel) drawSession(t *rapid.T) uint64 {
	choices := append([]uint64{0, 0, 999}, m.live...)
	return rapid.SampledFrom(choices).Draw(t, "session")
}

func (m *kvModel) drawOp(t *rapid.T) *fsmpb.KVOp {
	switch rapid.IntRange(0, 3).Draw(t, "opKind") {
	case 0, 1:
		return opPut(rapid.SampledFrom(kvPropKeys).Draw(t, "key"), rapid.SampledFrom(kvPropValues).Draw(t, "value"), m.drawSession(t))
	case 2:
		if rapid.Bool().Draw(t, "prefix") {
			return opDelete(rapid.SampledFrom(kvPropPrefixes).Draw(t, "prefix"), true)
		}
		return opDelete(rapid.SampledFrom(kvPropKeys).Draw(t, "key"), false)
	}
	return opRange(rapid.SampledFrom(kvPropPrefixes).Draw(t, "prefix"), true)
}

func (m *kvModel) drawCompare(t *rapid.T) *fsmpb.KVCompare {
	return &fsmpb.KVCompare{
		Key:    rapid.SampledFrom(kvPropKeys).Draw(t, "key"),
		Target: uint32(rapid.IntRange(fsm.CompareValue, fsm.CompareModRevision).Draw(t, "target")),
		Result: uint32(rapid.IntRange(fsm.CompareEqual, fsm.CompareLess).Draw(t, "result")),
		Value:  []byte(rapid.SampledFrom(kvPropValues).Draw(t, "value")),
		Number: rapid.Uint64Range(0, m.st.Revision()+1).Draw(t, "number"),
	}
}

// model: what cmd must do to keys, computed independently of the state.
func (m *kvModel) expect(cmd *fsmpb.Command) (keys map[string]fsm.KV, succeeded, writes bool, err error) {
	keys = make(map[string]fsm.KV, len(m.keys))
	for k, v := range m.keys {
		keys[k] = v
	}
	rev := m.st.Revision() + 1
	alive := func(s uint64) bool {
		if s == 0 {
			return true
		}
		for _, l := range m.live {
			if l == s {
				return true
			}
		}
		return false
	}
	put := func(p *fsmpb.KVPut) {
		kv := fsm.KV{Key: p.GetKey(), Value: p.GetValue(), CreateRevision: rev, ModRevision: rev, Version: 1, Session: p.GetSession()}
		if old, ok := keys[p.GetKey()]; ok {
			kv.CreateRevision, kv.Version = old.CreateRevision, old.Version+1
		}
		keys[kv.Key] = kv
		writes = true
	}
	del := func(d *fsmpb.KVDelete) {
		for k := range keys {
			if k == d.GetKey() || (d.GetPrefix() && strings.HasPrefix(k, d.GetKey())) {
				delete(keys, k)
				writes = true
			}
		}
	}
	switch op := cmd.GetOp().(type) {
	case *fsmpb.Command_KvPut:
		if !alive(op.KvPut.GetSession()) {
			return m.keys, false, false, fsm.ErrSessionNotFound
		}
		put(op.KvPut)
	case *fsmpb.Command_KvDelete:
		del(op.KvDelete)
	case *fsmpb.Command_KvTxn:
		succeeded = true
		for _, c := range op.KvTxn.GetCompares() {
			kv, found := m.keys[c.GetKey()]
			var cmp int
			switch c.GetTarget() {
			case fsm.CompareValue:
				if !found {
					succeeded = false
					continue
				}
				cmp = bytes.Compare(kv.Value, c.GetValue())
			case fsm.CompareVersion:
				cmp = cmpU(kv.Version, c.GetNumber())
			case fsm.CompareCreateRevision:
				cmp = cmpU(kv.CreateRevision, c.GetNumber())
			case fsm.CompareModRevision:
				cmp = cmpU(kv.ModRevision, c.GetNumber())
			}
			holds := map[uint32]bool{fsm.CompareEqual: cmp == 0, fsm.CompareNotEqual: cmp != 0, fsm.CompareGreater: cmp > 0, fsm.CompareLess: cmp < 0}[c.GetResult()]
			succeeded = succeeded && holds
		}
		ops := op.KvTxn.GetSuccess()
		if !succeeded {
			ops = op.KvTxn.GetFailure()
		}
		for _, o := range ops {
			if p := o.GetPut(); p != nil && !alive(p.GetSession()) {
				return m.keys, false, false, fsm.ErrSessionNotFound
			}
		}
		for _, o := range ops {
			if p := o.GetPut(); p != nil {
				put(p)
			} else if d := o.GetDelete(); d != nil {
				del(d)
			}
		}
	case *fsmpb.Command_ExpireSession:
		rev++ // the session's end takes one revision, its keys the next
		for k, kv := range keys {
			if kv.Session == op.ExpireSession.GetSession() {
				delete(keys, k)
				writes = true
			}
		}
	}
	return keys, succeeded, writes, nil
}

func cmpU(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (m *kvModel) step(t *rapid.T, cmd *fsmpb.Command) {
	beforeRev := m.st.Revision()
	wantKeys, wantOK, writes, wantErr := m.expect(cmd)
	restored, err := fsm.Import(roundTrip(t, m.st.Export()))
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	var evs, evs2 []fsm.Event
	r := m.st.Apply(cmd, func(e fsm.Event) { evs = append(evs, e) })
	r2 := restored.Apply(cmd, func(e fsm.Event) { evs2 = append(evs2, e) })
	if !sameResult(r, r2) || !reflect.DeepEqual(evs, evs2) || !bytes.Equal(exportBytes(t, m.st), exportBytes(t, restored)) {
		t.Fatalf("%v: the copy restored from a snapshot diverged", cmd)
	}
	if !errors.Is(r.Err, wantErr) || (wantErr == nil && r.Err != nil) {
		t.Fatalf("%v: error %v, want %v", cmd, r.Err, wantErr)
	}
	if _, isTxn := cmd.GetOp().(*fsmpb.Command_KvTxn); isTxn && r.Err == nil && r.KV.Succeeded != wantOK {
		t.Fatalf("%v: succeeded %v, want %v", cmd, r.KV.Succeeded, wantOK)
	}
	// Exactly one revision for a command that wrote keys (two for a
	// session end with keys: its own and its deletions'), none otherwise.
	_, isEnd := cmd.GetOp().(*fsmpb.Command_ExpireSession)
	wantRev := beforeRev
	if isEnd {
		wantRev++
	}
	if writes {
		wantRev++
	}
	if r.Revision != wantRev {
		t.Fatalf("%v: revision %d, want %d", cmd, r.Revision, wantRev)
	}
	got := map[string]fsm.KV{}
	kvs, _ := m.st.KVRange("", true, 0)
	for _, kv := range kvs {
		got[kv.Key] = kv
	}
	if !reflect.DeepEqual(normal(got), normal(wantKeys)) {
		t.Fatalf("%v: keys\n got %+v\nwant %+v", cmd, got, wantKeys)
	}
	if m.st.KVCount() != len(wantKeys) {
		t.Fatalf("count %d, want %d", m.st.KVCount(), len(wantKeys))
	}
	// Events: in revision order, each a write of this command, and
	// replaying them rebuilds the state.
	for _, e := range evs {
		switch e.Kind {
		case fsm.EventKVPut:
			m.replay[e.KV.Key] = *e.KV
		case fsm.EventKVDelete:
			delete(m.replay, e.KV.Key)
		default:
			continue
		}
		if e.Revision < m.eventRev || e.Revision <= beforeRev || e.Revision > r.Revision || e.KV.ModRevision != e.Revision {
			t.Fatalf("%v: event %+v out of order (last %d, before %d, after %d)", cmd, e, m.eventRev, beforeRev, r.Revision)
		}
		m.eventRev = e.Revision
	}
	if !reflect.DeepEqual(normal(m.replay), normal(got)) {
		t.Fatalf("%v: replaying the events gives\n%+v\nnot\n%+v", cmd, m.replay, got)
	}
	m.keys = got
	if isEnd && r.Err == nil {
		gone := cmd.GetExpireSession().GetSession()
		for i, s := range m.live {
			if s == gone {
				m.live = append(m.live[:i], m.live[i+1:]...)
				break
			}
		}
	}
}

// normal makes nil and empty values equal.
func normal(m map[string]fsm.KV) map[string]fsm.KV {
	out := make(map[string]fsm.KV, len(m))
	for k, v := range m {
		if len(v.Value) == 0 {
			v.Value = nil
		}
		out[k] = v
	}
	return out
}

func roundTrip(t *rapid.T, snap *fsmpb.Snapshot) *fsmpb.Snapshot {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	out := &fsmpb.Snapshot{}
	if err := proto.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestKVProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := &kvModel{st: fsm.NewState(), keys: map[string]fsm.KV{}, replay: map[string]fsm.KV{}}
		actions := map[string]func(*rapid.T){
			"CreateSession": func(t *rapid.T) {
				if len(m.live) >= 3 {
					return
				}
				r := m.st.Apply(cmdCreate("o", 10_000), nil)
				m.live = append(m.live, r.Session)
			},
			"EndSession": func(t *rapid.T) {
				if len(m.live) == 0 {
					return
				}
				m.step(t, cmdExpire(rapid.SampledFrom(m.live).Draw(t, "victim")))
			},
			"Put": func(t *rapid.T) {
				m.step(t, cmdKVPut(rapid.SampledFrom(kvPropKeys).Draw(t, "key"), rapid.SampledFrom(kvPropValues).Draw(t, "value"), m.drawSession(t)))
			},
			"Delete": func(t *rapid.T) {
				m.step(t, cmdKVDelete(rapid.SampledFrom(kvPropKeys).Draw(t, "key"), false))
			},
			"DeletePrefix": func(t *rapid.T) {
				m.step(t, cmdKVDelete(rapid.SampledFrom(kvPropPrefixes).Draw(t, "prefix"), true))
			},
			"Txn": func(t *rapid.T) {
				txn := &fsmpb.KVTxn{}
				for range rapid.IntRange(0, 2).Draw(t, "compares") {
					txn.Compares = append(txn.Compares, m.drawCompare(t))
				}
				for range rapid.IntRange(0, 3).Draw(t, "success") {
					txn.Success = append(txn.Success, m.drawOp(t))
				}
				for range rapid.IntRange(0, 2).Draw(t, "failure") {
					txn.Failure = append(txn.Failure, m.drawOp(t))
				}
				m.step(t, cmdKVTxn(txn))
			},
		}
		t.Repeat(actions)
		// Sorted keys are what a prefix range returns.
		kvs, _ := m.st.KVRange("", true, 0)
		if !sort.SliceIsSorted(kvs, func(i, j int) bool { return kvs[i].Key < kvs[j].Key }) {
			t.Fatal("range not in key order")
		}
	})
}

// TestKVSnapshotIsolatedFromLaterApplies: the snapshot clones the key
// tree copy-on-write and serialises it in Persist, after Apply has gone
// on overwriting and deleting keys; what it writes is the state at
// Snapshot.
func TestKVSnapshotIsolatedFromLaterApplies(t *testing.T) {
	f := fsm.New(nil)
	var logs []*raft.Log
	add := func(cmd *fsmpb.Command) { logs = append(logs, logOf(t, uint64(len(logs)+1), cmd)) }
	add(cmdCreate("o", 10_000)) // session 1
	for i := range 500 {        // a tree of many nodes
		sess := uint64(0)
		if i%7 == 0 {
			sess = 1
		}
		add(cmdKVPut(fmt.Sprintf("k%03d", i), fmt.Sprint("v", i), sess))
	}
	f.ApplyBatch(logs)
	want := fsmExport(t, f)
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Release()
	var later []*raft.Log
	for i := range 500 {
		cmd := cmdKVPut(fmt.Sprintf("k%03d", i), "changed", 0)
		if i%3 == 0 {
			cmd = cmdKVDelete(fmt.Sprintf("k%03d", i), false)
		}
		later = append(later, logOf(t, uint64(len(logs)+len(later)+1), cmd))
	}
	later = append(later, logOf(t, uint64(len(logs)+len(later)+1), cmdKVPut("new", "x", 0)), logOf(t, uint64(len(logs)+len(later)+2), cmdExpire(1)))
	f.ApplyBatch(later)

	g := restored(t, snap)
	if !bytes.Equal(fsmExport(t, g), want) {
		t.Fatal("the snapshot saw applies made after it was taken")
	}
	g.ApplyBatch(later)
	if !bytes.Equal(fsmExport(t, g), fsmExport(t, f)) {
		t.Fatal("restored FSM diverged after the same entries")
	}
}
