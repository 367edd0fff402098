package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

type leaderLine struct {
	Leader string `json:"leader"`
	Value  string `json:"value"`
	Token  uint64 `json:"token"`
}

// TestElectionFailoverOnSIGKILL: the leader's `tenure elect` is SIGKILLed;
// after its session expires the other candidate leads with a larger token,
// and an observer sees the whole sequence.
func TestElectionFailoverOnSIGKILL(t *testing.T) {
	dir := t.TempDir()
	addr := freeAddr(t)
	startServer(t, addr, filepath.Join(dir, "data"))
	obs := start(t, "observer", addr, "elect", "sched", "--observe", "-o", "json")
	candidate := func(name string) *proc {
		script := fmt.Sprintf(`echo $$ > %[1]s/pid%[2]s; echo $TENURE_FENCE_TOKEN > %[1]s/tok%[2]s.tmp && mv %[1]s/tok%[2]s.tmp %[1]s/tok%[2]s; exec sleep 600`, dir, name)
		return start(t, name, addr, "elect", "sched", "value-"+name, "--owner", name, "--ttl", "2s", "--", "sh", "-c", script)
	}
	token := func(name string) uint64 {
		n, err := strconv.ParseUint(strings.TrimSpace(readFile(t, filepath.Join(dir, "tok"+name), 30*time.Second)), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	a := candidate("A")
	tA := token("A")
	candidate("B")
	t.Cleanup(func() { // the commands our candidates started
		for _, n := range []string{"A", "B"} {
			if b, err := os.ReadFile(filepath.Join(dir, "pid"+n)); err == nil {
				if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
	})
	if err := a.cmd.Process.Kill(); err != nil { // SIGKILL: no release, no close
		t.Fatal(err)
	}
	tB := token("B")
	if tB <= tA {
		t.Fatalf("new leader token %d not above %d", tB, tA)
	}
	var lines []leaderLine
	testutil.WaitFor(t, "the observer to report B", 30*time.Second, func() bool {
		lines = lines[:0]
		for _, s := range strings.Split(strings.TrimSpace(obs.stdout()), "\n") {
			var l leaderLine
			if json.Unmarshal([]byte(s), &l) == nil {
				lines = append(lines, l)
			}
		}
		return len(lines) > 0 && lines[len(lines)-1].Leader == "B"
	})
	var sawA, sawNone bool
	for _, l := range lines {
		switch {
		case l.Leader == "A" && l.Token == tA && l.Value == "value-A":
			sawA = true
		case l.Leader == "" && sawA:
			sawNone = true
		}
	}
	last := lines[len(lines)-1]
	if !sawA || !sawNone || last.Token != tB || last.Value != "value-B" {
		t.Fatalf("observed %+v; want A (token %d), then none, then B (token %d)", lines, tA, tB)
	}
}

// TestObserverFollowsAcrossNodeFailure: `tenure elect --observe` follows
// an election through the leader node of three (observations are served by
// the leader); that node is SIGKILLed. The observer moves to another node
// by itself and reports the election leader's next value, instead of ending.
func TestObserverFollowsAcrossNodeFailure(t *testing.T) {
	ms := startCluster(t, 3)
	obs := start(t, "observer", endpoints(ms), "elect", "jobs", "--observe", "-o", "json")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := dial(t, ctx, endpoints(ms))
	s, err := c.NewSession(ctx, client.WithTTL(10*time.Second), client.WithOwner("A"))
	if err != nil {
		t.Fatal(err)
	}
	e, err := s.Election("jobs")
	if err != nil {
		t.Fatal(err)
	}
	h, err := e.Campaign(ctx, []byte("v1"))
	if err != nil {
		t.Fatal(err)
	}
	observed := func() []leaderLine {
		var lines []leaderLine
		for _, s := range strings.Split(strings.TrimSpace(obs.stdout()), "\n") {
			var l leaderLine
			if json.Unmarshal([]byte(s), &l) == nil {
				lines = append(lines, l)
			}
		}
		return lines
	}
	lastIs := func(value string) func() bool {
		return func() bool {
			lines := observed()
			return len(lines) > 0 && lines[len(lines)-1].Leader == "A" && lines[len(lines)-1].Value == value
		}
	}
	testutil.WaitFor(t, "the observer to report A=v1", 30*time.Second, lastIs("v1"))

	leader, _ := leaderOf(t, ctx, c, ms)
	if err := leader.p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-leader.p.done
	if err := e.Proclaim(ctx, h, []byte("v2")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the observer to report A=v2 after its node died", 30*time.Second, lastIs("v2"))
	if obs.exited() {
		t.Fatalf("observer ended: %s", obs.stderr())
	}
	for _, l := range observed() {
		if l.Leader == "A" && l.Token != h.Token() {
			t.Fatalf("observed token %d, the leader's is %d", l.Token, h.Token())
		}
	}
}
