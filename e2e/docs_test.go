package e2e

import (
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/pgtest"
)

// The documents' procedures are run as a reader would run them: their
// ```sh blocks, in order, in one shell, in a fresh directory that has
// bin/tenure (and nothing of tenure on PATH). Every "# ..." line at the
// start of a line in a block is output the block promises; each block
// must end with status 0 (a command expected to fail says so with
// `; echo "exit $?"` and a promised "# exit N" line). Loopback addresses
// the document names are each replaced by a free port of the test's own,
// the same one wherever the document repeats the address.

// docBlocks returns the ```sh blocks of file (relative to the repository
// root) from the line that starts with from up to the next line that
// starts with to ("" for the end of the file). A block indented under a
// list item counts, without its indentation.
func docBlocks(t *testing.T, file, from, to string) []tourBlock {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", file))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	start := -1
	for i, l := range lines {
		if start < 0 && strings.HasPrefix(l, from) {
			start = i + 1
			continue
		}
		if start >= 0 && to != "" && strings.HasPrefix(l, to) {
			lines = lines[:i]
			break
		}
	}
	if start < 0 {
		t.Fatalf("%s has no line starting with %q", file, from)
	}
	lines = lines[start:]
	var blocks []tourBlock
	for i := 0; i < len(lines); i++ {
		indent, ok := strings.CutSuffix(lines[i], "```sh")
		if !ok || strings.TrimSpace(indent) != "" {
			continue
		}
		var blk tourBlock
		var code []string
		for i++; ; i++ {
			if i == len(lines) {
				t.Fatalf("%s: unterminated ```sh block after %q", file, from)
			}
			l := strings.TrimPrefix(lines[i], indent)
			if l == "```" {
				break
			}
			if e, ok := strings.CutPrefix(l, "# "); ok {
				blk.expect = append(blk.expect, e)
				continue
			}
			code = append(code, l)
		}
		blk.code = strings.Join(code, "\n")
		blocks = append(blocks, blk)
	}
	if len(blocks) == 0 {
		t.Fatalf("%s: no ```sh block after %q", file, from)
	}
	return blocks
}

// docRun runs a document's blocks.
type docRun struct {
	t   *testing.T
	dir string   // the reader's directory: bin/tenure and what the blocks write
	env []string // the reader's environment
	// addrs maps each loopback address a document names to the test's own.
	addrs map[string]string
}

// newDocRun makes a fresh directory with bin/tenure and an environment
// without tenure on PATH, TENURE_ENDPOINT or TLS settings.
func newDocRun(t *testing.T) *docRun {
	t.Helper()
	d := &docRun{t: t, dir: t.TempDir(), addrs: map[string]string{}}
	if err := os.Mkdir(filepath.Join(d.dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(binDir, "tenure"), filepath.Join(d.dir, "bin", "tenure")); err != nil {
		t.Fatal(err)
	}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TENURE_") || strings.HasPrefix(kv, "TENURE_PG_DSN=") {
			d.env = append(d.env, kv)
		}
	}
	return d
}

// loopbackAddr is an address a document may name.
var loopbackAddr = regexp.MustCompile(`127\.0\.0\.1:[0-9]+`)

// localize replaces every loopback address in s by the test's own.
func (d *docRun) localize(s string) string {
	return loopbackAddr.ReplaceAllStringFunc(s, func(a string) string {
		if _, ok := d.addrs[a]; !ok {
			d.addrs[a] = freeAddr(d.t)
		}
		return d.addrs[a]
	})
}

// blockResult is what one block printed (stdout and stderr together) and
// its status.
type blockResult struct {
	out    string
	status string
}

// run runs blocks in order in one bash in d.dir, in a process group of
// its own that is killed when it is done (servers the blocks started in
// the background included), and returns what each printed. The whole
// run must end within limit.
func (d *docRun) run(blocks []tourBlock, limit time.Duration) []blockResult {
	t := d.t
	t.Helper()
	var script strings.Builder
	for i, b := range blocks {
		fmt.Fprintf(&script, "echo '@@begin %d'\n%s\necho \"@@end %d $?\"\n", i, d.localize(b.code), i)
	}
	outFile := filepath.Join(t.TempDir(), "out")
	out, err := os.Create(outFile)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd := exec.Command("bash", "-c", script.String())
	cmd.Dir, cmd.Env = d.dir, d.env
	// A file, not a pipe: servers left running in the background keep
	// their copy open, and Wait must not wait for them.
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	defer func() {
		// What the blocks left running ends with them: SIGTERM lets a
		// `tenure lock` stop its command's own group, then SIGKILL.
		killGroup(pgid, syscall.SIGTERM)
		killGroup(pgid, syscall.SIGCONT)
		deadline := time.Now().Add(5 * time.Second)
		for len(liveInGroup(t, pgid)) > 0 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		killGroup(pgid, syscall.SIGKILL)
	}()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	read := func() string { b, _ := os.ReadFile(outFile); return string(b) }
	select {
	case err = <-done:
	case <-time.After(limit):
		killGroup(pgid, syscall.SIGKILL)
		<-done
		t.Fatalf("the blocks did not finish within %v:\n%s", limit, read())
	}
	if err != nil {
		t.Fatalf("the shell failed: %v\n%s", err, read())
	}
	text := read()
	res := make([]blockResult, len(blocks))
	for i := range blocks {
		begin := fmt.Sprintf("@@begin %d\n", i)
		bi := strings.Index(text, begin)
		m := regexp.MustCompile(fmt.Sprintf(`(?m)^@@end %d ([0-9]+)$`, i)).FindStringSubmatchIndex(text)
		if bi < 0 || m == nil || m[0] < bi {
			t.Fatalf("block %d did not run to its end:\n%s\noutput:\n%s", i+1, blocks[i].code, text)
		}
		res[i] = blockResult{out: text[bi+len(begin) : m[0]], status: text[m[2]:m[3]]}
	}
	return res
}

// check fails the test for every block that did not end with status 0 or
// did not print what it promises, in the order it promises it.
func (d *docRun) check(name string, blocks []tourBlock, res []blockResult) {
	t := d.t
	t.Helper()
	for i, b := range blocks {
		t.Logf("%s, block %d printed:\n%s", name, i+1, res[i].out)
		if res[i].status != "0" {
			t.Errorf("%s, block %d ended with status %s:\n%s\noutput:\n%s", name, i+1, res[i].status, b.code, res[i].out)
			continue
		}
		var expect []string
		for _, e := range b.expect {
			expect = append(expect, d.localize(e))
		}
		if missing := promised(expect, res[i].out); missing != "" {
			t.Errorf("%s, block %d promises %q (after the lines before it); it printed:\n%s", name, i+1, missing, res[i].out)
		}
	}
}

var (
	// placeholder is what a promised line leaves open: <anything>, "..",
	// "..." or "…".
	placeholder = regexp.MustCompile(`<[^>]*>|\.\.\.?|…`)
	// exitStatus is a promised exit status, which is never left open.
	promisedExit = regexp.MustCompile(`\bexit(?:ed)?(?: status)? [0-9]+\b`)
	// figure is a number that differs from run to run.
	figure = regexp.MustCompile(`\b[0-9]+\b`)
	// either is a placeholder that names the values it allows: <4 or 3>.
	either = regexp.MustCompile(`^<([0-9]+(?: or [0-9]+)+)>$`)
)

// promisedLine is the pattern of one promised line: the line itself,
// each placeholder standing for any text, each number for any number
// except an exit status, and <A or B> for A or B.
func promisedLine(expect string) *regexp.Regexp {
	var re strings.Builder
	re.WriteString("^")
	literal := func(s string) {
		last := 0
		for _, m := range figure.FindAllStringIndex(s, -1) {
			re.WriteString(regexp.QuoteMeta(s[last:m[0]]))
			re.WriteString("[0-9]+")
			last = m[1]
		}
		re.WriteString(regexp.QuoteMeta(s[last:]))
	}
	plain := func(s string) {
		last := 0
		for _, m := range promisedExit.FindAllStringIndex(s, -1) {
			literal(s[last:m[0]])
			re.WriteString(regexp.QuoteMeta(s[m[0]:m[1]]))
			last = m[1]
		}
		literal(s[last:])
	}
	last := 0
	for _, m := range placeholder.FindAllStringIndex(expect, -1) {
		plain(expect[last:m[0]])
		if e := either.FindStringSubmatch(expect[m[0]:m[1]]); e != nil {
			re.WriteString("(?:" + strings.ReplaceAll(e[1], " or ", "|") + ")")
		} else {
			re.WriteString(".*")
		}
		last = m[1]
	}
	plain(expect[last:])
	re.WriteString("$")
	return regexp.MustCompile(re.String())
}

// promised returns the first of the expected lines that out does not
// have, each after the one before it; "" when it has them all.
func promised(expect []string, out string) string {
	lines := strings.Split(out, "\n")
	at := 0
	for _, e := range expect {
		re := promisedLine(e)
		for ; at < len(lines); at++ {
			if re.MatchString(strings.TrimRight(lines[at], " \t")) {
				break
			}
		}
		if at == len(lines) {
			return e
		}
		at++
	}
	return ""
}

func TestPromisedLine(t *testing.T) {
	for _, c := range []struct {
		expect, line string
		want         bool
	}{
		{"exit 3", "exit 3", true},
		{"exit 3", "exit 1", false},
		{"A's tenure lock exited 1", "A's tenure lock exited 1", true},
		{"A exit <4 or 3>", "A exit 3", true},
		{"A exit <4 or 3>", "A exit 1", false},
		{"sent reminder to acme (token 12)", "sent reminder to acme (token 7)", true},
		{`{"result":"stale","token":<tB>,...}`, `{"result":"stale","token":9,"accepted":9}`, true},
		{`{"result":"stale","token":<tB>,...}`, `{"result":"accepted","token":9}`, false},
		{`{"id":"n3","voter":true,..}`, `{"id":"n3","voter":false}`, false},
		{"secret: tnr_…", "secret: tnr_abc", true},
	} {
		if got := promisedLine(c.expect).MatchString(c.line); got != c.want {
			t.Errorf("%q against %q: %v, want %v", c.expect, c.line, got, c.want)
		}
	}
}

// TestSecurityWalkthroughAsWritten runs docs/security.md's walkthrough as
// written: certificates, three members with TLS and ACLs on one machine
// (each with its own HTTP address), the refusal before bootstrap, the
// bootstrap, the worker's fenced write and its two denials.
func TestSecurityWalkthroughAsWritten(t *testing.T) {
	blocks := docBlocks(t, "docs/security.md", "## Walkthrough", "## Snapshots")
	if len(blocks) < 7 {
		t.Fatalf("the walkthrough has %d sh blocks, want 7", len(blocks))
	}
	d := newDocRun(t)
	res := d.run(blocks, 3*time.Minute)
	d.check("docs/security.md", blocks, res)
	if b, err := os.ReadFile(filepath.Join(d.dir, "tenure-keys.json")); err != nil || !strings.Contains(string(b), `"cluster_id":`) {
		t.Errorf("tenure-keys.json: %q %v", b, err)
	}
}

// TestReadmeClusterAsWritten runs README's cluster sections as written: a
// 3-node cluster on one machine (each member with its own HTTP address),
// a member rebuilt from its peers after losing its data directory (the
// node started with --join first, then member rebuild), and a backup
// saved with mode 0600 and restored.
func TestReadmeClusterAsWritten(t *testing.T) {
	blocks := docBlocks(t, "README.md", "## Cluster mode", "## Go client")
	if len(blocks) != 3 {
		t.Fatalf("README's cluster sections have %d sh blocks, want 3", len(blocks))
	}
	d := newDocRun(t)
	res := d.run(blocks, 3*time.Minute)
	d.check("README.md", blocks, res)
}

// TestOperationsReplacingAMember runs docs/operations.md's member
// replacements as written, on a 3-node cluster with a lock held
// throughout: a member rebuilt after losing its data directory (the node
// started with --join first, then member rebuild), a member moved to a
// new id and address while it still runs, and a dead member replaced.
// The holder keeps its token and the key its value.
func TestOperationsReplacingAMember(t *testing.T) {
	blocks := docBlocks(t, "docs/operations.md", "## Replacing a member", "## Disaster recovery")
	if len(blocks) != 5 {
		t.Fatalf("Replacing a member has %d sh blocks, want 5", len(blocks))
	}
	d := newDocRun(t)
	res := d.run(blocks, 3*time.Minute)
	d.check("docs/operations.md", blocks, res)
}

// TestOperationsDisasterRecovery runs docs/operations.md's disaster
// recovery as written: a backup, a write after it, two of three members
// lost for good, the revision taken from the survivor, a fresh cluster
// with the backup restored above it: the backup's value and cluster id
// are back, every older token is stale and the next grant's is above
// them all.
func TestOperationsDisasterRecovery(t *testing.T) {
	blocks := docBlocks(t, "docs/operations.md", "## Disaster recovery", "")
	if len(blocks) != 6 {
		t.Fatalf("Disaster recovery has %d sh blocks, want 6", len(blocks))
	}
	d := newDocRun(t)
	res := d.run(blocks, 3*time.Minute)
	d.check("docs/operations.md", blocks, res)
}

// repoFarm makes d.dir stand for the repository's root, as the examples'
// READMEs are run ("from the repository root"): every top-level entry of
// the repository but bin/ is linked into it, so that `go build
// ./examples/X` builds the example while bin/ is the test's own.
func (d *docRun) repoFarm() {
	t := d.t
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		switch e.Name() {
		case "bin", ".git", "tenure-data":
			continue
		}
		if err := os.Symlink(filepath.Join(root, e.Name()), filepath.Join(d.dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
}

// TestExampleReadmesAsWritten runs the "Run it" sections of every
// examples/*/README.md as written, from a directory standing for the
// repository's root, against a server of the test's own (TENURE_ENDPOINT)
// and PostgreSQL in a schema of its own (TENURE_PG_DSN): the examples
// built with go build and run under bin/tenure, their promised lines and
// exit statuses (3 for a stale run) included.
func TestExampleReadmesAsWritten(t *testing.T) {
	if _, err := exec.LookPath("psql"); err != nil {
		t.Fatalf("examples/shard-owner's README runs psql, which is not installed (Debian: postgresql-client; .ci/run installs postgresql): %v", err)
	}
	readmes, err := filepath.Glob("../examples/*/README.md")
	if err != nil || len(readmes) < 3 {
		t.Fatalf("example READMEs %v %v", readmes, err)
	}
	for _, readme := range readmes {
		name := filepath.Base(filepath.Dir(readme))
		t.Run(name, func(t *testing.T) {
			file := filepath.Join("examples", name, "README.md")
			blocks := docBlocks(t, file, "## Run it", "## Flags")
			if name != "compaction" {
				blocks = docBlocks(t, file, "## Run it", "## Test")
			}
			d := newDocRun(t)
			d.repoFarm()
			addr := freeAddr(t)
			startServer(t, addr, filepath.Join(t.TempDir(), "data"))
			d.env = append(d.env, "TENURE_ENDPOINT="+addr, "TENURE_PG_DSN="+schemaDSN(t))
			// /tmp/segments (compaction) is the test's own directory.
			for i := range blocks {
				blocks[i].code = strings.ReplaceAll(blocks[i].code, "/tmp/segments", filepath.Join(d.dir, "segments"))
				for j, e := range blocks[i].expect {
					blocks[i].expect[j] = strings.ReplaceAll(e, "/tmp/segments", filepath.Join(d.dir, "segments"))
				}
			}
			res := d.run(blocks, 4*time.Minute)
			d.check(file, blocks, res)
		})
	}
}

// schemaDSN is the PostgreSQL connection string of a fresh schema
// (pgtest.Schema), in a form both pgx and psql read: the schema is
// selected with the options parameter.
func schemaDSN(t *testing.T) string {
	t.Helper()
	name := pgtest.Schema(t).RuntimeParams["search_path"]
	base := pgtest.DSN()
	if u, err := url.Parse(base); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set("options", "-csearch_path="+name)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return strings.TrimSpace(base) + " options='-csearch_path=" + name + "'"
}
