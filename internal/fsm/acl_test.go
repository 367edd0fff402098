package fsm_test

import (
	"crypto/ed25519"
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/fenceproof"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

func policyCmd(name string, replace bool, rules ...string) *fsmpb.Command {
	p := &fsmpb.AclPolicy{Name: name}
	for _, s := range rules {
		r, err := fsm.ParseRule(s)
		if err != nil {
			panic(err)
		}
		p.Rules = append(p.Rules, &fsmpb.AclRule{Kind: string(r.Kind), Prefix: r.Prefix, Access: r.Access.String()})
	}
	return &fsmpb.Command{Op: &fsmpb.Command_AclPolicySet{AclPolicySet: &fsmpb.AclPolicySet{Policy: p, Replace: replace}}}
}

func tokenCmd(id, secret string, policies ...string) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_AclTokenCreate{AclTokenCreate: &fsmpb.AclTokenCreate{Token: &fsmpb.AclToken{Id: id, SecretHash: fsm.HashToken(secret), Policies: policies}}}}
}

// TestACLLongestPrefixWins: the longest matching prefix decides; rules of
// equal prefix merge with deny first, then write over read; nothing
// matching is a denial; write includes read; a prefix listing is allowed
// only if no longer rule under it takes the right away.
func TestACLLongestPrefixWins(t *testing.T) {
	st := fsm.NewState()
	must(t, st, policyCmd("a", false, "kv::read", "kv:jobs/:write", "kv:jobs/secret/:deny", "lock:x:read"))
	must(t, st, policyCmd("b", false, "lock:x:write", "kv:shared/:read", "lock:y:deny"))
	must(t, st, policyCmd("c", false, "kv:shared/:write", "lock:y:write"))
	sec := st.Security()
	for _, c := range []struct {
		policies []string
		kind     fsm.Kind
		name     string
		need     fsm.Access
		want     bool
	}{
		{[]string{"a"}, fsm.KindKV, "anything", fsm.AccessRead, true},
		{[]string{"a"}, fsm.KindKV, "anything", fsm.AccessWrite, false},
		{[]string{"a"}, fsm.KindKV, "jobs/1", fsm.AccessWrite, true},
		{[]string{"a"}, fsm.KindKV, "jobs/1", fsm.AccessRead, true}, // write includes read
		{[]string{"a"}, fsm.KindKV, "jobs/secret/1", fsm.AccessRead, false},
		{[]string{"a"}, fsm.KindLock, "z", fsm.AccessRead, false}, // nothing matches
		{[]string{"a"}, fsm.KindFence, "jobs/1", fsm.AccessRead, false},
		{[]string{"a", "b"}, fsm.KindLock, "x", fsm.AccessWrite, true},  // write over read at one prefix
		{[]string{"b", "c"}, fsm.KindLock, "y", fsm.AccessWrite, false}, // deny first at one prefix
		{[]string{"b", "c"}, fsm.KindKV, "shared/1", fsm.AccessWrite, true},
		{[]string{"nope"}, fsm.KindKV, "x", fsm.AccessRead, false},
		{nil, fsm.KindKV, "x", fsm.AccessRead, false},
	} {
		if got := sec.Allowed(c.policies, c.kind, c.name, c.need); got != c.want {
			t.Errorf("%v %s %q %s: %v, want %v", c.policies, c.kind, c.name, c.need, got, c.want)
		}
	}
	if sec.AllowedUnder([]string{"a"}, fsm.KindKV, "jobs/", fsm.AccessRead) {
		t.Error("a listing of jobs/ is allowed although jobs/secret/ is denied")
	}
	if sec.AllowedUnder([]string{"a"}, fsm.KindKV, "jobs/secret/x/", fsm.AccessRead) {
		t.Error("a listing under a denied prefix is allowed")
	}
	if !sec.AllowedUnder([]string{"a"}, fsm.KindKV, "other/", fsm.AccessRead) {
		t.Error("a listing of other/ is refused")
	}
}

// TestACLCommands: refusals change nothing (no revision); a policy in use
// cannot be deleted; the management policy is built in; bootstrap runs
// once; token secrets are found by their hash only.
func TestACLCommands(t *testing.T) {
	st := fsm.NewState()
	boot := &fsmpb.Command{Op: &fsmpb.Command_AclBootstrap{AclBootstrap: &fsmpb.AclBootstrap{Token: &fsmpb.AclToken{Id: "root", SecretHash: fsm.HashToken("s0")}}}}
	must(t, st, boot)
	if r := st.Apply(boot, nil); !errors.Is(r.Err, fsm.ErrPermissionDenied) {
		t.Fatalf("second bootstrap: %v", r.Err)
	}
	if tok, ok := st.Security().TokenBySecret("s0"); !ok || tok.ID != "root" || !st.Security().Allowed(tok.Policies, fsm.KindCluster, "", fsm.AccessWrite) {
		t.Fatalf("the bootstrap token: %v %v", tok, ok)
	}
	must(t, st, policyCmd("p", false, "lock::write"))
	must(t, st, tokenCmd("t1", "s1", "p"))
	rev := st.Revision()
	for name, cmd := range map[string]*fsmpb.Command{
		"policy exists":          policyCmd("p", false, "kv::read"),
		"management is built in": policyCmd(fsm.ManagementPolicy, true, "kv::read"),
		"unknown kind":           {Op: &fsmpb.Command_AclPolicySet{AclPolicySet: &fsmpb.AclPolicySet{Policy: &fsmpb.AclPolicy{Name: "q", Rules: []*fsmpb.AclRule{{Kind: "locks", Access: "read"}}}}}},
		"cluster with a prefix":  {Op: &fsmpb.Command_AclPolicySet{AclPolicySet: &fsmpb.AclPolicySet{Policy: &fsmpb.AclPolicy{Name: "q", Rules: []*fsmpb.AclRule{{Kind: "cluster", Prefix: "x", Access: "read"}}}}}},
		"policy in use":          {Op: &fsmpb.Command_AclPolicyDelete{AclPolicyDelete: &fsmpb.AclPolicyDelete{Name: "p"}}},
		"token of no policy":     tokenCmd("t2", "s2", "nope"),
		"token id exists":        tokenCmd("t1", "s3", "p"),
		"token secret exists":    tokenCmd("t3", "s1", "p"),
		"revoke unknown":         {Op: &fsmpb.Command_AclTokenRevoke{AclTokenRevoke: &fsmpb.AclTokenRevoke{Id: "zz"}}},
	} {
		if r := st.Apply(cmd, nil); r.Err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if st.Revision() != rev {
		t.Fatalf("refused ACL commands moved the revision %d → %d", rev, st.Revision())
	}
	must(t, st, policyCmd("p", true, "kv::read")) // replace
	if !st.Security().Allowed([]string{"p"}, fsm.KindKV, "x", fsm.AccessRead) || st.Security().Allowed([]string{"p"}, fsm.KindLock, "x", fsm.AccessRead) {
		t.Fatal("the replaced policy did not take effect")
	}
	must(t, st, &fsmpb.Command{Op: &fsmpb.Command_AclTokenRevoke{AclTokenRevoke: &fsmpb.AclTokenRevoke{Id: "t1"}}})
	if _, ok := st.Security().TokenBySecret("s1"); ok {
		t.Fatal("a revoked token is still found")
	}
	must(t, st, &fsmpb.Command{Op: &fsmpb.Command_AclPolicyDelete{AclPolicyDelete: &fsmpb.AclPolicyDelete{Name: "p"}}})
}

// TestSecuritySnapshotRoundTrip: policies, token hashes, bindings, the
// cluster id and signing keys survive export and import; the secrets are
// in no snapshot.
func TestSecuritySnapshotRoundTrip(t *testing.T) {
	st := fsm.NewState()
	must(t, st, &fsmpb.Command{Op: &fsmpb.Command_AclBootstrap{AclBootstrap: &fsmpb.AclBootstrap{Token: &fsmpb.AclToken{Id: "root", SecretHash: fsm.HashToken("very-secret")}}}})
	must(t, st, policyCmd("p", false, "lock:jobs/:write"))
	must(t, st, &fsmpb.Command{Op: &fsmpb.Command_AclBindingSet{AclBindingSet: &fsmpb.AclBindingSet{Binding: &fsmpb.AclBinding{Name: "worker-1", Policies: []string{"p"}}}}})
	seed := make([]byte, ed25519.SeedSize)
	seed[0] = 7
	pub := ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)
	key := &fsmpb.AddSigningKey{ClusterId: make([]byte, fsm.ClusterIDBytes), Key: &fsmpb.SigningKey{Id: fenceproof.KeyID(pub), Seed: seed}, OnlyIfNone: true}
	must(t, st, &fsmpb.Command{Op: &fsmpb.Command_AddSigningKey{AddSigningKey: key}})
	again := proto.Clone(key).(*fsmpb.AddSigningKey)
	again.Key.Seed = append([]byte(nil), seed...)
	again.Key.Seed[0] = 8
	again.OnlyIfNone = false
	if r := st.Apply(&fsmpb.Command{Op: &fsmpb.Command_AddSigningKey{AddSigningKey: again}}, nil); r.Err == nil {
		t.Fatal("a key whose id is not its public key's was accepted")
	}
	rev := st.Revision()
	must(t, st, &fsmpb.Command{Op: &fsmpb.Command_AddSigningKey{AddSigningKey: key}}) // only if none: nothing
	if st.Revision() != rev || len(st.Security().Keys) != 1 {
		t.Fatalf("a second only-if-none key: revision %d → %d, %d keys", rev, st.Revision(), len(st.Security().Keys))
	}

	data, err := proto.Marshal(st.Export())
	if err != nil {
		t.Fatal(err)
	}
	if contains(data, []byte("very-secret")) {
		t.Fatal("a token secret is in the snapshot")
	}
	snap := &fsmpb.Snapshot{}
	if err := proto.Unmarshal(data, snap); err != nil {
		t.Fatal(err)
	}
	back, err := fsm.Import(snap)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(back.Export(), st.Export()) {
		t.Fatal("the imported state exports differently")
	}
	sec := back.Security()
	if tok, ok := sec.TokenBySecret("very-secret"); !ok || tok.ID != "root" {
		t.Fatal("the bootstrap token is lost")
	}
	if b, ok := sec.Binding("worker-1"); !ok || b.Policies[0] != "p" {
		t.Fatal("the binding is lost")
	}
	if k, ok := sec.ActiveKey(); !ok || k.ID != fenceproof.KeyID(pub) {
		t.Fatal("the signing key is lost")
	}
}

func must(t *testing.T, st *fsm.State, cmd *fsmpb.Command) {
	t.Helper()
	if r := st.Apply(cmd, nil); r.Err != nil {
		t.Fatalf("%v: %v", cmd, r.Err)
	}
}

func contains(haystack, needle []byte) bool {
	for i := 0; i+len(needle) <= len(haystack); i++ {
		if string(haystack[i:i+len(needle)]) == string(needle) {
			return true
		}
	}
	return false
}
