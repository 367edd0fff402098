package fsm_test

import (
	"errors"
	"testing"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

func setLimitsCmd(l fsm.Limits) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_SetLimits{SetLimits: &fsmpb.SetLimits{Limits: fsm.LimitsToProto(l)}}}
}

// TestEtcdLeasesHaveTheirOwnLimit: etcd leases count against
// max-etcd-leases and Tenure's sessions against max-sessions, so that a
// client of the etcd API that takes every lease it may leaves Tenure's
// clients their sessions (and the reverse), and a snapshot keeps the
// count.
func TestEtcdLeasesHaveTheirOwnLimit(t *testing.T) {
	st := fsm.NewState()
	must(t, st, setLimitsCmd(fsm.Limits{MaxSessions: 3, MaxEtcdLeases: 5}))
	for i := 0; i < 5; i++ {
		must(t, st, cmdEtcdLease(10_000))
	}
	if r := st.Apply(cmdEtcdLease(10_000), nil); !errors.Is(r.Err, fsm.ErrLimit) {
		t.Fatalf("an etcd lease past max-etcd-leases: %v", r.Err)
	}
	for i := 0; i < 3; i++ {
		if r := st.Apply(cmdCreateSessionSecret("app", 10_000, []byte("secret")), nil); r.Err != nil {
			t.Fatalf("a Tenure session %d with every etcd lease taken: %v", i, r.Err)
		}
	}
	if r := st.Apply(cmdCreateSessionSecret("app", 10_000, []byte("secret")), nil); !errors.Is(r.Err, fsm.ErrLimit) {
		t.Fatalf("a Tenure session past max-sessions: %v", r.Err)
	}
	// Ending a lease frees a lease, not a session; and the count survives
	// a snapshot.
	lease := st.EtcdLeases()[0]
	must(t, st, &fsmpb.Command{Op: &fsmpb.Command_CloseSession{CloseSession: &fsmpb.CloseSession{Session: lease}}})
	restored := restoreCopy(t, st)
	for _, s := range []*fsm.State{st, restored} {
		if r := s.Apply(cmdCreateSessionSecret("app", 10_000, []byte("secret")), nil); !errors.Is(r.Err, fsm.ErrLimit) {
			t.Fatalf("a freed etcd lease let a Tenure session past max-sessions: %v", r.Err)
		}
		must(t, s, cmdEtcdLease(10_000))
		if r := s.Apply(cmdEtcdLease(10_000), nil); !errors.Is(r.Err, fsm.ErrLimit) {
			t.Fatalf("an etcd lease past max-etcd-leases: %v", r.Err)
		}
	}
}

func tokenUpdate(id, secret string, create bool, grant, revoke []string) *fsmpb.Command {
	c := &fsmpb.AclTokenUpdate{Id: id, Create: create, Grant: grant, Revoke: revoke}
	if secret != "" {
		c.SecretHash = fsm.HashToken(secret)
	}
	return &fsmpb.Command{Op: &fsmpb.Command_AclTokenUpdate{AclTokenUpdate: c}}
}

// TestTokenUpdate: etcd's users are tokens made and changed by
// AclTokenUpdate: a token with no policy is allowed nothing; grants and
// revokes change its policies in place; a new secret replaces the old one,
// which stops working at once; an empty policy grants nothing.
func TestTokenUpdate(t *testing.T) {
	st := fsm.NewState()
	must(t, st, policyCmd("rw", false, "kv:app/:write"))
	must(t, st, &fsmpb.Command{Op: &fsmpb.Command_AclPolicySet{AclPolicySet: &fsmpb.AclPolicySet{Policy: &fsmpb.AclPolicy{Name: "empty"}}}})
	must(t, st, tokenUpdate("alice", "pw1", true, nil, nil))
	tok, ok := st.Security().TokenBySecret("pw1")
	if !ok || tok.ID != "alice" || len(tok.Policies) != 0 || st.Security().Allowed(tok.Policies, fsm.KindKV, "app/x", fsm.AccessRead) {
		t.Fatalf("a new user: %+v %v", tok, ok)
	}
	must(t, st, tokenUpdate("alice", "", false, []string{"rw", "empty"}, nil))
	tok, _ = st.Security().TokenBySecret("pw1")
	if !st.Security().Allowed(tok.Policies, fsm.KindKV, "app/x", fsm.AccessWrite) || st.Security().Allowed(tok.Policies, fsm.KindKV, "other", fsm.AccessRead) {
		t.Fatalf("granted policies: %v", tok.Policies)
	}
	must(t, st, tokenUpdate("alice", "pw2", false, nil, []string{"rw"}))
	if _, ok := st.Security().TokenBySecret("pw1"); ok {
		t.Fatal("the old secret still works")
	}
	tok, ok = st.Security().TokenBySecret("pw2")
	if !ok || st.Security().Allowed(tok.Policies, fsm.KindKV, "app/x", fsm.AccessRead) {
		t.Fatalf("after revoke and new secret: %+v %v", tok, ok)
	}
	rev := st.Revision()
	for name, cmd := range map[string]*fsmpb.Command{
		"create twice":     tokenUpdate("alice", "pw3", true, nil, nil),
		"change unknown":   tokenUpdate("bob", "", false, []string{"rw"}, nil),
		"create no secret": tokenUpdate("bob", "", true, nil, nil),
		"grant unknown":    tokenUpdate("alice", "", false, []string{"nope"}, nil),
		"revoke not held":  tokenUpdate("alice", "", false, nil, []string{"rw"}),
		"another's secret": tokenUpdate("bob", "pw2", true, nil, nil),
		"id with a space":  tokenUpdate("a b", "pw4", true, nil, nil),
	} {
		if r := st.Apply(cmd, nil); r.Err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if st.Revision() != rev {
		t.Fatalf("refused updates moved the revision")
	}
	restored := restoreCopy(t, st)
	if tok, ok := restored.Security().TokenBySecret("pw2"); !ok || tok.ID != "alice" {
		t.Fatalf("after a snapshot: %+v %v", tok, ok)
	}
}

// restoreCopy is st exported and imported again.
func restoreCopy(t *testing.T, st *fsm.State) *fsm.State {
	t.Helper()
	out, err := fsm.Import(st.Export())
	if err != nil {
		t.Fatal(err)
	}
	return out
}
