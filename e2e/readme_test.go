package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// tourBlock is one ```sh block of README's tour with the output it
// promises: every "# ..." line at the start of a line is an expected
// output line.
type tourBlock struct {
	code   string
	expect []string
}

// readmeTour returns the ```sh blocks of README.md between the tour's
// heading and the next top-level section.
func readmeTour(t *testing.T) []tourBlock {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	start := strings.Index(s, "\n## Five-minute tour")
	if start < 0 {
		t.Fatal("README.md has no tour section")
	}
	s = s[start+1:]
	if end := strings.Index(s, "\n## CLI"); end >= 0 {
		s = s[:end]
	}
	var blocks []tourBlock
	for {
		i := strings.Index(s, "```sh\n")
		if i < 0 {
			break
		}
		s = s[i+len("```sh\n"):]
		j := strings.Index(s, "```\n")
		if j < 0 {
			t.Fatal("README.md: unterminated ```sh block")
		}
		var blk tourBlock
		var code []string
		for _, line := range strings.Split(s[:j], "\n") {
			if strings.HasPrefix(line, "# ") {
				blk.expect = append(blk.expect, strings.TrimPrefix(line, "# "))
				continue
			}
			code = append(code, line)
		}
		blk.code = strings.Join(code, "\n")
		blocks = append(blocks, blk)
		s = s[j+len("```\n"):]
	}
	if len(blocks) < 5 {
		t.Fatalf("README.md tour: found only %d sh blocks", len(blocks))
	}
	return blocks
}

// TestReadmeTour runs README's tour as a reader would: every block in
// order, in one shell, in a fresh directory, against a server started as
// the first block says. Each block must end with status 0 and print what
// its comments promise, in that order (promised: numbers that vary are
// any number, exit statuses are exact). Then it runs again against the same server and
// data, as a reader trying it a second time would.
func TestReadmeTour(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the tour against a real server (about 20 s)")
	}
	blocks := readmeTour(t)
	if !strings.Contains(blocks[0].code, "go build -o bin/tenure ./cmd/tenure") || !strings.Contains(blocks[0].code, "bin/tenure serve") {
		t.Fatalf("the tour's first block should build bin/tenure and start it:\n%s", blocks[0].code)
	}
	work := t.TempDir()
	if err := os.Mkdir(filepath.Join(work, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(binDir, "tenure"), filepath.Join(work, "bin", "tenure")); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	startServer(t, addr, filepath.Join(work, "data"))

	for round := 1; round <= 2; round++ {
		t.Run(fmt.Sprintf("round%d", round), func(t *testing.T) {
			var script strings.Builder
			script.WriteString("cd " + work + "\n")
			for i, b := range blocks[1:] {
				fmt.Fprintf(&script, "echo '@@begin %d'\n%s\necho \"@@end %d $?\"\n", i+1, b.code, i+1)
			}
			cmd := exec.Command("bash", "-c", script.String())
			cmd.Env = env(addr)
			cmd.Dir = work
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// Whatever the tour left running (it starts background holders) ends
			// with it: they are all in the shell's process group.
			defer killGroup(cmd.Process.Pid, syscall.SIGKILL)
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			var err error
			select {
			case err = <-done:
			case <-time.After(2 * time.Minute):
				killGroup(cmd.Process.Pid, syscall.SIGKILL)
				<-done
				t.Fatalf("the tour did not finish within 2 minutes:\n%s", out.String())
			}
			if err != nil {
				t.Fatalf("the tour's shell failed: %v\n%s", err, out.String())
			}
			text := out.String()
			for i, b := range blocks[1:] {
				n := i + 1
				begin := fmt.Sprintf("@@begin %d\n", n)
				bi := strings.Index(text, begin)
				endRe := regexp.MustCompile(fmt.Sprintf(`(?m)^@@end %d ([0-9]+)$`, n))
				m := endRe.FindStringSubmatchIndex(text)
				if bi < 0 || m == nil {
					t.Fatalf("block %d did not run to its end:\n%s", n, text)
				}
				section := text[bi+len(begin) : m[0]]
				if status := text[m[2]:m[3]]; status != "0" {
					t.Errorf("block %d ended with status %s:\n%s\noutput:\n%s", n, status, b.code, section)
				}
				if missing := promised(b.expect, section); missing != "" {
					t.Errorf("block %d promises %q (after the lines before it); it printed:\n%s", n, missing, section)
				}
			}
		})
	}
}
