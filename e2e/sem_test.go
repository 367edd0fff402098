package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/testutil"
)

type semStatus struct {
	Name    string   `json:"name"`
	Limit   int      `json:"limit"`
	Holders []holder `json:"holders"`
	Waiters int      `json:"waiters"`
}

// TestSemaphoreTwoOfThree: a semaphore of 2 with 3 CLI holders; the third
// waits until one of the first two finishes, and gets a larger token.
func TestSemaphoreTwoOfThree(t *testing.T) {
	dir := t.TempDir()
	addr := freeAddr(t)
	startServer(t, addr, filepath.Join(dir, "data"))
	var procs []*proc
	for i := 0; i < 3; i++ {
		script := fmt.Sprintf(`echo $TENURE_FENCE_TOKEN > %[1]s/token%[2]d.tmp && mv %[1]s/token%[2]d.tmp %[1]s/token%[2]d
while [ ! -e %[1]s/done%[2]d ]; do sleep 0.05; done`, dir, i)
		procs = append(procs, start(t, fmt.Sprintf("holder%d", i), addr, "sem", "pool", "--limit", "2", "--ttl", "5s", "--", "sh", "-c", script))
		if i < 2 { // the first two get in, in order
			readFile(t, filepath.Join(dir, fmt.Sprintf("token%d", i)), 20*time.Second)
		}
	}
	var st semStatus
	testutil.WaitFor(t, "the third holder to queue", 20*time.Second, func() bool {
		tenureJSON(t, addr, 0, &st, "sem", "status", "pool")
		return st.Waiters == 1
	})
	if st.Limit != 2 || len(st.Holders) != 2 {
		t.Fatalf("status %+v", st)
	}
	if _, err := os.Stat(filepath.Join(dir, "token2")); err == nil {
		t.Fatal("the third holder runs while two permits are held")
	}
	// Another limit for the same name is refused.
	if r := tenure(t, addr, "sem", "pool", "--limit", "3", "--", "true"); r.code != 1 || !strings.Contains(r.stderr, "permit") {
		t.Fatalf("other limit: exit %d, %q", r.code, r.stderr)
	}

	if err := os.WriteFile(filepath.Join(dir, "done0"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := procs[0].wait(20 * time.Second); code != 0 {
		t.Fatalf("first holder exited %d", code)
	}
	t2, _ := strconv.ParseUint(strings.TrimSpace(readFile(t, filepath.Join(dir, "token2"), 20*time.Second)), 10, 64)
	for i := 0; i < 2; i++ {
		ti, _ := strconv.ParseUint(strings.TrimSpace(readFile(t, filepath.Join(dir, fmt.Sprintf("token%d", i)), time.Second)), 10, 64)
		if t2 <= ti {
			t.Fatalf("third token %d not above token %d", t2, ti)
		}
	}
	for i := 1; i < 3; i++ {
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("done%d", i)), nil, 0o644)
		if code := procs[i].wait(20 * time.Second); code != 0 {
			t.Fatalf("holder %d exited %d", i, code)
		}
	}
}
