//go:build linux || darwin

package nemesis

import (
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Checks (the names anomalies are reported under).
const (
	checkTokenUnique   = "token-unique"   // no token granted twice
	checkTokenOrder    = "token-order"    // a grant's token exceeds every token granted before it was requested
	checkTokenFault    = "token-fault"    // ... in particular across each leader change and full restart
	checkRegisterOrder = "register-order" // accepted tokens strictly increase in revision order; no stale write accepted
	checkRegisterStale = "register-stale" // a stale answer names a higher accepted token
	checkFinal         = "final-value"    // the final value is the last accepted write
	checkLinearizable  = "linearizable"   // porcupine, per register
)

// anomaly is one violated property.
type anomaly struct {
	Check string `json:"check"`
	Msg   string `json:"msg"`
}

// report is the checker's verdict.
type report struct {
	anomalies []anomaly
	lines     []string // what was checked, with figures
	warnings  []string // checks that could not decide
}

func (r *report) anomaly(check, format string, args ...any) {
	r.anomalies = append(r.anomalies, anomaly{check, fmt.Sprintf(format, args...)})
}

func (r *report) line(format string, args ...any) {
	r.lines = append(r.lines, fmt.Sprintf(format, args...))
}

// byCheck counts anomalies per check.
func (r *report) byCheck() map[string]int {
	m := make(map[string]int)
	for _, a := range r.anomalies {
		m[a.Check]++
	}
	return m
}

// check runs every check on a history. keys are the registers to check;
// a failed linearizability check writes a porcupine visualisation to
// vizDir ("" for none).
func check(ops []Op, faults []Fault, keys []string, vizDir string, porcupineTimeout time.Duration) report {
	var r report
	checkTokens(ops, faults, &r)
	for _, key := range keys {
		checkRegister(key, ops, &r, vizDir, porcupineTimeout)
	}
	checkLateWrites(ops, faults, &r)
	checkFaultFindings(faults, &r)
	checkHoldsAcross(ops, faults, &r)
	return r
}

// checkFaultFindings reports what the faults themselves found wrong, and
// how many of each kind that checks something ran clean.
func checkFaultFindings(faults []Fault, r *report) {
	clean := make(map[string]int)
	for _, f := range faults {
		for _, a := range f.Anomalies {
			r.anomaly(a.Check, "%s of %s at %s: %s", f.Kind, f.Target, at(f.Start), a.Msg)
		}
		if len(f.Anomalies) == 0 && (f.Kind == faultCorrupt || f.Kind == faultDiskFull) {
			clean[f.Kind]++
		}
	}
	if n := clean[faultCorrupt]; n > 0 {
		r.line("%s: %d times the node refused its corrupted log with one line, and was rebuilt from its peers and caught up", faultCorrupt, n)
	}
	if n := clean[faultDiskFull]; n > 0 {
		r.line("%s: %d times the node caught up by itself once its disk had room again", faultDiskFull, n)
	}
}

// checkHoldsAcross reports, for the faults that freeze or silence a
// server, how the in-process clients' holds that began before the fault
// and were released after it began ended: kept, or lost (the session
// expired meanwhile). Lost holds are no anomaly (a lease cannot promise
// them), but a client that notices a silent server in time keeps them.
func checkHoldsAcross(ops []Op, faults []Fault, r *report) {
	type hold struct {
		acquired, released int64
		lost               bool
	}
	var holds []hold
	open := make(map[string]int64) // client+token → acquired
	for _, o := range ops {
		if !strings.HasPrefix(o.Client, "g") {
			continue // `tenure lock` processes exit on a lost hold
		}
		k := fmt.Sprint(o.Client, "/", o.Token)
		switch {
		case o.Kind == kindAcquire && o.Outcome == outOK:
			open[k] = o.Complete
		case o.Kind == kindRelease:
			if a, ok := open[k]; ok {
				holds = append(holds, hold{a, o.Invoke, o.Outcome != outOK})
				delete(open, k)
			}
		}
	}
	for _, kind := range []string{faultPauseLeader, faultPauseFollow, faultBlackhole} {
		n, kept, lost := 0, 0, 0
		for _, f := range faults {
			if f.Kind != kind {
				continue
			}
			n++
			for _, h := range holds {
				if h.acquired < f.Start && h.released > f.Start {
					if h.lost {
						lost++
					} else {
						kept++
					}
				}
			}
		}
		if n > 0 {
			r.line("holds across %s (%d faults): %d kept, %d lost or not confirmed", kind, n, kept, lost)
		}
	}
}

func at(ns int64) string { return fmt.Sprintf("%.3fs", secs(ns)) }

// checkTokens: tokens are unique, and a grant requested after another
// grant completed has a larger token (tokens are revisions of one
// replicated log: they only grow, whatever lock they are for, across
// leader changes and restarts). For each fault, every grant requested
// after it healed must exceed every token observed before it began.
func checkTokens(ops []Op, faults []Fault, r *report) {
	var grants []Op
	for _, o := range ops {
		if o.Kind == kindAcquire && o.Outcome == outOK {
			grants = append(grants, o)
		}
	}
	byToken := make(map[uint64]Op)
	for _, g := range grants {
		if p, dup := byToken[g.Token]; dup {
			r.anomaly(checkTokenUnique, "token %d granted twice: to %s at %s and to %s at %s", g.Token, p.Client, at(p.Complete), g.Client, at(g.Complete))
			continue
		}
		byToken[g.Token] = g
	}

	byInvoke := append([]Op(nil), grants...)
	sort.Slice(byInvoke, func(i, j int) bool { return byInvoke[i].Invoke < byInvoke[j].Invoke })
	byComplete := append([]Op(nil), grants...)
	sort.Slice(byComplete, func(i, j int) bool { return byComplete[i].Complete < byComplete[j].Complete })
	var maxOp *Op
	j := 0
	for _, b := range byInvoke {
		for ; j < len(byComplete) && byComplete[j].Complete < b.Invoke; j++ {
			if maxOp == nil || byComplete[j].Token > maxOp.Token {
				maxOp = &byComplete[j]
			}
		}
		if maxOp != nil && b.Token <= maxOp.Token {
			r.anomaly(checkTokenOrder, "%s was granted %s with token %d (requested at %s), not above token %d granted to %s at %s",
				b.Client, b.Key, b.Token, at(b.Invoke), maxOp.Token, maxOp.Client, at(maxOp.Complete))
		}
	}
	r.line("tokens: %d grants; unique; each above every token granted before it was requested", len(grants))

	perKind := make(map[string]int)
	for _, f := range faults {
		if f.Kind == faultPause {
			continue
		}
		var before uint64
		for _, o := range ops {
			if o.Complete != never && o.Complete < f.Start && o.Outcome != outFail {
				before = max(before, o.Token, o.ResultToken)
			}
		}
		var first *Op
		for i, g := range grants {
			if g.Invoke <= f.End {
				continue
			}
			if first == nil || g.Invoke < first.Invoke {
				first = &grants[i]
			}
			if g.Token <= before {
				r.anomaly(checkTokenFault, "after %s (%s..%s): %s was granted token %d, not above token %d seen before the fault",
					f.Kind, at(f.Start), at(f.End), g.Client, g.Token, before)
			}
		}
		if first == nil {
			r.warnings = append(r.warnings, fmt.Sprintf("no grant requested after %s at %s: token check across it not exercised", f.Kind, at(f.Start)))
			continue
		}
		perKind[f.Kind]++
		if f.Kind == faultRestartAll {
			r.line("tokens across %s at %s: highest token seen before %d, first grant after %d", f.Kind, at(f.Start), before, first.Token)
		}
	}
	if len(perKind) > 0 {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(perKind)) {
			parts = append(parts, fmt.Sprintf("%s %d", k, perKind[k]))
		}
		r.line("tokens across faults (every later grant above every token seen before): %s", strings.Join(parts, ", "))
	}
}

// checkRegister checks one fenced register's history.
func checkRegister(key string, ops []Op, r *report, vizDir string, porcupineTimeout time.Duration) {
	var puts, known []Op
	var final *Op
	gets := 0
	for i, o := range ops {
		if o.Key != key {
			continue
		}
		switch o.Kind {
		case kindPut:
			puts = append(puts, o)
			if o.Outcome == outAccepted && !o.Duplicate && o.Revision > 0 {
				known = append(known, o)
			}
		case kindGet:
			if o.Outcome == outOK {
				gets++
			}
		case kindFinalGet:
			final = &ops[i]
		}
	}
	n0 := len(r.anomalies)

	// Commit order: tokens of accepted writes strictly increase with the
	// revision that committed them. A decrease is a stale write accepted.
	sort.Slice(known, func(i, j int) bool { return known[i].Revision < known[j].Revision })
	for i := 1; i < len(known); i++ {
		prev, cur := known[i-1], known[i]
		switch {
		case cur.Revision == prev.Revision:
			r.anomaly(checkRegisterOrder, "%s: writes %s and %s both accepted at revision %d", key, prev.OpID, cur.OpID, cur.Revision)
		case cur.Token < prev.Token:
			r.anomaly(checkRegisterOrder, "%s: stale write accepted: %s with token %d at revision %d, after %s with token %d at revision %d",
				key, cur.OpID, cur.Token, cur.Revision, prev.OpID, prev.Token, prev.Revision)
		case cur.Token == prev.Token:
			r.anomaly(checkRegisterOrder, "%s: token %d accepted twice: %s (revision %d) and %s (revision %d)",
				key, cur.Token, prev.OpID, prev.Revision, cur.OpID, cur.Revision)
		}
	}
	// Accepted writes known only as duplicates (their first answer was
	// lost) carry no revision: check them against real time instead.
	stale, unknown, accepted := 0, 0, 0
	for _, p := range puts {
		switch p.Outcome {
		case outAccepted:
			accepted++
		case outStale:
			stale++
			if !p.Duplicate && p.Token >= p.ResultToken {
				r.anomaly(checkRegisterStale, "%s: %s with token %d answered stale, but the register's token was %d", key, p.OpID, p.Token, p.ResultToken)
			}
			continue
		case outUnknown:
			unknown++
			continue
		default:
			continue
		}
		if !p.Duplicate {
			continue
		}
		for _, q := range puts {
			if q.Outcome == outAccepted && q.Complete != never && q.Complete < p.Invoke && q.Token > p.Token {
				r.anomaly(checkRegisterOrder, "%s: stale write accepted: %s with token %d (sent at %s) after %s with token %d was accepted at %s",
					key, p.OpID, p.Token, at(p.Invoke), q.OpID, q.Token, at(q.Complete))
				break
			}
		}
	}

	finalNote := checkFinalValue(key, puts, known, final, r)
	lin := porcupineCheck(key, ops, r, vizDir, porcupineTimeout)
	verdict := "ok"
	if n := len(r.anomalies) - n0; n > 0 {
		verdict = fmt.Sprintf("%d ANOMALIES", n)
	}
	r.line("register %s: %d writes accepted (%d with a revision), %d stale, %d unknown; %d reads; %s; %s: %s",
		key, accepted, len(known), stale, unknown, gets, finalNote, lin, verdict)
}

// checkFinalValue: the value read after healing is the last accepted
// write: the accepted write with the highest revision, or a write whose
// outcome the client never learned (or learned only as a duplicate)
// committed after it.
func checkFinalValue(key string, puts, known []Op, final *Op, r *report) string {
	if final == nil || final.Outcome != outOK {
		r.anomaly(checkFinal, "%s: no final read", key)
		return "no final read"
	}
	var last *Op
	if len(known) > 0 {
		last = &known[len(known)-1]
	}
	if !final.Found {
		for _, p := range puts {
			if p.Outcome == outAccepted {
				r.anomaly(checkFinal, "%s: final read found nothing, but %s was accepted", key, p.OpID)
				break
			}
		}
		return "final: empty"
	}
	var w *Op
	for i, p := range puts {
		if p.Value == final.Value {
			w = &puts[i]
			break
		}
	}
	switch {
	case w == nil:
		r.anomaly(checkFinal, "%s: final value %q was never written", key, final.Value)
	case w.Outcome != outAccepted && w.Outcome != outUnknown:
		r.anomaly(checkFinal, "%s: final value %q comes from a write answered %s", key, final.Value, w.Outcome)
	case w.Token != final.Token:
		r.anomaly(checkFinal, "%s: final token %d, but the write of %q carried token %d", key, final.Token, final.Value, w.Token)
	case w.Outcome == outAccepted && !w.Duplicate && w.Revision > 0:
		if w.Revision != final.Revision {
			r.anomaly(checkFinal, "%s: final value %q at revision %d, but it was written at revision %d", key, final.Value, final.Revision, w.Revision)
		} else if last != nil && last.Revision > w.Revision {
			r.anomaly(checkFinal, "%s: final value %q (revision %d) is not the last accepted write: %s at revision %d", key, final.Value, w.Revision, last.OpID, last.Revision)
		}
	default:
		if last != nil && final.Revision <= last.Revision {
			r.anomaly(checkFinal, "%s: final value %q (revision %d) is older than %s accepted at revision %d", key, final.Value, final.Revision, last.OpID, last.Revision)
		}
	}
	return fmt.Sprintf("final value %q token %d", final.Value, final.Token)
}

// Porcupine model of a fenced register: state (value, token); put(v, t)
// is accepted iff t >= token, and then sets (v, t); get returns the state.

type regInput struct {
	Put   bool
	Value string
	Token uint64
}

type regOutput struct {
	Outcome     string // put: accepted, stale, unknown
	ResultToken uint64 // put: the register's token after the call
	CheckResult bool   // put: ResultToken is meaningful (not a duplicate's)
	Value       string // get
	Token       uint64 // get
	Found       bool   // get
}

type regState struct {
	Value string
	Token uint64
	Found bool
}

var registerModel = porcupine.Model{
	Init: func() interface{} { return regState{} },
	Step: func(state, input, output interface{}) (bool, interface{}) {
		s, in, out := state.(regState), input.(regInput), output.(regOutput)
		if !in.Put {
			return out.Found == s.Found && out.Value == s.Value && out.Token == s.Token, s
		}
		applied := regState{Value: in.Value, Token: in.Token, Found: true}
		switch out.Outcome {
		case outAccepted:
			if in.Token < s.Token || (out.CheckResult && out.ResultToken != in.Token) {
				return false, s
			}
			return true, applied
		case outStale:
			if in.Token >= s.Token || (out.CheckResult && out.ResultToken != s.Token) {
				return false, s
			}
			return true, s
		default: // unknown: it took effect here, as the register decides
			if in.Token >= s.Token {
				return true, applied
			}
			return true, s
		}
	},
	DescribeOperation: func(input, output interface{}) string {
		in, out := input.(regInput), output.(regOutput)
		if !in.Put {
			return fmt.Sprintf("get → %q/%d", out.Value, out.Token)
		}
		return fmt.Sprintf("put(%q, %d) → %s/%d", in.Value, in.Token, out.Outcome, out.ResultToken)
	},
	DescribeState: func(state interface{}) string {
		s := state.(regState)
		return fmt.Sprintf("%q/%d", s.Value, s.Token)
	},
}

// porcupineCheck checks one register's reads and writes with porcupine.
// An operation whose outcome is unknown may take effect at any time after
// its invocation (its return is at infinity).
func porcupineCheck(key string, ops []Op, r *report, vizDir string, timeout time.Duration) string {
	clients := make(map[string]int)
	var hist []porcupine.Operation
	for _, o := range ops {
		if o.Key != key {
			continue
		}
		var in regInput
		var out regOutput
		switch {
		case (o.Kind == kindGet || o.Kind == kindFinalGet) && o.Outcome == outOK:
			out = regOutput{Value: o.Value, Token: o.Token, Found: o.Found}
		case o.Kind == kindPut && (o.Outcome == outAccepted || o.Outcome == outStale || o.Outcome == outUnknown):
			in = regInput{Put: true, Value: o.Value, Token: o.Token}
			out = regOutput{Outcome: o.Outcome, ResultToken: o.ResultToken, CheckResult: !o.Duplicate && o.Outcome != outUnknown}
		default:
			continue
		}
		id, ok := clients[o.Client]
		if !ok {
			id = len(clients)
			clients[o.Client] = id
		}
		ret := o.Complete
		if !o.definite() {
			ret = math.MaxInt64
		}
		hist = append(hist, porcupine.Operation{ClientId: id, Input: in, Call: o.Invoke, Output: out, Return: ret})
	}
	started := time.Now()
	res := porcupine.CheckOperationsTimeout(registerModel, hist, timeout)
	took := time.Since(started).Round(time.Millisecond)
	switch res {
	case porcupine.Ok:
		return fmt.Sprintf("linearizable (%d ops, checked in %v)", len(hist), took)
	case porcupine.Illegal:
		msg := fmt.Sprintf("%s: the history of %d reads and writes is not linearizable", key, len(hist))
		if vizDir != "" {
			_, info := porcupine.CheckOperationsVerbose(registerModel, hist, timeout)
			path := filepath.Join(vizDir, key+"-linearizability.html")
			if err := porcupine.VisualizePath(registerModel, info, path); err == nil {
				msg += " (see " + path + ")"
			}
		}
		r.anomaly(checkLinearizable, "%s", msg)
		return fmt.Sprintf("NOT linearizable (%d ops)", len(hist))
	}
	r.warnings = append(r.warnings, fmt.Sprintf("%s: linearizability undecided after %v (%d ops)", key, timeout, len(hist)))
	return fmt.Sprintf("linearizability undecided (%d ops, %v)", len(hist), timeout)
}

// checkLateWrites reports what became of each frozen holder's late write.
func checkLateWrites(ops []Op, faults []Fault, r *report) {
	for _, f := range faults {
		if f.Kind != faultPause {
			continue
		}
		found := false
		for _, o := range ops {
			if o.Kind == kindPut && o.Client == f.Client && o.Token == f.Token && o.Invoke >= f.Start {
				found = true
				r.line("late write after %s at %s: %s with token %d → %s (register token %d)", f.Kind, at(f.Start), o.OpID, o.Token, o.Outcome, o.ResultToken)
			}
		}
		if !found {
			r.line("late write after %s at %s: %s never wrote with token %d", f.Kind, at(f.Start), f.Client, f.Token)
		}
	}
}
