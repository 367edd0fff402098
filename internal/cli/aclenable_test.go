package cli

import (
	"strings"
	"testing"

	"github.com/tenure-io/tenure/internal/testutil"
)

// TestCLIACLEnable: on a server started without --auth, `acl enable`
// needs no token and makes it enforce the ACLs for good: an anonymous
// request is denied from then on, a second enable needs cluster write and
// changes nothing, and bootstrap still hands out the management token.
func TestCLIACLEnable(t *testing.T) {
	s := testutil.Start(t, "", nil)
	if who := runJSON(t, s.Addr(), 0, "acl", "whoami"); who["auth"] != false {
		t.Fatalf("whoami before enable = %v, want auth false", who)
	}
	runJSON(t, s.Addr(), 0, "kv", "put", "k", "v")
	en := runJSON(t, s.Addr(), 0, "acl", "enable")
	if en["enforced"] != true || en["changed"] != true {
		t.Fatalf("acl enable -o json = %v, want enforced and changed", en)
	}
	if res := run(t, s.Addr(), "kv", "get", "k"); res.code != ExitError || !strings.Contains(res.stderr, "permission denied") {
		t.Fatalf("anonymous get after enable: exit %d, %q", res.code, res.stderr)
	}
	if res := run(t, s.Addr(), "acl", "enable"); res.code != ExitError || !strings.Contains(res.stderr, "cluster write") {
		t.Fatalf("anonymous second enable: exit %d, %q", res.code, res.stderr)
	}
	if who := runJSON(t, s.Addr(), 0, "acl", "whoami"); who["auth"] != true {
		t.Fatalf("whoami after enable = %v, want auth true", who)
	}
	admin := runJSON(t, s.Addr(), 0, "acl", "bootstrap")["secret"].(string)
	again := runJSON(t, s.Addr(), 0, "acl", "enable", "--auth-token", admin)
	if again["changed"] != false {
		t.Fatalf("acl enable once enforced = %v, want changed false", again)
	}
	if res := run(t, s.Addr(), "kv", "get", "k", "--auth-token", admin); res.code != 0 || !strings.Contains(res.stdout, "v") {
		t.Fatalf("get with the management token: exit %d, %q %q", res.code, res.stdout, res.stderr)
	}
}
