package fsm_test

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"testing"

	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// The property test drives State with random command sequences over a few
// sessions, lock names and register keys, and keeps a small model of what the
// state must look like: the FIFO queue and holder of every lock, the live
// sessions, the highest token issued and each register's accepted token
// (kept after a fenced delete), whether it exists and its remembered
// operation ids. Fenced writes sometimes name a lock, or carry a token that
// was never issued. Every step is also applied to a copy of the state
// restored from a snapshot taken just before it.
//
// The default run (100 checks) takes about 10 s under -race. For a longer
// search: go test -run TestStateProperties ./internal/fsm/ -rapid.checks=5000
// A failure prints the seed and writes a fail file under testdata/rapid/
// that replays it.

var (
	propNames   = []string{"a", "b"}
	propKeys    = []string{"k1", "k2"}
	propOpIDs   = []string{"", "", "op1", "op2", "op3", "op4"}
	propDelays  = []int64{0, 1_000, 0, 5_000, 0, fsm.MaxLockDelayMs, 0, 1_000, 0, 0, -1, fsm.MaxLockDelayMs + 1}
	propTTLs    = []int64{fsm.MinSessionTTLMs, 10_000, 10_000, 10_000, fsm.MaxSessionTTLMs, fsm.MinSessionTTLMs - 1, fsm.MaxSessionTTLMs + 1}
	propValues  = []string{"", "x", "yy"}
	maxSessions = 5 // live sessions at once
)

// acq is one acquisition in the model.
type acq struct {
	session uint64
	acqRev  uint64
	token   uint64 // 0 while queued
}

type propModel struct {
	st *fsm.State

	created  []uint64        // every session id ever created, in order
	live     map[uint64]bool // sessions not yet ended
	ended    map[uint64]bool
	acqRevs  map[uint64][]uint64 // session -> acquire revisions it received
	tokens   []uint64            // every token issued, in order
	maxToken uint64
	queues   map[string][]acq                     // lock -> waiters in grant order
	holders  map[string]acq                       // lock -> holder
	regToken map[string]uint64                    // key -> token a write must reach
	regFound map[string]bool                      // key -> the register exists
	regLock  map[string]string                    // key -> the lock it is bound to
	regSeen  map[string]uint64                    // accepted token last seen by check
	regOps   map[string][]string                  // key -> remembered op ids, oldest first
	opResult map[string]map[string]fsm.PutOutcome // key -> op id -> first outcome
}

func newPropModel() *propModel {
	return &propModel{
		st:       fsm.NewState(),
		live:     make(map[uint64]bool),
		ended:    make(map[uint64]bool),
		acqRevs:  make(map[uint64][]uint64),
		queues:   make(map[string][]acq),
		holders:  make(map[string]acq),
		regToken: make(map[string]uint64),
		regFound: make(map[string]bool),
		regLock:  make(map[string]string),
		regSeen:  make(map[string]uint64),
		regOps:   make(map[string][]string),
		opResult: make(map[string]map[string]fsm.PutOutcome),
	}
}

// propRounds is how many random action sequences (of rapid's -rapid.steps,
// 30 on average) each check runs back to back; longer histories reach deeper
// queues and more hand-offs than rapid's default.
const propRounds = 4

func TestStateProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := newPropModel()
		for i, n := 0, rapid.IntRange(2, maxSessions).Draw(t, "initialSessions"); i < n; i++ {
			if r, _ := m.step(t, cmdCreate(fmt.Sprint("owner", i), 10_000)); r.Err != nil {
				t.Fatalf("create: %v", r.Err)
			}
		}
		// rapid picks actions uniformly by name: some appear more than once
		// so that sessions outlive a few steps and locks see contention.
		actions := map[string]func(*rapid.T){
			"CreateSession":    m.createSession,
			"CreateSession2":   m.createSession,
			"EndSession":       func(t *rapid.T) { m.endSession(t, rapid.Bool().Draw(t, "expire")) },
			"Acquire":          func(t *rapid.T) { m.acquire(t, rapid.Bool().Draw(t, "wait")) },
			"AcquireWait":      func(t *rapid.T) { m.acquire(t, true) },
			"AcquireWait2":     func(t *rapid.T) { m.acquire(t, true) },
			"ReleaseHolder":    m.releaseHolder,
			"ReleaseHolder2":   m.releaseHolder,
			"ReleaseAnyHandle": m.releaseAny,
			"CancelAcquire":    m.cancel,
			"EndLockDelay":     m.endLockDelay,
			"FencedPut":        func(t *rapid.T) { m.fencedWrite(t, false) },
			"FencedPut2":       func(t *rapid.T) { m.fencedWrite(t, false) },
			"FencedDelete":     func(t *rapid.T) { m.fencedWrite(t, true) },
			"":                 m.check,
		}
		for range propRounds {
			t.Repeat(actions)
		}
	})
}

// drawSession picks a live session most of the time, otherwise an ended or
// never-created id.
func (m *propModel) drawSession(t *rapid.T) uint64 {
	var live []uint64
	for _, id := range m.created {
		if m.live[id] {
			live = append(live, id)
		}
	}
	// rapid favours small numbers, so 0..7 (live) is the common case.
	if len(live) > 0 && rapid.IntRange(0, 9).Draw(t, "other") < 8 {
		return rapid.SampledFrom(live).Draw(t, "session")
	}
	return rapid.SampledFrom(append(slices.Clone(m.created), 1_000_000)).Draw(t, "session")
}

func (m *propModel) createSession(t *rapid.T) {
	if len(m.live) >= maxSessions {
		return // this action does not apply now: enough live sessions
	}
	ttl := rapid.SampledFrom(propTTLs).Draw(t, "ttl")
	r, _ := m.step(t, cmdCreate(fmt.Sprint("owner", len(m.created)), ttl))
	if (r.Err == nil) != (ttl >= fsm.MinSessionTTLMs && ttl <= fsm.MaxSessionTTLMs) {
		t.Fatalf("create with TTL %d: %v", ttl, r.Err)
	}
}

func (m *propModel) endSession(t *rapid.T, expire bool) {
	id := m.drawSession(t)
	cmd := cmdClose(id)
	batch := expire && rapid.Bool().Draw(t, "batch")
	switch {
	case batch:
		cmd = cmdExpireMany(id)
	case expire:
		cmd = cmdExpire(id)
	}
	want := m.live[id]
	r, _ := m.step(t, cmd)
	if batch {
		// A batch skips a session already gone: no error, none counted.
		if r.Err != nil || want != (r.Expired == 1) {
			t.Fatalf("expiry of session %d (live %v) in a batch: %+v", id, want, r)
		}
		return
	}
	if want != (r.Err == nil) || (!want && !errors.Is(r.Err, fsm.ErrSessionNotFound)) {
		t.Fatalf("end of session %d (live %v): %v", id, want, r.Err)
	}
}

// isExpiry reports whether cmd ends sessions by expiry.
func isExpiry(cmd *fsmpb.Command) bool {
	return cmd.GetExpireSession() != nil || cmd.GetExpireSessions() != nil
}

func (m *propModel) acquire(t *rapid.T, wait bool) {
	sess := m.drawSession(t)
	name := rapid.SampledFrom(propNames).Draw(t, "name")
	delay := rapid.SampledFrom(propDelays).Draw(t, "delay")

	lv := m.st.Lock(name)
	var wantErr error
	switch {
	case delay < 0 || delay > fsm.MaxLockDelayMs:
		wantErr = fsm.ErrInvalid
	case !m.live[sess]:
		wantErr = fsm.ErrSessionNotFound
	case m.holders[name].session == sess || m.queued(name, sess) >= 0:
		wantErr = fsm.ErrAlreadyHeld
	case lv.Holder == nil && !lv.Delayed && len(m.queues[name]) == 0:
		// free: granted below
	case !wait:
		wantErr = fsm.ErrBusy
	}
	r, _ := m.step(t, cmdAcquire(sess, name, wait, delay))
	if !errors.Is(r.Err, wantErr) || (wantErr == nil && r.Err != nil) {
		t.Fatalf("acquire %q by %d wait=%v delay=%d: err %v, want %v", name, sess, wait, delay, r.Err, wantErr)
	}
}

func (m *propModel) releaseHolder(t *rapid.T) {
	name := rapid.SampledFrom(propNames).Draw(t, "name")
	h, ok := m.holders[name]
	if !ok {
		return // this action does not apply now: the lock is free
	}
	if r, _ := m.step(t, cmdRelease(h.session, name, h.token)); r.Err != nil {
		t.Fatalf("release of %q by its holder %+v: %v", name, h, r.Err)
	}
}

// releaseAny releases with an arbitrary (session, token): usually a stale
// or wrong handle, which must fail and leave the holder in place.
func (m *propModel) releaseAny(t *rapid.T) {
	name := rapid.SampledFrom(propNames).Draw(t, "name")
	sess := m.drawSession(t)
	token := rapid.SampledFrom(append([]uint64{0, m.maxToken + 1}, m.tokens...)).Draw(t, "token")
	h, held := m.holders[name]
	right := held && h.session == sess && h.token == token
	r, _ := m.step(t, cmdRelease(sess, name, token))
	if right != (r.Err == nil) || (!right && !errors.Is(r.Err, fsm.ErrNotHeld)) {
		t.Fatalf("release %q by (%d, %d), holder %+v: %v", name, sess, token, h, r.Err)
	}
}

func (m *propModel) cancel(t *rapid.T) {
	sess := m.drawSession(t)
	name := rapid.SampledFrom(propNames).Draw(t, "name")
	rev := rapid.SampledFrom(append([]uint64{1}, m.acqRevs[sess]...)).Draw(t, "acquireRevision")
	var wantErr error
	switch {
	case !m.live[sess]:
		wantErr = fsm.ErrSessionNotFound
	case m.queued(name, sess) >= 0 && m.queues[name][m.queued(name, sess)].acqRev == rev:
	case m.holders[name].session == sess && m.holders[name].acqRev == rev:
	default:
		wantErr = fsm.ErrNotHeld
	}
	r, _ := m.step(t, cmdCancel(sess, name, rev))
	if !errors.Is(r.Err, wantErr) || (wantErr == nil && r.Err != nil) {
		t.Fatalf("cancel %q by %d at %d: err %v, want %v", name, sess, rev, r.Err, wantErr)
	}
}

func (m *propModel) endLockDelay(t *rapid.T) {
	name := rapid.SampledFrom(propNames).Draw(t, "name")
	var gen uint64
	for _, d := range m.st.Delays() {
		if d.Name == name {
			gen = d.Generation
		}
	}
	gen += rapid.SampledFrom([]uint64{0, 0, 0, 1, ^uint64(0)}).Draw(t, "generationOffset") // mostly right, sometimes ±1
	if r, _ := m.step(t, cmdEndDelay(name, gen)); r.Err != nil {
		t.Fatalf("EndLockDelay(%q, %d): %v", name, gen, r.Err)
	}
}

// fencedWrite is a fenced put, or a delete, with a token drawn near the
// register's, the highest issued and the revision, sometimes naming a lock.
func (m *propModel) fencedWrite(t *rapid.T, del bool) {
	key := rapid.SampledFrom(propKeys).Draw(t, "key")
	cur := m.regToken[key]
	found := m.regFound[key]
	rev := m.st.Revision()
	choices := []uint64{0, 1, cur, cur + 1, m.maxToken, m.maxToken + 1, rev, rev + 1}
	for _, name := range propNames {
		if h, held := m.holders[name]; held {
			choices = append(choices, h.token)
		}
	}
	token := rapid.SampledFrom(choices).Draw(t, "token")
	if cur > 1 && rapid.Bool().Draw(t, "below") {
		token = cur - 1
	}
	lock := rapid.SampledFrom(append([]string{"", ""}, propNames...)).Draw(t, "lock")
	opID := rapid.SampledFrom(propOpIDs).Draw(t, "opID")
	value := rapid.SampledFrom(propValues).Draw(t, "value")

	cmd := cmdPutLock(key, value, token, lock, opID)
	if del {
		cmd = cmdDelete(key, token, lock, opID)
	}
	r, _ := m.step(t, cmd)
	var ue *fsm.UnissuedTokenError
	switch {
	case token == 0:
		if !errors.Is(r.Err, fsm.ErrInvalid) {
			t.Fatalf("%v: %v, want invalid", cmd, r.Err)
		}
		return
	case token > rev:
		if !errors.As(r.Err, &ue) || ue.Token != token || ue.Revision != rev {
			t.Fatalf("%v at revision %d: %v, want an unissued token", cmd, rev, r.Err)
		}
		return
	}
	if first, dup := m.opResult[key][opID]; opID != "" && found && dup {
		if r.Err != nil || !r.Duplicate || r.Put != first || r.AcceptedToken != cur {
			t.Fatalf("replay of %q on %q: %+v, want duplicate %v accepted %d", opID, key, r, first, cur)
		}
		return
	}
	bound := m.regLock[key]
	if bound != "" && lock != "" && lock != bound { // the resource decides
		var wl *fsm.WrongLockError
		if !errors.As(r.Err, &wl) || wl.Bound != bound || wl.Lock != lock {
			t.Fatalf("%v on %q bound to %q: %v, want a wrong lock", cmd, key, bound, r.Err)
		}
		return
	}
	if r.Err != nil {
		t.Fatalf("%v: %v", cmd, r.Err)
	}
	effective := cmp.Or(bound, lock)
	want := fsm.PutStale
	if h, held := m.holders[effective]; token >= cur && (effective == "" || held && h.token == token) {
		want = fsm.PutAccepted
		m.regLock[key] = effective
	}
	if r.Duplicate || r.Put != want {
		t.Fatalf("%v (accepted %d, holders %+v): %+v, want %v", cmd, cur, m.holders, r, want)
	}
	if want == fsm.PutAccepted {
		m.regToken[key] = token
		m.regFound[key] = !del
	}
	if r.AcceptedToken != m.regToken[key] {
		t.Fatalf("%v: accepted token %d, want %d", cmd, r.AcceptedToken, m.regToken[key])
	}
	switch {
	case !m.regFound[key]: // deleted, or stale on no register: no operation ids
		delete(m.opResult, key)
		delete(m.regOps, key)
	case opID != "":
		if m.opResult[key] == nil {
			m.opResult[key] = make(map[string]fsm.PutOutcome)
		}
		m.opResult[key][opID] = want
		m.regOps[key] = append(m.regOps[key], opID)
		if len(m.regOps[key]) > fsm.OpMemory {
			delete(m.opResult[key], m.regOps[key][0])
			m.regOps[key] = m.regOps[key][1:]
		}
	}
}

// queued returns sess's index in name's model queue, or -1.
func (m *propModel) queued(name string, sess uint64) int {
	return slices.IndexFunc(m.queues[name], func(a acq) bool { return a.session == sess })
}

func (m *propModel) issue(t *rapid.T, token uint64) {
	if token <= m.maxToken {
		t.Fatalf("token %d issued after token %d", token, m.maxToken)
	}
	m.maxToken = token
	m.tokens = append(m.tokens, token)
}

// step applies cmd to the state and to a copy restored from a snapshot of
// it, checks what holds for every command, and updates the model from the
// result and the events.
func (m *propModel) step(t *rapid.T, cmd *fsmpb.Command) (fsm.Result, []fsm.Event) {
	before := m.st.Export()
	beforeBytes := exportBytes(t, m.st)
	decoded := &fsmpb.Snapshot{}
	if err := proto.Unmarshal(beforeBytes, decoded); err != nil {
		t.Fatalf("unmarshal snapshot: %v", err)
	}
	restored, err := fsm.Import(decoded)
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	if !bytes.Equal(beforeBytes, exportBytes(t, restored)) {
		t.Fatalf("export of the restored state differs")
	}

	var evs, evs2 []fsm.Event
	r := m.st.Apply(cmd, func(e fsm.Event) { evs = append(evs, e) })
	r2 := restored.Apply(cmd, func(e fsm.Event) { evs2 = append(evs2, e) })
	after := exportBytes(t, m.st)
	if !sameResult(r, r2) {
		t.Fatalf("%v: result %+v, on the restored copy %+v", cmd, r, r2)
	}
	if !reflect.DeepEqual(evs, evs2) {
		t.Fatalf("%v: events %+v, on the restored copy %+v", cmd, evs, evs2)
	}
	if !bytes.Equal(after, exportBytes(t, restored)) {
		t.Fatalf("%v: state differs from the restored copy's", cmd)
	}

	// Revision: never decreases, and every change bumps it.
	if r.Revision != m.st.Revision() || r.Revision < before.GetRevision() {
		t.Fatalf("%v: revision %d (state %d) after %d", cmd, r.Revision, m.st.Revision(), before.GetRevision())
	}
	if r.Revision == before.GetRevision() && !bytes.Equal(beforeBytes, after) {
		t.Fatalf("%v changed the state without bumping the revision", cmd)
	}
	if r.Err != nil && (len(evs) != 0 || !bytes.Equal(beforeBytes, after)) {
		t.Fatalf("%v failed (%v) but changed the state or emitted %v", cmd, r.Err, evs)
	}
	t.Logf("%v -> %+v %+v", cmd, r, evs)

	m.observe(t, cmd, r, evs, before)
	return r, evs
}

func sameResult(a, b fsm.Result) bool {
	if (a.Err == nil) != (b.Err == nil) || (a.Err != nil && a.Err.Error() != b.Err.Error()) {
		return false
	}
	if len(a.Batch) != len(b.Batch) {
		return false
	}
	for i := range a.Batch {
		if !sameResult(a.Batch[i], b.Batch[i]) {
			return false
		}
	}
	a.Err, b.Err, a.Batch, b.Batch = nil, nil, nil, nil
	return reflect.DeepEqual(a, b)
}

// firstHolder is a mutex's holder in a snapshot.
func firstHolder(ls *fsmpb.LockState) *fsmpb.GrantState {
	if hs := ls.GetHolders(); len(hs) > 0 {
		return hs[0]
	}
	return nil
}

func lockState(snap *fsmpb.Snapshot, name string) *fsmpb.LockState {
	for _, l := range snap.GetLocks() {
		if l.GetName() == name {
			return l
		}
	}
	return &fsmpb.LockState{Name: name}
}

// observe updates the model from one applied command and checks its events.
func (m *propModel) observe(t *rapid.T, cmd *fsmpb.Command, r fsm.Result, evs []fsm.Event, before *fsmpb.Snapshot) {
	// Effects that precede the events: the holder or waiter the command
	// itself removes.
	var ending uint64                    // session being closed or expired
	wantDelays := make(map[string]int64) // lock -> delay its expiry must start
	if r.Err == nil {
		expire := false
		switch op := cmd.GetOp().(type) {
		case *fsmpb.Command_CloseSession:
			ending = op.CloseSession.GetSession()
		case *fsmpb.Command_ExpireSession:
			ending, expire = op.ExpireSession.GetSession(), true
		case *fsmpb.Command_ExpireSessions: // of one session (see endSession)
			if r.Expired == 1 {
				ending, expire = op.ExpireSessions.GetSessions()[0], true
			}
		case *fsmpb.Command_Release:
			delete(m.holders, op.Release.GetName())
		case *fsmpb.Command_CancelAcquire:
			c := op.CancelAcquire
			if i := m.queued(c.GetName(), c.GetSession()); i >= 0 && m.queues[c.GetName()][i].acqRev == c.GetAcquireRevision() {
				m.queues[c.GetName()] = slices.Delete(m.queues[c.GetName()], i, i+1)
			} else {
				delete(m.holders, c.GetName())
			}
		}
		// The ending session's grants end before any hand-off.
		for name, h := range m.holders {
			if ending == 0 || h.session != ending {
				continue
			}
			delete(m.holders, name)
			if d := firstHolder(lockState(before, name)).GetLockDelayMs(); expire && d > 0 {
				wantDelays[name] = d
			}
		}
	}

	for _, e := range evs {
		switch e.Kind {
		case fsm.EventGranted:
			if !m.live[e.Session] || ending == e.Session {
				t.Fatalf("grant %+v to a session that ended", e)
			}
			if h, held := m.holders[e.Name]; held {
				t.Fatalf("grant %+v while %+v holds the lock", e, h)
			}
			q := m.queues[e.Name]
			if len(q) == 0 || q[0].session != e.Session || q[0].acqRev != e.AcquireRevision {
				t.Fatalf("grant %+v out of FIFO order: queue %+v", e, q)
			}
			ls := lockState(before, e.Name)
			if ls.GetDelayed() {
				c := cmd.GetEndLockDelay()
				if c.GetName() != e.Name || c.GetGeneration() != ls.GetDelayGeneration() {
					t.Fatalf("grant %+v of a delayed lock by %v", e, cmd)
				}
			}
			m.issue(t, e.Token)
			m.queues[e.Name] = q[1:]
			m.holders[e.Name] = acq{session: e.Session, acqRev: e.AcquireRevision, token: e.Token}
		case fsm.EventWaitEnded:
			i := m.queued(e.Name, e.Session)
			if e.Session != ending || i < 0 || m.queues[e.Name][i].acqRev != e.AcquireRevision {
				t.Fatalf("%+v: not a wait of the ending session %d (queue %+v)", e, ending, m.queues[e.Name])
			}
			if e.Expired != isExpiry(cmd) {
				t.Fatalf("%+v after %v", e, cmd)
			}
			m.queues[e.Name] = slices.Delete(m.queues[e.Name], i, i+1)
		case fsm.EventDelayStarted:
			d, ok := wantDelays[e.Name]
			if !ok || d != e.DelayMs || e.Generation <= lockState(before, e.Name).GetDelayGeneration() {
				t.Fatalf("%+v after %v (expected delays %v)", e, cmd, wantDelays)
			}
			delete(wantDelays, e.Name)
		case fsm.EventSessionEnded:
			if e.Session != ending || e.Expired != isExpiry(cmd) {
				t.Fatalf("%+v after %v", e, cmd)
			}
			delete(m.live, ending)
			m.ended[ending] = true
		case fsm.EventSessionCreated:
			if cmd.GetCreateSession() == nil || e.Session != r.Session || e.TTLMs != cmd.GetCreateSession().GetTtlMs() {
				t.Fatalf("%+v after %v", e, cmd)
			}
		default:
			t.Fatalf("unknown event %+v", e)
		}
	}
	if len(wantDelays) != 0 {
		t.Fatalf("%v started no lock-delay for %v", cmd, wantDelays)
	}
	if ending != 0 && m.live[ending] {
		t.Fatalf("%v emitted no EventSessionEnded", cmd)
	}

	if r.Err != nil {
		return
	}
	switch c := cmd.GetOp().(type) {
	case *fsmpb.Command_CreateSession:
		if r.Session != r.Revision || m.live[r.Session] || m.ended[r.Session] {
			t.Fatalf("created session %d at revision %d", r.Session, r.Revision)
		}
		m.created = append(m.created, r.Session)
		m.live[r.Session] = true
	case *fsmpb.Command_Acquire:
		a := c.Acquire
		if r.Granted == r.Queued || r.AcquireRevision != r.Revision {
			t.Fatalf("acquire result %+v", r)
		}
		m.acqRevs[a.GetSession()] = append(m.acqRevs[a.GetSession()], r.AcquireRevision)
		if r.Granted {
			if r.Token != r.Revision || len(m.queues[a.GetName()]) != 0 || lockState(before, a.GetName()).GetDelayed() {
				t.Fatalf("direct grant %+v over queue %+v", r, m.queues[a.GetName()])
			}
			m.issue(t, r.Token)
			m.holders[a.GetName()] = acq{session: a.GetSession(), acqRev: r.AcquireRevision, token: r.Token}
		} else {
			m.queues[a.GetName()] = append(m.queues[a.GetName()], acq{session: a.GetSession(), acqRev: r.AcquireRevision})
			if int(r.Position) != len(m.queues[a.GetName()]) {
				t.Fatalf("queued at position %d, model queue %+v", r.Position, m.queues[a.GetName()])
			}
		}
	}
}

// check runs after every step: the state agrees with the model and with
// itself.
func (m *propModel) check(t *rapid.T) {
	if err := m.st.CheckIndexes(); err != nil {
		t.Fatal(err)
	}
	var live []uint64
	for id := range m.live {
		live = append(live, id)
	}
	slices.Sort(live)
	views := m.st.Sessions()
	var ids []uint64
	held := make(map[uint64][]string)
	waiting := make(map[uint64][]string)
	for _, v := range views {
		ids = append(ids, v.ID)
		if m.ended[v.ID] {
			t.Fatalf("ended session %d still listed", v.ID)
		}
	}
	if !slices.Equal(ids, live) {
		t.Fatalf("sessions %v, want %v", ids, live)
	}

	for _, name := range propNames {
		lv := m.st.Lock(name)
		h, ok := m.holders[name]
		switch {
		case ok != (lv.Holder != nil):
			t.Fatalf("lock %q holder %+v, model %+v (held %v)", name, lv.Holder, h, ok)
		case ok && (lv.Holder.Session != h.session || lv.Holder.Token != h.token || lv.Holder.AcquireRevision != h.acqRev):
			t.Fatalf("lock %q holder %+v, model %+v", name, *lv.Holder, h)
		}
		if ok {
			held[h.session] = append(held[h.session], name)
			if !m.live[h.session] {
				t.Fatalf("lock %q held by ended session %d", name, h.session)
			}
		}
		var q []acq
		for _, w := range lv.Waiters {
			q = append(q, acq{session: w.Session, acqRev: w.AcquireRevision})
			waiting[w.Session] = append(waiting[w.Session], name)
			if !m.live[w.Session] || (ok && w.Session == h.session) {
				t.Fatalf("lock %q: bad waiter %+v (holder %+v)", name, w, h)
			}
		}
		if !slices.Equal(q, m.queues[name]) {
			t.Fatalf("lock %q waiters %+v, model %+v", name, q, m.queues[name])
		}
		if lv.Delayed && lv.Holder != nil {
			t.Fatalf("lock %q delayed and held", name)
		}
		if !lv.Delayed && lv.Holder == nil && len(lv.Waiters) != 0 {
			t.Fatalf("lock %q free but has waiters %+v", name, lv.Waiters)
		}

		hist := m.st.History(name)
		if len(hist) > fsm.HistoryLimit {
			t.Fatalf("lock %q keeps %d history records", name, len(hist))
		}
		for i, g := range hist {
			if i > 0 && g.Token <= hist[i-1].Token {
				t.Fatalf("lock %q history out of order: %+v", name, hist)
			}
			last := i == len(hist)-1
			switch g.Ended {
			case "held":
				if !last || !ok || g.Token != h.token || g.Session != h.session {
					t.Fatalf("lock %q history %+v, holder %+v", name, hist, h)
				}
			case "released", "expired":
				if g.EndedRevision < g.GrantedRevision || (last && ok) {
					t.Fatalf("lock %q history %+v, holder %+v", name, hist, h)
				}
			default:
				t.Fatalf("lock %q history record %+v", name, g)
			}
		}
	}

	for _, v := range views {
		if !slices.Equal(v.Held, sorted(held[v.ID])) || !slices.Equal(v.Waiting, sorted(waiting[v.ID])) {
			t.Fatalf("session %+v, locks say held %v waiting %v", v, held[v.ID], waiting[v.ID])
		}
	}

	for _, key := range propKeys {
		reg := m.st.Register(key)
		if reg.Found && reg.Token < m.regSeen[key] { // across deletes too
			t.Fatalf("register %q accepted token went back from %d to %d", key, m.regSeen[key], reg.Token)
		}
		if reg.Found {
			m.regSeen[key] = reg.Token
		}
		if reg.Found != m.regFound[key] || (reg.Found && reg.Token != m.regToken[key]) {
			t.Fatalf("register %q %+v, model token %d found %v", key, reg, m.regToken[key], m.regFound[key])
		}
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	sort.Strings(s)
	return s
}
