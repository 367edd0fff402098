package zkcompat

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestDiffSessionTimeout: a session resumed on a new
// connection asking another timeout is answered the timeout it asks now,
// clamped to the server's bounds (2 to 20 s here), not the one it was
// created with; and the server expires it by that timeout from then on: a
// session created with 20 s and resumed asking 1 s (2 s once clamped)
// loses its ephemeral well before 20 s once its client goes.
func TestDiffSessionTimeout(t *testing.T) {
	var want []string
	eachTarget(t, func(t *testing.T, s *server, root string) {
		var lines []string
		add := func(format string, args ...any) {
			lines = append(lines, strings.ReplaceAll(fmt.Sprintf(format, args...), root, "ROOT"))
		}
		c, err := dialZK(s.Addr, 20*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.close)
		add("connect asking 20000ms -> timeout %dms", c.Timeout)
		if _, code, err := c.create(root, nil, flagPersistent); err != nil || code != 0 {
			t.Fatalf("create %s: %s %v", root, errName(code), err)
		}
		if _, code, err := c.create(root+"/e", nil, flagEphemeral); err != nil || code != 0 {
			t.Fatalf("create %s/e: %s %v", root, errName(code), err)
		}
		// Each resume opens a new connection before the previous one
		// goes, so that the session never waits unpinged.
		prev := c
		for _, ms := range []int{4000, 100000, 10000, 1000} {
			again, err := dialSession(s.Addr, time.Duration(ms)*time.Millisecond, c.SessionID, c.Passwd)
			if err != nil {
				add("resume asking %dms -> %v", ms, err)
				continue
			}
			t.Cleanup(again.drop)
			same := again.SessionID == c.SessionID
			add("resume asking %dms -> same session %v, timeout %dms", ms, same, again.Timeout)
			ok, err := again.exists(root + "/e")
			add("exists ROOT/e on the resumed session -> %v %v", ok, err)
			prev.drop()
			prev = again
		}
		observer, err := dialZK(s.Addr, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(observer.close)
		// The session's last timeout is 2 s: gone with its client, it
		// ends within a few seconds (ZooKeeper rounds expiries up to the
		// next tick), far before the 20 s it was created with.
		prev.drop()
		dropped := time.Now()
		gone := false
		for time.Since(dropped) < 12*time.Second {
			ok, err := observer.exists(root + "/e")
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				gone = true
				break
			}
			time.Sleep(100 * time.Millisecond) // polling the observer's view
		}
		add("the ephemeral of the session resumed at 2s is gone within 12s of its client: %v", gone)
		t.Logf("the ephemeral went %v after its client", time.Since(dropped).Round(100*time.Millisecond))
		if s.Name == zooKeeper {
			want = lines
			t.Logf("ZooKeeper's transcript:\n%s", strings.Join(lines, "\n"))
			return
		}
		if want == nil {
			t.Fatal("no ZooKeeper transcript to compare with")
		}
		if diff := diffLines(want, lines); diff != "" {
			t.Errorf("Tenure's answers differ from ZooKeeper 3.8's (- ZooKeeper, + Tenure):\n%s", diff)
		}
	})
}
