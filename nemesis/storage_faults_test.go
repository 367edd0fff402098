//go:build linux || darwin

package nemesis

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"go.etcd.io/bbolt"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

// Storage faults: a disk that fills up under a node, and a node restarted
// on a corrupted log, which must refuse to start and is then rebuilt from
// its peers (`tenure serve --join` and `tenure member rebuild`). What they
// find wrong is reported under these checks.
const (
	checkCorruptRefused = "corrupt-refused"  // a node restarted on a corrupted log exits non-zero with one line
	checkRebuilt        = "rebuilt"          // a member rebuilt from its peers catches up with them
	checkDiskRecovered  = "disk-recovered"   // a node whose disk was full serves again by itself once space is freed
	checkDiskAnswer     = "disk-full-answer" // a write refused for a full disk is answered RESOURCE_EXHAUSTED
)

const (
	// diskSize is each node's own file system (a sparse image: the host's
	// disk holds what the node writes). Every disk-full adds a segment of
	// about 64 MiB to every node's log, which is compacted only after a
	// snapshot, and raft takes one at the earliest 2 minutes after a start:
	// nodes restarted as often as here never do. 8 GiB lasts well over an
	// hour of the full schedule.
	diskSize = 8 << 30
	// walSegmentSize is raft-wal's segment size (its default): a node
	// needs new space on its disk for the log once the tail segment has
	// taken this much.
	walSegmentSize = 64 << 20
	// Log growth during disk-full: fillWriters writers of transactions of
	// fillKeys puts of fillValue bytes (under the KV value limit), about 1
	// MiB per entry, on the same keys each time, so the state stays small.
	fillKeys    = 16
	fillValue   = 60 << 10
	fillWriters = 4
	// diskFullHold is how long the disk stays full once the log has
	// needed space.
	diskFullHold = time.Second
	// fillBudget bounds the log growth; storageLimit how long a node may
	// take to refuse a corrupted log, to be rebuilt, or to catch up.
	fillBudget   = 15 * time.Second
	storageLimit = 30 * time.Second
)

// diskFull fills one node's file system (the leader the first time, then
// alternately a follower) with a ballast file, writes through the cluster
// until the node's log needs new space, keeps the disk full for
// diskFullHold, then removes the ballast. The node must then catch up by
// itself, without a restart; one that does not is an anomaly, and is
// restarted so that the run can go on.
func (nm *nemesis) diskFull() (*Fault, error) {
	if !nm.c.disks {
		return nil, nil
	}
	l, err := nm.c.waitLeader(nil, 10*time.Second)
	if err != nil {
		return nil, fmt.Errorf("no leader: %w", err)
	}
	target, role := l, "leader"
	if nm.injected[faultDiskFull]%2 == 1 {
		fs := nm.c.others(l)
		target, role = fs[nm.rnd.IntN(len(fs))], "follower"
	}
	start := nm.rec.now()
	f := &Fault{Kind: faultDiskFull, Target: target.id, Start: start}
	ballast := filepath.Join(target.disk, "ballast")
	defer os.Remove(ballast)
	filled, err := fillDisk(ballast)
	if err != nil {
		return nil, fmt.Errorf("filling %s's disk: %w", target.id, err)
	}
	room, err := walSegmentRoom(target.dataDir)
	if err != nil {
		return nil, fmt.Errorf("reading %s's log: %w", target.id, err)
	}
	grow := nm.growLog(room + 4<<20)
	for _, e := range slices.Sorted(maps.Keys(grow.diskErrs)) {
		f.Anomalies = append(f.Anomalies, anomaly{checkDiskAnswer, fmt.Sprintf("%d writes were answered %s while %s's disk was full; a write the full disk refused must be RESOURCE_EXHAUSTED", grow.diskErrs[e], e, target.id)})
	}
	pace(context.Background(), diskFullHold)
	_, leaderThen, _, serr := nm.c.statusOf(target)
	if err := os.Remove(ballast); err != nil {
		return nil, err
	}
	freed := nm.rec.now()
	f.Note = fmt.Sprintf("filled %s %s's disk (%d MiB ballast); wrote %s for its log to need space; ", role, target.id, filled>>20, grow)
	if serr != nil {
		f.Note += fmt.Sprintf("its status while full: %v; ", serr)
	} else {
		f.Note += fmt.Sprintf("it saw leader %q while full; ", leaderThen)
	}
	took, err := nm.c.waitCaughtUp(target, storageLimit)
	if err != nil {
		f.Anomalies = append(f.Anomalies, anomaly{checkDiskRecovered, fmt.Sprintf("%s did not serve again by itself within %v of freeing its disk: %v", target.id, storageLimit, err)})
		f.Note += "it did not catch up by itself; restarted"
		if kerr := nm.c.kill(target); kerr != nil {
			return f, kerr
		}
		f.End = nm.rec.now()
		return f, nm.restart(target)
	}
	f.End = nm.rec.now()
	f.Note += fmt.Sprintf("freed at %.2fs; it caught up %.2fs later", secs(freed), took.Seconds())
	return f, nil
}

// growResult is what growLog wrote and what the cluster answered.
type growResult struct {
	bytes    int64
	ok, fail int
	errs     map[string]int // failures by gRPC code and message
	// diskErrs: failures that name the full disk but are not
	// RESOURCE_EXHAUSTED, by code and message.
	diskErrs map[string]int
}

func (g growResult) String() string {
	s := fmt.Sprintf("%d MiB in %d transactions", g.bytes>>20, g.ok)
	if g.fail > 0 {
		var parts []string
		for _, e := range slices.Sorted(maps.Keys(g.errs)) {
			parts = append(parts, fmt.Sprintf("%dx %s", g.errs[e], e))
		}
		s += fmt.Sprintf(" (%d failed: %s)", g.fail, strings.Join(parts, "; "))
	}
	return s
}

// growLog writes about want bytes to the log through the cluster, from
// fillWriters writers at once, within fillBudget.
func (nm *nemesis) growLog(want int64) growResult {
	g := growResult{errs: make(map[string]int), diskErrs: make(map[string]int)}
	var mu sync.Mutex // guards g
	val := make([]byte, fillValue)
	deadline := time.Now().Add(fillBudget)
	var wg sync.WaitGroup
	for w := range fillWriters {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				mu.Lock()
				done := g.bytes >= want
				mu.Unlock()
				if done {
					return
				}
				var ops []client.Op
				for k := range fillKeys {
					ops = append(ops, client.OpPut(fmt.Sprintf("nemesis-fill-%d-%d", w, k), val))
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_, err := nm.c.admin.Txn(ctx, nil, ops, nil)
				cancel()
				mu.Lock()
				if err == nil {
					g.ok++
					g.bytes += fillKeys * fillValue
					mu.Unlock()
					continue
				}
				g.fail++
				msg := codeOf(err) + " " + err.Error()
				if len(msg) > 200 {
					msg = msg[:200] + "…"
				}
				g.errs[msg]++
				if strings.Contains(err.Error(), "no space left on device") && !errors.Is(err, client.ErrLimit) {
					g.diskErrs[msg]++
				}
				mu.Unlock()
				pace(context.Background(), 100*time.Millisecond)
			}
		})
	}
	wg.Wait()
	return g
}

// codeOf names the gRPC code a client error came from.
func codeOf(err error) string {
	for _, c := range []struct {
		err  error
		name string
	}{
		{client.ErrLimit, "RESOURCE_EXHAUSTED"}, {client.ErrUnknownOutcome, "UNKNOWN"}, {client.ErrUnavailable, "UNAVAILABLE"},
		{client.ErrInvalid, "INVALID_ARGUMENT"}, {context.DeadlineExceeded, "DEADLINE_EXCEEDED"},
	} {
		if errors.Is(err, c.err) {
			return c.name
		}
	}
	return "OTHER"
}

// walFrame is one entry frame of a raft-wal segment file.
type walFrame struct {
	off int64 // of the frame header
	len int   // of the payload
}

// walSegments lists the raft-wal segment files under dataDir, oldest
// first (their names start with the zero-padded base index).
func walSegments(dataDir string) ([]string, error) {
	segs, err := filepath.Glob(filepath.Join(dataDir, "raft", "wal", "*.wal"))
	sort.Strings(segs)
	return segs, err
}

// walEntryFrames parses a raft-wal segment: a 32-byte file header, then
// frames of an 8-byte header (type, 3 reserved bytes, length, or a CRC
// for a commit frame) and a payload padded to 8 bytes, until an all-zero
// header. It returns the entry frames and where the written data ends.
func walEntryFrames(path string) ([]walFrame, int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, err
	}
	const (
		fileHeader  = 32
		frameHeader = 8
		entry       = 1
		index       = 2
		commit      = 3
	)
	var frames []walFrame
	off := int64(fileHeader)
	for off+frameHeader <= int64(len(b)) {
		typ := b[off]
		n := int64(binary.LittleEndian.Uint32(b[off+4 : off+8]))
		switch typ {
		case 0:
			return frames, off, nil
		case commit:
			off += frameHeader
			continue
		case entry, index:
		default:
			return frames, off, fmt.Errorf("%s: frame of unknown type %d at offset %d", path, typ, off)
		}
		if typ == entry {
			frames = append(frames, walFrame{off: off, len: int(n)})
		}
		off += frameHeader + n + (8-n%8)%8
	}
	return frames, off, nil
}

// walSegmentRoom is how many more bytes the newest segment under dataDir
// takes before raft-wal needs a new one (0 without a raft-wal log).
func walSegmentRoom(dataDir string) (int64, error) {
	segs, err := walSegments(dataDir)
	if err != nil || len(segs) == 0 {
		return 0, err
	}
	_, end, err := walEntryFrames(segs[len(segs)-1])
	return max(0, walSegmentSize-end), err
}

// corruptLog flips 16 bytes in the middle of the payload of a log entry of
// at least 96 bytes (there the payload is the command: after varints of
// index, term and type and the data's length, before the 16-byte append
// time), chosen in the later half of the newest raft-wal segment that
// holds one. It says what it did.
func corruptLog(dataDir string, rnd *rand.Rand) (string, error) {
	if db := filepath.Join(dataDir, "raft", "raft.db"); fileExists(db) {
		return corruptBolt(db, rnd)
	}
	segs, err := walSegments(dataDir)
	if err != nil {
		return "", err
	}
	for i := len(segs) - 1; i >= 0; i-- {
		frames, _, err := walEntryFrames(segs[i])
		if err != nil {
			return "", err
		}
		var big []walFrame
		for _, fr := range frames {
			if fr.len >= 96 {
				big = append(big, fr)
			}
		}
		if len(big) == 0 {
			continue
		}
		k := len(big)/2 + rnd.IntN((len(big)+1)/2)
		fr := big[k]
		at := fr.off + 8 + int64(fr.len/2) - 8
		if err := flipBytes(segs[i], at, 16); err != nil {
			return "", err
		}
		return fmt.Sprintf("flipped 16 bytes at offset %d of %s (in entry %d of the %d of 96 bytes or more there, a %d-byte entry)",
			at, filepath.Base(segs[i]), k+1, len(big), fr.len), nil
	}
	return "", fmt.Errorf("no raft-wal segment under %s holds an entry of 96 bytes or more", dataDir)
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// corruptBolt flips 16 bytes in the middle of one log entry of 96 bytes or
// more of a raft-boltdb file, at every place the file holds that entry (a
// page freed by an earlier write may hold an old copy), as a disk that
// damages a page would.
func corruptBolt(path string, rnd *rand.Rand) (string, error) {
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		return "", err
	}
	var big [][]byte
	err = db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte("logs"))
		if b == nil {
			return errors.New("no logs bucket")
		}
		return b.ForEach(func(_, v []byte) error {
			if len(v) >= 96 {
				big = append(big, append([]byte(nil), v...))
			}
			return nil
		})
	})
	db.Close()
	if err != nil {
		return "", err
	}
	if len(big) == 0 {
		return "", fmt.Errorf("%s holds no entry of 96 bytes or more", path)
	}
	entry := big[len(big)/2+rnd.IntN((len(big)+1)/2)]
	file, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var at []int64
	for off := 0; ; {
		i := bytes.Index(file[off:], entry)
		if i < 0 {
			break
		}
		at = append(at, int64(off+i+len(entry)/2-8))
		off += i + len(entry)
	}
	if len(at) == 0 {
		return "", fmt.Errorf("entry not found in %s (it spans pages)", path)
	}
	for _, a := range at {
		if err := flipBytes(path, a, 16); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("flipped 16 bytes in the middle of a %d-byte entry of %s (%d copies in the file)", len(entry), filepath.Base(path), len(at)), nil
}

// flipBytes inverts n bytes of path at offset and syncs the file.
func flipBytes(path string, offset int64, n int) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, offset); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	for i := range b {
		b[i] ^= 0xff
	}
	if _, err := f.WriteAt(b, offset); err != nil {
		return err
	}
	return f.Sync()
}

// corruptRestart stops a follower, corrupts its log and starts it again:
// it must refuse to start, exiting non-zero with one line saying why. Then
// it is rebuilt from its peers, as an operator would: an empty data
// directory, `tenure serve --join`, and `tenure member rebuild` against the
// others; it must catch up with them.
func (nm *nemesis) corruptRestart() (*Fault, error) {
	l, err := nm.c.waitLeader(nil, 10*time.Second)
	if err != nil {
		return nil, fmt.Errorf("no leader: %w", err)
	}
	fs := nm.c.others(l)
	nd := fs[nm.rnd.IntN(len(fs))]
	start := nm.rec.now()
	nd.p.stop(5 * time.Second)
	nd.lastErr = nd.p.stderr()
	what, err := corruptLog(nd.dataDir, nm.rnd)
	if err != nil {
		return nil, fmt.Errorf("corrupting %s's log: %w", nd.id, err)
	}
	f := &Fault{Kind: faultCorrupt, Target: nd.id, Start: start}
	refusal, bad := nm.c.startRefused(nd, storageLimit)
	if bad != "" {
		f.Anomalies = append(f.Anomalies, anomaly{checkCorruptRefused, fmt.Sprintf("%s, after the corruption (%s)", bad, what)})
		f.Note = fmt.Sprintf("stopped follower %s; %s; %s; ", nd.id, what, bad)
	} else {
		f.Note = fmt.Sprintf("stopped follower %s; %s; it refused to start: %q; ", nd.id, what, refusal)
	}
	took, err := nm.c.rebuild(nd)
	if err != nil {
		f.End = nm.rec.now()
		f.Note += "rebuilding it failed"
		return f, fmt.Errorf("rebuilding %s: %w", nd.id, err)
	}
	caught, err := nm.c.waitCaughtUp(nd, storageLimit)
	f.End = nm.rec.now()
	f.Note += fmt.Sprintf("rebuilt from its peers (member rebuild took %.2fs)", took.Seconds())
	if err != nil {
		f.Anomalies = append(f.Anomalies, anomaly{checkRebuilt, fmt.Sprintf("%s, rebuilt, did not catch up within %v: %v", nd.id, storageLimit, err)})
		return f, nil
	}
	f.Note += fmt.Sprintf("; caught up %.2fs after it", caught.Seconds())
	return f, nil
}

// waitPorts waits until nd's ports can be bound again.
func (c *cluster) waitPorts(nd *node) error {
	return testutil.PollUntil(10*time.Second, func() (bool, error) { return canBind(nd.addr) && canBind(nd.peer), nil })
}

// startRefused starts nd, which must refuse to start: exit non-zero
// within d, its last line on stderr "tenure: ...", and no panic. It
// returns that line, or what went wrong instead (a node that serves is
// killed).
func (c *cluster) startRefused(nd *node, d time.Duration) (line, bad string) {
	if err := c.waitPorts(nd); err != nil {
		return "", fmt.Sprintf("its ports stayed in use: %v", err)
	}
	if err := c.start(nd); err != nil {
		return "", err.Error()
	}
	served := "tenure: serving on " + nd.addr
	_ = testutil.PollUntil(d, func() (bool, error) { return nd.p.exited() || strings.HasPrefix(nd.p.stdout(), served), nil })
	if !nd.p.exited() {
		what := fmt.Sprintf("it neither refused nor served within %v", d)
		if strings.HasPrefix(nd.p.stdout(), served) {
			what = "it started and served"
		}
		_ = c.kill(nd)
		return "", what
	}
	nd.lastErr = nd.p.stderr()
	lines := strings.Split(strings.TrimRight(nd.lastErr, "\n"), "\n")
	line = lines[len(lines)-1]
	switch {
	case nd.p.status == 0:
		return line, "it exited with status 0"
	case nd.p.status >= 128:
		return line, fmt.Sprintf("it died of signal %d", nd.p.status-128)
	case strings.Contains(nd.lastErr, "panic:") || strings.Contains(nd.lastErr, "goroutine "):
		return line, fmt.Sprintf("it panicked (exit %d): %s", nd.p.status, tail(nd.lastErr, 3))
	case !strings.HasPrefix(line, "tenure: "):
		return line, fmt.Sprintf("it exited %d without a one-line reason: last line %q", nd.p.status, line)
	}
	return line, ""
}

// rebuild rebuilds nd from its peers the way docs/architecture.md tells an
// operator to: its data directory emptied (an operator moves it aside),
// `tenure serve --join`, then `tenure member rebuild ID PEER_ADDR` against
// the other members. It returns how long the rebuild command took.
func (c *cluster) rebuild(nd *node) (time.Duration, error) {
	if err := os.RemoveAll(nd.dataDir); err != nil {
		return 0, err
	}
	nd.join = true
	if err := c.waitPorts(nd); err != nil {
		return 0, err
	}
	if err := c.start(nd); err != nil {
		return 0, err
	}
	waiting := "tenure: node " + nd.id + " has no state and waits to be added"
	if err := testutil.PollUntil(storageLimit, func() (bool, error) {
		if nd.p.exited() {
			return false, fmt.Errorf("%s --join exited %d: %s", nd.id, nd.p.status, tail(nd.p.stderr(), 5))
		}
		return strings.Contains(nd.p.stderr(), waiting), nil
	}); err != nil {
		return 0, err
	}
	var others []string
	for _, o := range c.others(nd) {
		others = append(others, o.addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*storageLimit)
	defer cancel()
	began := time.Now()
	cmd := exec.CommandContext(ctx, tenureBin, "member", "rebuild", nd.id, nd.peer, "--endpoint", strings.Join(others, ","),
		"--timeout", storageLimit.String(), "-o", "json")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	took := time.Since(began)
	if err != nil {
		return took, fmt.Errorf("tenure member rebuild: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	var res struct {
		Members []struct {
			ID    string `json:"id"`
			Voter bool   `json:"voter"`
		} `json:"members"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return took, fmt.Errorf("tenure member rebuild printed %q: %v", out, err)
	}
	voters, ndVoter := 0, false
	for _, m := range res.Members {
		if m.Voter {
			voters++
			ndVoter = ndVoter || m.ID == nd.id
		}
	}
	if voters != len(c.nodes) || !ndVoter {
		return took, fmt.Errorf("after tenure member rebuild the members are %s; want all %d voters", out, len(c.nodes))
	}
	return took, c.waitReady(nd, storageLimit)
}

// waitCaughtUp waits until nd has applied every entry the other live
// nodes had applied when it was called, and returns how long that took.
func (c *cluster) waitCaughtUp(nd *node, d time.Duration) (time.Duration, error) {
	began := time.Now()
	var goal uint64
	for _, o := range c.others(nd) {
		if c.alive(o) {
			if idx, err := c.appliedOf(o); err == nil {
				goal = max(goal, idx)
			}
		}
	}
	var have uint64
	var last error
	err := testutil.PollUntil(d, func() (bool, error) {
		have, last = c.appliedOf(nd)
		return last == nil && have >= goal, nil
	})
	if err != nil {
		if last != nil {
			return time.Since(began), fmt.Errorf("%w (last status: %v)", err, last)
		}
		return time.Since(began), fmt.Errorf("%w: applied index %d, the others had %d", err, have, goal)
	}
	return time.Since(began), nil
}

// appliedOf asks nd alone for its applied log index.
func (c *cluster) appliedOf(nd *node) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	st, err := nd.status.Status(ctx)
	if err != nil {
		return 0, err
	}
	return st.GetAppliedIndex(), nil
}
