//go:build linux || darwin

package nemesis

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"sync"
)

// Operation kinds.
const (
	kindAcquire  = "acquire"   // lock granted (Token) or not
	kindGet      = "get"       // FencedGet during the run
	kindPut      = "put"       // FencedPut with the hold's token
	kindRelease  = "release"   // Unlock, or the end of a `tenure lock` process
	kindFinalGet = "final-get" // FencedGet after the faults were healed
)

// Outcomes.
const (
	outOK       = "ok"       // acquire, get, release succeeded
	outFail     = "fail"     // definitely had no effect (or, for a get, no answer)
	outAccepted = "accepted" // put applied (now, or first time for a Duplicate)
	outStale    = "stale"    // put refused: token below the accepted one
	outUnknown  = "unknown"  // put may or may not have been applied
	outLost     = "lost"     // release found the grant already gone
)

// never is the Complete time of an operation whose outcome is unknown: it
// may take effect at any time after its invocation.
const never = -1

// Op is one client operation in the history. Times are nanoseconds since
// the run began, on the monotonic clock.
type Op struct {
	Index    int    `json:"index"`
	Client   string `json:"client"`
	Kind     string `json:"kind"`
	Key      string `json:"key"` // register key, or lock name for acquire/release
	Invoke   int64  `json:"invoke_ns"`
	Complete int64  `json:"complete_ns"` // never (-1): outcome unknown
	Outcome  string `json:"outcome"`
	// Token: acquire: the grant's token; put: the token sent; get: the
	// register's token read.
	Token uint64 `json:"token,omitempty"`
	// Value: put: the value written (unique per put: its operation id);
	// get: the value read.
	Value string `json:"value,omitempty"`
	Found bool   `json:"found,omitempty"`
	OpID  string `json:"op_id,omitempty"`
	// ResultToken: put: the register's accepted token after the call.
	ResultToken uint64 `json:"result_token,omitempty"`
	// Revision: put accepted and not a duplicate: the revision of the
	// write; get: the register's mod revision.
	Revision  uint64 `json:"revision,omitempty"`
	Duplicate bool   `json:"duplicate,omitempty"`
	Attempts  int    `json:"attempts,omitempty"`
	Note      string `json:"note,omitempty"`
	Err       string `json:"error,omitempty"`
}

// definite reports whether the operation completed with a known outcome.
func (o Op) definite() bool { return o.Complete != never && o.Outcome != outUnknown }

// Fault is one fault the nemesis injected, from injection to heal.
type Fault struct {
	Kind   string `json:"fault"`
	Target string `json:"target,omitempty"`
	Start  int64  `json:"start_ns"`
	End    int64  `json:"end_ns"`
	Note   string `json:"note,omitempty"`
	// Client, Key, Token: pause-holder only: whose hold was frozen.
	Client string `json:"client,omitempty"`
	Key    string `json:"key,omitempty"`
	Token  uint64 `json:"token,omitempty"`
	// Failover: kill-leader, partition-leader, pause-leader: how long
	// after the fault began another node said it led (0: none did).
	Failover int64 `json:"failover_ns,omitempty"`
	// Anomalies: what the fault itself found wrong (a node that started
	// on a corrupted log, or stayed stuck after its disk had room again).
	Anomalies []anomaly `json:"anomalies,omitempty"`
}

// recorder collects the history. It is safe for concurrent use.
type recorder struct {
	base int64 // monoNow() when the run began

	// mu guards the fields below.
	mu     sync.Mutex
	ops    []Op
	faults []Fault
}

func newRecorder() *recorder { return &recorder{base: monoNow()} }

// now is the time since the run began.
func (r *recorder) now() int64 { return monoNow() - r.base }

// since converts a raw monoNow() reading (for example from a helper
// process) to time since the run began.
func (r *recorder) since(raw int64) int64 { return raw - r.base }

func (r *recorder) add(op Op) {
	r.mu.Lock()
	op.Index = len(r.ops)
	r.ops = append(r.ops, op)
	r.mu.Unlock()
}

func (r *recorder) addFault(f Fault) {
	r.mu.Lock()
	r.faults = append(r.faults, f)
	r.mu.Unlock()
}

// snapshot returns copies of the operations and faults recorded so far.
func (r *recorder) snapshot() ([]Op, []Fault) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Op(nil), r.ops...), append([]Fault(nil), r.faults...)
}

// opLine and faultLine are the two kinds of line in the history file.
type opLine struct {
	Type string `json:"type"` // "op"
	Op
}

type faultLine struct {
	Type string `json:"type"` // "fault"
	Fault
}

// writeHistory writes ops and faults as JSON lines, in invocation order.
func writeHistory(path string, ops []Op, faults []Fault) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	type line struct {
		at int64
		v  any
	}
	lines := make([]line, 0, len(ops)+len(faults))
	for _, o := range ops {
		lines = append(lines, line{o.Invoke, opLine{"op", o}})
	}
	for _, f := range faults {
		lines = append(lines, line{f.Start, faultLine{"fault", f}})
	}
	sort.SliceStable(lines, func(a, b int) bool { return lines[a].at < lines[b].at })
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for _, l := range lines {
		if err := enc.Encode(l.v); err != nil {
			f.Close()
			return err
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
