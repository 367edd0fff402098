package fsm_test

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// TestACLEnforcementIsReplicated: whether the cluster enforces its ACLs
// is replicated state: AclEnable turns it on once (a second one changes
// nothing, not even the revision), AclBootstrap turns it on too, and it
// survives a snapshot's export and import, encoded deterministically.
func TestACLEnforcementIsReplicated(t *testing.T) {
	enable := &fsmpb.Command{Op: &fsmpb.Command_AclEnable{AclEnable: &fsmpb.AclEnable{}}}
	st := fsm.NewState()
	if st.Security().Enforced {
		t.Fatal("a new state enforces ACLs")
	}
	before := st.Security()
	rev := st.Revision()
	must(t, st, enable)
	if !st.Security().Enforced || st.Revision() != rev+1 {
		t.Fatalf("after AclEnable: enforced %v, revision %d → %d", st.Security().Enforced, rev, st.Revision())
	}
	if before.Enforced {
		t.Fatal("AclEnable changed the Security readers held (it must be replaced, not changed)")
	}
	rev = st.Revision()
	must(t, st, enable)
	if !st.Security().Enforced || st.Revision() != rev {
		t.Fatalf("a second AclEnable: enforced %v, revision %d → %d", st.Security().Enforced, rev, st.Revision())
	}

	enc := func(s *fsm.State) []byte {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(s.Export())
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	data := enc(st)
	snap := &fsmpb.Snapshot{}
	if err := proto.Unmarshal(data, snap); err != nil {
		t.Fatal(err)
	}
	back, err := fsm.Import(snap)
	if err != nil {
		t.Fatal(err)
	}
	if !back.Security().Enforced {
		t.Fatal("a snapshot of an enforcing state imports as not enforcing")
	}
	if !bytes.Equal(enc(back), data) {
		t.Fatal("the imported state exports different bytes")
	}

	boot := fsm.NewState()
	must(t, boot, &fsmpb.Command{Op: &fsmpb.Command_AclBootstrap{AclBootstrap: &fsmpb.AclBootstrap{Token: &fsmpb.AclToken{Id: "root", SecretHash: fsm.HashToken("s")}}}})
	if !boot.Security().Enforced {
		t.Fatal("AclBootstrap left the ACLs unenforced")
	}
}
