//go:build linux || darwin

package nemesis

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tenure-io/tenure/client"
)

// The fenced-register workload: every client loops acquire → read →
// write with the hold's token → release, on one lock guarding one
// register. Clients write even after their hold turned suspect or lost:
// the register, not the client, must stop a stale write.

// Budgets of single operations.
const (
	acquireTimeout = 5 * time.Second
	getTimeout     = 3 * time.Second
	putBudget      = 6 * time.Second // all attempts of one put, same op id
	putAttempt     = 2 * time.Second
	releaseTimeout = 3 * time.Second
	procTTL        = time.Second // session TTL of the `tenure lock` clients
)

// putResult is the resolved outcome of one fenced write and its retries.
type putResult struct {
	outcome     string
	duplicate   bool
	resultToken uint64
	revision    uint64
	attempts    int
	err         string
}

// fencedPut writes value with token under opID, retrying with the same
// operation id while the outcome is unknown, within putBudget. Retries are
// idempotent: a replayed operation id applies nothing and returns the first
// result.
func fencedPut(c *client.Client, key, value string, token uint64, opID string) putResult {
	deadline := time.Now().Add(putBudget)
	var res putResult
	for {
		res.attempts++
		ctx, cancel := context.WithTimeout(context.Background(), min(putAttempt, time.Until(deadline)))
		r, err := c.FencedPut(ctx, key, []byte(value), token, opID)
		cancel()
		switch {
		case err == nil:
			res.outcome = outStale // a duplicate of a write that was stale
			if r.Accepted {
				res.outcome = outAccepted
			}
			res.duplicate, res.resultToken = r.Duplicate, r.Token
			if !r.Duplicate {
				res.revision = r.Revision
			}
			return res
		case errors.Is(err, client.ErrStale):
			res.outcome, res.resultToken = outStale, r.Token
			return res
		case errors.Is(err, client.ErrInvalid):
			res.outcome, res.err = outFail, err.Error()
			return res
		}
		res.err = err.Error()
		if time.Until(deadline) < 50*time.Millisecond {
			res.outcome = outUnknown
			return res
		}
		time.Sleep(50 * time.Millisecond) // pace the retries
	}
}

// putOp turns a put's invocation and result into a history operation.
func putOp(clientID, key, value string, token uint64, opID string, invoke, complete int64, r putResult) Op {
	op := Op{Client: clientID, Kind: kindPut, Key: key, Invoke: invoke, Complete: complete, Outcome: r.outcome,
		Token: token, Value: value, OpID: opID, ResultToken: r.resultToken, Revision: r.revision,
		Duplicate: r.duplicate, Attempts: r.attempts, Err: r.err}
	if r.outcome == outUnknown {
		op.Complete = never
	}
	return op
}

// goWorker is an in-process client with its own connection and session.
type goWorker struct {
	id        string
	lock, key string
	eps       string
	ttl       time.Duration
	rec       *recorder
	rnd       *rand.Rand
	c         *client.Client
	sess      *client.Session
	seq       int
}

func (w *goWorker) run(ctx context.Context) {
	var err error
	if w.c, err = dialClient(context.Background(), w.eps); err != nil {
		w.rec.add(Op{Client: w.id, Kind: kindAcquire, Key: w.lock, Invoke: w.rec.now(), Complete: w.rec.now(), Outcome: outFail, Err: err.Error()})
		return
	}
	defer w.c.Close()
	defer w.dropSession()
	for ctx.Err() == nil {
		if w.sess == nil {
			sctx, cancel := context.WithTimeout(ctx, acquireTimeout)
			w.sess, err = w.c.NewSession(sctx, client.WithTTL(w.ttl), client.WithOwner(w.id))
			cancel()
			if err != nil {
				w.sess = nil
				pace(ctx, 100*time.Millisecond)
				continue
			}
		}
		w.cycle(ctx)
	}
}

// dropSession closes the session (bounded) so that a fresh one is opened.
func (w *goWorker) dropSession() {
	if w.sess == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = w.sess.Close(ctx)
	cancel()
	w.sess = nil
}

func (w *goWorker) cycle(ctx context.Context) {
	select {
	case <-w.sess.Done():
		w.dropSession()
		return
	default:
	}
	m, err := w.sess.Mutex(w.lock)
	if err != nil {
		w.dropSession()
		return
	}
	inv := w.rec.now()
	lctx, cancel := context.WithTimeout(ctx, acquireTimeout)
	h, err := m.Lock(lctx)
	cancel()
	acq := Op{Client: w.id, Kind: kindAcquire, Key: w.lock, Invoke: inv, Complete: w.rec.now(), Outcome: outOK}
	if err != nil {
		acq.Outcome, acq.Err = outFail, err.Error()
		w.rec.add(acq)
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			w.dropSession()
		}
		return
	}
	acq.Token = h.Token()
	w.rec.add(acq)

	// Read the register (the read is part of the checked history).
	inv = w.rec.now()
	gctx, cancel := context.WithTimeout(context.Background(), getTimeout)
	reg, err := w.c.FencedGet(gctx, w.key)
	cancel()
	get := Op{Client: w.id, Kind: kindGet, Key: w.key, Invoke: inv, Complete: w.rec.now(), Outcome: outOK}
	if err != nil {
		get.Outcome, get.Err = outFail, err.Error()
	} else {
		get.Value, get.Token, get.Found, get.Revision = string(reg.Value), reg.Token, reg.Found, reg.ModRevision
	}
	w.rec.add(get)

	pace(context.Background(), time.Duration(w.rnd.IntN(10))*time.Millisecond) // think

	// Write with the token, whatever the hold's state is by now.
	w.seq++
	opID := fmt.Sprintf("%s-%d", w.id, w.seq)
	state := h.State()
	inv = w.rec.now()
	r := fencedPut(w.c, w.key, opID, h.Token(), opID)
	op := putOp(w.id, w.key, opID, h.Token(), opID, inv, w.rec.now(), r)
	if state != client.Held {
		op.Note = "hold " + state.String() + " when the write was sent"
	}
	w.rec.add(op)

	inv = w.rec.now()
	uctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	err = h.Unlock(uctx)
	cancel()
	rel := Op{Client: w.id, Kind: kindRelease, Key: w.lock, Invoke: inv, Complete: w.rec.now(), Outcome: outOK, Token: h.Token()}
	switch {
	case err == nil:
	case errors.Is(err, client.ErrNotHeld):
		rel.Outcome, rel.Err = outLost, err.Error()
	default:
		rel.Outcome, rel.Err = outFail, err.Error()
	}
	w.rec.add(rel)
	if err != nil {
		w.dropSession() // a release of unknown outcome keeps the name reserved
	}
}

// reader reads a register without holding its lock, concurrently with
// the writers: its reads check that reads are linearizable through leader
// changes (a deposed leader must not answer from its stale state).
type reader struct {
	id, key, eps string
	rec          *recorder
	rnd          *rand.Rand
}

func (r *reader) run(ctx context.Context) {
	c, err := dialClient(context.Background(), r.eps)
	if err != nil {
		r.rec.add(Op{Client: r.id, Kind: kindGet, Key: r.key, Invoke: r.rec.now(), Complete: r.rec.now(), Outcome: outFail, Err: err.Error()})
		return
	}
	defer c.Close()
	for ctx.Err() == nil {
		inv := r.rec.now()
		gctx, cancel := context.WithTimeout(context.Background(), getTimeout)
		reg, err := c.FencedGet(gctx, r.key)
		cancel()
		get := Op{Client: r.id, Kind: kindGet, Key: r.key, Invoke: inv, Complete: r.rec.now(), Outcome: outOK}
		if err != nil {
			get.Outcome, get.Err = outFail, err.Error()
		} else {
			get.Value, get.Token, get.Found, get.Revision = string(reg.Value), reg.Token, reg.Found, reg.ModRevision
		}
		r.rec.add(get)
		pace(ctx, time.Duration(10+r.rnd.IntN(30))*time.Millisecond)
	}
}

// pace waits d or until ctx ends (pacing of retries and think time, not
// synchronisation).
func pace(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// Environment of the helper: `tenure lock` runs this test binary as its
// command, which then reads and writes the register as the lock holder.
const (
	envHelper = "NEMESIS_HELPER" // set: run helperMain instead of the tests
	envRec    = "NEMESIS_REC"    // file the helper appends its events to
	envKey    = "NEMESIS_KEY"    // register key
	envClient = "NEMESIS_CLIENT" // client id
	envSeq    = "NEMESIS_SEQ"    // cycle number
	envLinger = "NEMESIS_LINGER" // while this file exists, linger before writing
	envMarker = "NEMESIS_MARKER" // written while lingering: who to pause
)

// helperEvent is one line the helper appends to its record file. T, Invoke
// and Complete are raw monoNow() readings.
type helperEvent struct {
	Ev       string `json:"ev"` // grant, get, put-invoke, put, exit
	T        int64  `json:"t"`
	Token    uint64 `json:"token,omitempty"`
	PID      int    `json:"pid,omitempty"`
	PPID     int    `json:"ppid,omitempty"`
	PGID     int    `json:"pgid,omitempty"`
	Invoke   int64  `json:"invoke,omitempty"`
	Complete int64  `json:"complete,omitempty"`
	Value    string `json:"value,omitempty"`
	Found    bool   `json:"found,omitempty"`
	Revision uint64 `json:"revision,omitempty"`
	Outcome  string `json:"outcome,omitempty"`
	Dup      bool   `json:"dup,omitempty"`
	Result   uint64 `json:"result_token,omitempty"`
	Attempts int    `json:"attempts,omitempty"`
	Lingered bool   `json:"lingered,omitempty"`
	Err      string `json:"error,omitempty"`
}

// lingerMarker tells the nemesis which processes to freeze.
type lingerMarker struct {
	PID   int    `json:"pid"`  // the helper
	PGID  int    `json:"pgid"` // the helper's process group
	PPID  int    `json:"ppid"` // its `tenure lock`
	Token uint64 `json:"token"`
}

// helperMain is the command of a `tenure lock` process: a lock holder
// that reads the register, thinks (or lingers while the nemesis asks it
// to, so that it can be frozen mid-hold), then writes with its token. It
// ignores SIGTERM, as a process stuck in a pause would not act on it: its
// write goes out late, and the register must refuse it. `tenure lock`
// kills it after --kill-grace.
func helperMain() int {
	signal.Ignore(syscall.SIGTERM)
	f, err := os.OpenFile(os.Getenv(envRec), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	defer f.Close()
	emit := func(e helperEvent) { b, _ := json.Marshal(e); _, _ = f.Write(append(b, '\n')) }
	token, err := strconv.ParseUint(os.Getenv("TENURE_FENCE_TOKEN"), 10, 64)
	if err != nil {
		emit(helperEvent{Ev: "exit", T: monoNow(), Err: "no fence token: " + err.Error()})
		return 1
	}
	key, id, seq := os.Getenv(envKey), os.Getenv(envClient), os.Getenv(envSeq)
	emit(helperEvent{Ev: "grant", T: monoNow(), Token: token, PID: os.Getpid(), PPID: os.Getppid(), PGID: syscall.Getpgrp()})

	c, err := dialClient(context.Background(), os.Getenv("TENURE_ENDPOINT"))
	if err != nil {
		emit(helperEvent{Ev: "exit", T: monoNow(), Err: err.Error()})
		return 1
	}
	defer c.Close()

	inv := monoNow()
	ctx, cancel := context.WithTimeout(context.Background(), getTimeout)
	reg, err := c.FencedGet(ctx, key)
	cancel()
	get := helperEvent{Ev: "get", Invoke: inv, Complete: monoNow()}
	if err != nil {
		get.Err = err.Error()
	} else {
		get.Value, get.Token, get.Found, get.Revision = string(reg.Value), reg.Token, reg.Found, reg.ModRevision
	}
	emit(get)

	time.Sleep(time.Duration(10+rand.IntN(40)) * time.Millisecond) // think
	lingered := linger(os.Getenv(envLinger), os.Getenv(envMarker), token)

	opID := fmt.Sprintf("%s-%s", id, seq)
	inv = monoNow()
	emit(helperEvent{Ev: "put-invoke", T: inv})
	r := fencedPut(c, key, opID, token, opID)
	emit(helperEvent{Ev: "put", Invoke: inv, Complete: monoNow(), Outcome: r.outcome, Dup: r.duplicate,
		Result: r.resultToken, Revision: r.revision, Attempts: r.attempts, Lingered: lingered, Err: r.err})
	emit(helperEvent{Ev: "exit", T: monoNow()})
	return 0
}

// linger: if the linger file exists, write the marker and wait (at most
// 20s) until the file is removed. The nemesis freezes this process and
// its `tenure lock` meanwhile.
func linger(flagPath, markerPath string, token uint64) bool {
	if _, err := os.Stat(flagPath); err != nil {
		return false
	}
	b, _ := json.Marshal(lingerMarker{PID: os.Getpid(), PGID: syscall.Getpgrp(), PPID: os.Getppid(), Token: token})
	tmp := markerPath + ".tmp"
	if os.WriteFile(tmp, b, 0o644) != nil || os.Rename(tmp, markerPath) != nil {
		return false
	}
	defer os.Remove(markerPath)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(flagPath); err != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// procWorker drives `tenure lock` processes, one per cycle, whose command
// is helperMain.
type procWorker struct {
	id        string
	lock, key string
	eps       string
	dir       string
	rec       *recorder

	cur chan *proc // holds the running `tenure lock` (capacity 1), if any
}

func newProcWorker(id, lock, key, eps, dir string, rec *recorder) *procWorker {
	return &procWorker{id: id, lock: lock, key: key, eps: eps, dir: dir, rec: rec, cur: make(chan *proc, 1)}
}

func (w *procWorker) lingerFlag() string { return filepath.Join(w.dir, "linger") }
func (w *procWorker) markerPath() string { return filepath.Join(w.dir, "lingering") }

// running returns the current `tenure lock` process, or nil.
func (w *procWorker) running() *proc {
	select {
	case p := <-w.cur:
		w.cur <- p
		return p
	default:
		return nil
	}
}

func (w *procWorker) run(ctx context.Context) {
	for seq := 1; ctx.Err() == nil; seq++ {
		w.cycle(seq)
	}
}

func (w *procWorker) cycle(seq int) {
	recPath := filepath.Join(w.dir, fmt.Sprintf("rec-%d.jsonl", seq))
	env := append(os.Environ(),
		"TENURE_ENDPOINT="+w.eps, envHelper+"=1", envRec+"="+recPath, envKey+"="+w.key, envClient+"="+w.id,
		envSeq+"="+strconv.Itoa(seq), envLinger+"="+w.lingerFlag(), envMarker+"="+w.markerPath())
	inv := w.rec.now()
	p, err := startProc(w.id, filepath.Join(w.dir, fmt.Sprintf("run-%d", seq)), env,
		tenureBin, "lock", w.lock, "--ttl", procTTL.String(), "--timeout", "8s", "--kill-grace", "3s", "--owner", w.id, "--", selfBin)
	if err != nil {
		w.rec.add(Op{Client: w.id, Kind: kindAcquire, Key: w.lock, Invoke: inv, Complete: w.rec.now(), Outcome: outFail, Err: err.Error()})
		pace(context.Background(), 100*time.Millisecond)
		return
	}
	w.cur <- p
	// Bounded: --timeout 8s to acquire, a lingering helper waits at most
	// 20s, the kill grace is 3s.
	if !p.waitExit(45 * time.Second) {
		// The helper is still `tenure lock`'s child (not reaped), so its
		// group id is still its own.
		if g, ok := readEvents(recPath)["grant"]; ok && g.PGID == g.PID && g.PPID == p.pid() {
			_ = syscall.Kill(-g.PGID, syscall.SIGKILL)
		}
		p.signal(syscall.SIGKILL)
		p.waitExit(10 * time.Second)
	}
	<-w.cur
	w.addOps(seq, inv, w.rec.now(), p, readEvents(recPath))
}

// addOps turns one cycle's events into history operations.
func (w *procWorker) addOps(seq int, inv, end int64, p *proc, evs map[string]helperEvent) {
	g, granted := evs["grant"]
	acq := Op{Client: w.id, Kind: kindAcquire, Key: w.lock, Invoke: inv}
	if !granted {
		acq.Complete, acq.Outcome = end, outFail
		acq.Err = fmt.Sprintf("tenure lock exited %d: %s", p.status, tail(p.stderr(), 1))
		w.rec.add(acq)
		return
	}
	acq.Complete, acq.Outcome, acq.Token = w.rec.since(g.T), outOK, g.Token
	w.rec.add(acq)
	if e, ok := evs["get"]; ok {
		get := Op{Client: w.id, Kind: kindGet, Key: w.key, Invoke: w.rec.since(e.Invoke), Complete: w.rec.since(e.Complete), Outcome: outOK,
			Value: e.Value, Token: e.Token, Found: e.Found, Revision: e.Revision}
		if e.Err != "" {
			get.Outcome, get.Err = outFail, e.Err
		}
		w.rec.add(get)
	}
	opID := fmt.Sprintf("%s-%d", w.id, seq)
	if e, ok := evs["put"]; ok {
		op := putOp(w.id, w.key, opID, g.Token, opID, w.rec.since(e.Invoke), w.rec.since(e.Complete),
			putResult{outcome: e.Outcome, duplicate: e.Dup, resultToken: e.Result, revision: e.Revision, attempts: e.Attempts, err: e.Err})
		if e.Lingered {
			op.Note = "written after lingering (pause-holder)"
		}
		w.rec.add(op)
	} else if e, ok := evs["put-invoke"]; ok {
		// The helper was killed while writing: the write may or may not
		// have been applied.
		w.rec.add(Op{Client: w.id, Kind: kindPut, Key: w.key, Invoke: w.rec.since(e.T), Complete: never, Outcome: outUnknown,
			Token: g.Token, Value: opID, OpID: opID, Note: "helper killed while writing"})
	}
	rel := Op{Client: w.id, Kind: kindRelease, Key: w.lock, Invoke: w.rec.since(g.T), Complete: end, Outcome: outOK, Token: g.Token}
	if e, ok := evs["exit"]; ok {
		rel.Invoke = w.rec.since(e.T)
	}
	switch {
	case p.status == 0:
	case strings.Contains(p.stderr(), "lost ownership"):
		rel.Outcome, rel.Err = outLost, tail(p.stderr(), 1)
	default:
		rel.Outcome, rel.Err = outFail, fmt.Sprintf("tenure lock exited %d: %s", p.status, tail(p.stderr(), 1))
	}
	w.rec.add(rel)
}

// readEvents reads a helper's record file, keyed by event name.
func readEvents(path string) map[string]helperEvent {
	evs := make(map[string]helperEvent)
	f, err := os.Open(path)
	if err != nil {
		return evs
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var e helperEvent
		if json.Unmarshal(sc.Bytes(), &e) == nil {
			evs[e.Ev] = e
		}
	}
	return evs
}
