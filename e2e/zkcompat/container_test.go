package zkcompat

import (
	"testing"
	"time"
)

// TestContainerCleanup: a container node whose last child is deleted goes
// away by itself (Curator makes its recipes' parents containers); one that
// never had a child stays, as does a persistent node.
func TestContainerCleanup(t *testing.T) {
	eachTarget(t, func(t *testing.T, s *server, root string) {
		c, err := dialZK(s.Addr, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.close()
		mustCreate := func(path string, flags int32) {
			t.Helper()
			op := int32(opCreate)
			if flags == flagContainer {
				op = opCreateContainer
			}
			r, err := c.call(op, enc{}.str(path).buf(nil).acls(openACL).i32(flags))
			if err != nil || r.Err != 0 {
				t.Fatalf("create %s: %s %v", path, errName(r.Err), err)
			}
		}
		mustCreate(root, flagPersistent)
		mustCreate(root+"/used", flagContainer)
		mustCreate(root+"/never", flagContainer)
		mustCreate(root+"/plain", flagPersistent)
		mustCreate(root+"/used/child", flagPersistent)
		mustCreate(root+"/plain/child", flagPersistent)
		for _, p := range []string{root + "/used/child", root + "/plain/child"} {
			if r, err := c.call(opDelete, enc{}.str(p).i32(-1)); err != nil || r.Err != 0 {
				t.Fatalf("delete %s: %s %v", p, errName(r.Err), err)
			}
		}
		start := time.Now()
		waitFor(t, 30*time.Second, "the emptied container removed", func() bool {
			ok, err := c.exists(root + "/used")
			if err != nil {
				t.Fatal(err)
			}
			return !ok
		})
		t.Logf("emptied container removed after %v", time.Since(start).Round(10*time.Millisecond))
		for _, p := range []string{root + "/never", root + "/plain"} {
			if ok, err := c.exists(p); err != nil || !ok {
				t.Fatalf("%s removed too (exists %v, %v)", p, ok, err)
			}
		}
	})
}
