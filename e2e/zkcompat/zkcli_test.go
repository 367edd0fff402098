package zkcompat

import (
	"bytes"
	"context"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// zkCliRun runs one zkCli.sh command against s and returns its exit code
// and what it printed (stdout, then stderr), without the connection
// banner and log lines.
func zkCliRun(t *testing.T, s *server, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, zkCli, append([]string{"-server", s.Addr}, args...)...)
	cmd.SysProcAttr = procAttr()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("zkCli.sh %v: %v", args, err)
	}
	var lines []string
	for _, l := range strings.Split(out.String()+"\n"+errOut.String(), "\n") {
		if l = strings.TrimSpace(l); l == "" || l == "WATCHER::" || strings.HasPrefix(l, "WatchedEvent state:") ||
			strings.HasPrefix(l, "Connecting to ") || strings.HasPrefix(l, "SLF4J:") || strings.HasPrefix(l, "log4j:") ||
			strings.Contains(l, " INFO ") || strings.Contains(l, " WARN ") {
			continue
		}
		lines = append(lines, l)
	}
	return code, strings.Join(lines, "\n")
}

// volatile are zkCli's stat lines whose values differ between any two
// servers (times, zxids, session ids).
var volatile = regexp.MustCompile(`(?m)^(cZxid|mZxid|pZxid|ctime|mtime|ephemeralOwner) = .*$`)

// TestZkCli drives zkCli.sh's create/get/set/ls/delete/stat, with their
// error cases, and checks what it prints and its exit codes; against
// Tenure the whole transcript (zxids and times masked) must equal
// ZooKeeper's.
func TestZkCli(t *testing.T) {
	var want string
	eachTarget(t, func(t *testing.T, s *server, r string) {
		steps := []struct {
			args []string
			code int
			has  []string // lines the output must hold
		}{
			{[]string{"create", r, "hello"}, 0, []string{"Created " + r}},
			{[]string{"create", r, "again"}, 1, []string{"Node already exists: " + r}},
			{[]string{"get", r}, 0, []string{"hello"}},
			{[]string{"set", r, "world"}, 0, nil},
			{[]string{"set", "-v", "7", r, "x"}, 1, []string{"version No is not valid : " + r}},
			{[]string{"get", "-s", r}, 0, []string{"world", "dataVersion = 1", "dataLength = 5", "numChildren = 0"}},
			{[]string{"stat", r}, 0, []string{"dataVersion = 1", "cversion = 0", "ephemeralOwner = 0x0"}},
			{[]string{"create", r + "/k1", "x"}, 0, []string{"Created " + r + "/k1"}},
			{[]string{"create", "-s", r + "/s-", "y"}, 0, []string{"Created " + r + "/s-0000000001"}},
			{[]string{"ls", r}, 0, []string{"[k1, s-0000000001]"}},
			{[]string{"ls", "-s", r}, 0, []string{"[k1, s-0000000001]", "cversion = 2", "numChildren = 2"}},
			{[]string{"delete", r}, 1, []string{"Node not empty: " + r}},
			{[]string{"delete", r + "/k1"}, 0, nil},
			{[]string{"delete", r + "/s-0000000001"}, 0, nil},
			{[]string{"delete", r + "/nope"}, 1, []string{"Node does not exist: " + r + "/nope"}},
			{[]string{"stat", r}, 0, []string{"cversion = 4", "numChildren = 0"}},
			{[]string{"delete", r}, 0, nil},
			{[]string{"get", r}, 1, []string{"Node does not exist: " + r}},
			{[]string{"stat", r}, 1, []string{"Node does not exist: " + r}},
		}
		var transcript []string
		for _, st := range steps {
			code, out := zkCliRun(t, s, st.args...)
			transcript = append(transcript, "$ zkCli "+strings.Join(st.args, " ")+"\n"+volatile.ReplaceAllString(out, "$1 = *"))
			if code != st.code {
				t.Errorf("zkCli %v: exit %d, want %d; output:\n%s", st.args, code, st.code, out)
			}
			for _, h := range st.has {
				if !containsLine(out, h) {
					t.Errorf("zkCli %v: no line %q in:\n%s", st.args, h, out)
				}
			}
		}
		compareZkCli(t, s, &want, strings.ReplaceAll(strings.Join(transcript, "\n"), r, "ROOT"))
	})
}

// compareZkCli keeps ZooKeeper's zkCli transcript in *want and reports
// true when s is ZooKeeper; for Tenure it checks that got equals it.
func compareZkCli(t *testing.T, s *server, want *string, got string) bool {
	t.Helper()
	if s.Name == zooKeeper {
		*want = got
		t.Logf("ZooKeeper's transcript:\n%s", got)
		return true
	}
	if *want == "" {
		t.Fatal("no ZooKeeper transcript to compare with")
	}
	if d := diffLines(strings.Split(*want, "\n"), strings.Split(got, "\n")); d != "" {
		t.Errorf("zkCli's output differs from ZooKeeper's (- ZooKeeper, + Tenure):\n%s", d)
	}
	return false
}

func containsLine(out, line string) bool {
	for _, l := range strings.Split(out, "\n") {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}

// TestZkCliOperator drives the zkCli.sh commands an operator reaches for
// beyond the basic ones: ephemeral and container creates, ls -R,
// getAllChildrenNumber, getEphemerals, setAcl/getAcl and a write the ACL
// refuses, sync, whoami, config and deleteall. Each runs in a zkCli
// process (a session) of its own; against Tenure the whole transcript
// (zxids and times masked) and every exit code must equal ZooKeeper's.
func TestZkCliOperator(t *testing.T) {
	var want string
	var wantCodes []int
	eachTarget(t, func(t *testing.T, s *server, r string) {
		steps := [][]string{
			{"create", r, ""},
			{"create", "-e", r + "/e", "x"},
			{"create", "-c", r + "/c"},
			{"create", r + "/c/child", "v"},
			{"ls", "-R", r},
			{"getAllChildrenNumber", r},
			{"getEphemerals", r},
			{"setAcl", r + "/c/child", "world:anyone:r"},
			{"getAcl", r + "/c/child"},
			{"set", r + "/c/child", "w"},
			{"get", r + "/c/child"},
			{"sync", r},
			{"whoami"},
			{"config"},
			{"deleteall", r},
			{"ls", r},
		}
		var transcript []string
		var codes []int
		for _, st := range steps {
			code, out := zkCliRun(t, s, st...)
			codes = append(codes, code)
			transcript = append(transcript, "$ zkCli "+strings.Join(st, " ")+" (exit "+strconv.Itoa(code)+")\n"+volatile.ReplaceAllString(out, "$1 = *"))
		}
		if compareZkCli(t, s, &want, strings.ReplaceAll(strings.Join(transcript, "\n"), r, "ROOT")) {
			wantCodes = codes
			return
		}
		if !slices.Equal(codes, wantCodes) {
			t.Errorf("exit codes %v, ZooKeeper's %v", codes, wantCodes)
		}
	})
}
