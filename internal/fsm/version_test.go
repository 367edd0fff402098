package fsm_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/version"
)

// baseCommands are the commands of format version 1: every one the
// release before versions (commit cb865d7) knew, by field number.
var baseCommands = map[protoreflect.FieldNumber]bool{
	1: true, 2: true, 3: true, 4: true, 5: true, 6: true, 7: true, 8: true, 9: true, 10: true, 11: true,
	20: true, 21: true, 22: true, 23: true, 24: true, 25: true, 26: true, 27: true, 28: true, 29: true, 30: true, 31: true, 32: true,
	40: true, 41: true, 42: true, 50: true, 60: true, 61: true,
	70: true, 71: true, 72: true, 73: true, 74: true, 75: true, 76: true, 77: true, 80: true,
}

// TestEveryNewCommandIsGated: every command of Command's oneof that the
// base release did not know is in fsm.Gates (SetClusterVersion aside,
// which raises the version), and every gate names a field that exists:
// a command added without a gate fails here.
func TestEveryNewCommandIsGated(t *testing.T) {
	gated := map[protoreflect.FullName]uint32{}
	for _, g := range fsm.Gates {
		if _, err := protoregistry.GlobalFiles.FindDescriptorByName(g.Field); err != nil {
			t.Errorf("gate %s names no field: %v", g.Field, err)
		}
		if g.Version < 2 || g.Version > version.Protocol {
			t.Errorf("gate %s: version %d is outside 2..%d", g.Field, g.Version, version.Protocol)
		}
		gated[g.Field] = g.Version
	}
	fields := (&fsmpb.Command{}).ProtoReflect().Descriptor().Oneofs().ByName("op").Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if baseCommands[fd.Number()] || fd.Name() == "set_cluster_version" {
			continue
		}
		if gated[fd.FullName()] == 0 {
			t.Errorf("command %s (%d) is newer than format version 1 and has no gate in fsm.Gates", fd.Name(), fd.Number())
		}
	}
}

func cmdAclEnable() *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_AclEnable{AclEnable: &fsmpb.AclEnable{}}}
}

func cmdSetClusterVersion(v uint32) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_SetClusterVersion{SetClusterVersion: &fsmpb.SetClusterVersion{Version: v}}}
}

// TestProposalGate: a command or field newer than the cluster version is
// refused with ErrVersion naming both versions; at the newer version it
// passes.
func TestProposalGate(t *testing.T) {
	cases := []struct {
		name string
		cmd  *fsmpb.Command
		need uint32
	}{
		{"AclEnable", cmdAclEnable(), 2},
		{"RetireSigningKey", &fsmpb.Command{Op: &fsmpb.Command_RetireSigningKey{RetireSigningKey: &fsmpb.RetireSigningKey{Id: "k"}}}, 2},
		{"RemoveSigningKey", &fsmpb.Command{Op: &fsmpb.Command_RemoveSigningKey{RemoveSigningKey: &fsmpb.RemoveSigningKey{Id: "k"}}}, 2},
		{"AclTokenUpdate", &fsmpb.Command{Op: &fsmpb.Command_AclTokenUpdate{AclTokenUpdate: &fsmpb.AclTokenUpdate{Id: "u"}}}, 2},
		{"SetLimits max_etcd_leases", cmdSetLimits(fsm.Limits{MaxEtcdLeases: 5}), 2},
		{"SetLimits max_sessions", cmdSetLimits(fsm.Limits{MaxSessions: 5}), 1},
		{"FencedPut", cmdPut("k", "v", 1, ""), 1},
		{"SetClusterVersion", cmdSetClusterVersion(2), 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := fsm.CheckVersion(c.cmd, 1)
			if c.need == 1 {
				if err != nil {
					t.Fatalf("at cluster version 1: %v", err)
				}
				return
			}
			if !errors.Is(err, fsm.ErrVersion) || !strings.Contains(err.Error(), fmt.Sprintf("needs cluster version %d, the cluster is at version 1", c.need)) {
				t.Fatalf("at cluster version 1: %v, want ErrVersion naming versions %d and 1", err, c.need)
			}
			if err := fsm.CheckVersion(c.cmd, c.need); err != nil {
				t.Fatalf("at cluster version %d: %v", c.need, err)
			}
		})
	}
}

// TestApplyAtBaseVersion: below version 2 a gated command changes nothing
// (as a member of the base release, which does not know it, leaves the
// state), and the commands whose meaning changed apply the old way.
func TestApplyAtBaseVersion(t *testing.T) {
	t.Run("gated command changes nothing", func(t *testing.T) {
		st := fsm.NewStateAt(1)
		before := exportBytes(t, st)
		r := st.Apply(cmdAclEnable(), nil)
		if !errors.Is(r.Err, fsm.ErrVersion) {
			t.Fatalf("AclEnable at version 1: %v, want ErrVersion", r.Err)
		}
		if !bytes.Equal(exportBytes(t, st), before) || st.Security().Enforced {
			t.Fatal("AclEnable at version 1 changed the state")
		}
	})
	t.Run("etcd lease limit", func(t *testing.T) {
		for _, v := range []uint32{1, 2} {
			st := fsm.NewStateAt(v)
			must(t, st, cmdSetLimits(fsm.Limits{MaxSessions: 1, MaxEtcdLeases: 1}))
			must(t, st, cmdEtcdLease(60_000))
			r := st.Apply(cmdCreate("a", 10_000), nil)
			// Version 1: the lease counts against max-sessions (1), and
			// max-etcd-leases was ignored. Version 2: they are apart.
			if refused := errors.Is(r.Err, fsm.ErrLimit); refused != (v == 1) {
				t.Fatalf("version %d: a session beside an etcd lease under max-sessions 1: %v", v, r.Err)
			}
		}
	})
	t.Run("bootstrap enforces from version 2", func(t *testing.T) {
		for _, v := range []uint32{1, 2} {
			st := fsm.NewStateAt(v)
			must(t, st, aclBootstrapCmd())
			if st.Security().Enforced != (v == 2) {
				t.Fatalf("version %d: enforced %v after AclBootstrap", v, st.Security().Enforced)
			}
		}
	})
	t.Run("register binding from version 2", func(t *testing.T) {
		for _, v := range []uint32{1, 2} {
			st := fsm.NewStateAt(v)
			s := st.Apply(cmdCreate("a", 10_000), nil).Session
			tokA := st.Apply(cmdAcquire(s, "A", false, 0), nil).Token
			tokB := st.Apply(cmdAcquire(s, "B", false, 0), nil).Token
			must(t, st, cmdPutLock("k", "1", tokA, "A", ""))
			r := st.Apply(cmdPutLock("k", "2", tokB, "B", ""), nil)
			if wrong := errors.Is(r.Err, fsm.ErrInvalid); wrong != (v == 2) {
				t.Fatalf("version %d: a write naming another lock: %v", v, r.Err)
			}
		}
	})
}

func aclBootstrapCmd() *fsmpb.Command {
	h := make([]byte, 32)
	return &fsmpb.Command{Op: &fsmpb.Command_AclBootstrap{AclBootstrap: &fsmpb.AclBootstrap{Token: &fsmpb.AclToken{Id: "root", SecretHash: h}}}}
}

// TestSetClusterVersion: the version goes up, never down, never past what
// this build speaks; a snapshot carries it.
func TestSetClusterVersion(t *testing.T) {
	st := fsm.NewStateAt(1)
	rev := st.Revision()
	must(t, st, cmdSetClusterVersion(2))
	if st.ClusterVersion() != 2 || st.Revision() != rev+1 {
		t.Fatalf("after SetClusterVersion 2: version %d, revision %d", st.ClusterVersion(), st.Revision())
	}
	if r := st.Apply(cmdSetClusterVersion(1), nil); !errors.Is(r.Err, fsm.ErrInvalid) || st.ClusterVersion() != 2 {
		t.Fatalf("lowering: %v, version %d", r.Err, st.ClusterVersion())
	}
	snap := st.Export()
	if snap.GetClusterVersion() != 2 || snap.GetFormatVersion() != 2 {
		t.Fatalf("snapshot versions %d/%d, want 2", snap.GetClusterVersion(), snap.GetFormatVersion())
	}
	back, err := fsm.Import(snap)
	if err != nil || back.ClusterVersion() != 2 {
		t.Fatalf("import: %v, version %d", err, back.ClusterVersion())
	}
	// A snapshot of the base release has no versions: version 1.
	snap.ClusterVersion, snap.FormatVersion = 0, 0
	if back, err := fsm.Import(snap); err != nil || back.ClusterVersion() != 1 {
		t.Fatalf("import of an unversioned snapshot: %v, version %d", err, back.ClusterVersion())
	}
}

// TestFSMStopsAtNewerFormats: a log entry of a newer format version, a
// command this build does not know and a snapshot of a newer version each
// stop the state machine with a FormatError naming both versions; nothing
// is applied at or after it.
func TestFSMStopsAtNewerFormats(t *testing.T) {
	newer := version.Protocol + 1
	apply := func(f *fsm.FSM, index uint64, data []byte) {
		f.Apply(&raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: data})
	}
	revision := func(f *fsm.FSM) (rev uint64) {
		f.Read(func(s *fsm.State) { rev = s.Revision() })
		return rev
	}
	checkStopped := func(t *testing.T, f *fsm.FSM, want string) {
		t.Helper()
		var fe *fsm.FormatError
		if err := f.Err(); !errors.As(err, &fe) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), fmt.Sprintf("up to %d", version.Protocol)) {
			t.Fatalf("Err = %v, want a FormatError saying %q and naming version %d", err, want, version.Protocol)
		}
	}
	create, _ := fsm.EncodeEntry(cmdCreate("a", 10_000), 0)

	t.Run("newer entry", func(t *testing.T) {
		f := fsm.New(nil)
		data, err := fsm.EncodeEntryVersion(cmdCreate("a", 10_000), newer, 0)
		if err != nil {
			t.Fatal(err)
		}
		apply(f, 1, data)
		apply(f, 2, create)
		checkStopped(t, f, fmt.Sprintf("log entry 1 is format version %d", newer))
		if revision(f) != 0 {
			t.Fatalf("revision %d after a stop", revision(f))
		}
	})
	t.Run("unknown command", func(t *testing.T) {
		f := fsm.New(nil)
		// A command of a newer release: a oneof member this build lacks.
		raw := protowire.AppendTag(nil, 149, protowire.BytesType)
		raw = protowire.AppendBytes(raw, []byte{0x08, 0x01})
		var cmd fsmpb.Command
		if err := proto.Unmarshal(raw, &cmd); err != nil {
			t.Fatal(err)
		}
		data, _ := fsm.EncodeEntry(&cmd, 0)
		apply(f, 1, data)
		apply(f, 2, create)
		checkStopped(t, f, "log entry 1 holds a command this build does not know")
		if revision(f) != 0 {
			t.Fatalf("revision %d after a stop", revision(f))
		}
	})
	t.Run("newer snapshot", func(t *testing.T) {
		snap := fsm.NewState().Export()
		snap.FormatVersion, snap.ClusterVersion = newer, newer
		data, _ := proto.Marshal(snap)
		if _, err := fsm.ReadSnapshot(bytes.NewReader(data)); err == nil {
			t.Fatal("a newer snapshot was read")
		}
		f := fsm.New(nil)
		_ = f.Restore(nopCloser{bytes.NewReader(data)})
		checkStopped(t, f, fmt.Sprintf("snapshot is format version %d", newer))
	})
}

type nopCloser struct{ *bytes.Reader }

func (nopCloser) Close() error { return nil }

// TestVersionedFrame: an entry written at cluster version 2 names its
// version, its checksum covers it, and a reader of the base release (which
// takes it for a bare protobuf entry) cannot decode it, so it stops rather
// than skip it; at version 1 the entry is the frame every release reads.
func TestVersionedFrame(t *testing.T) {
	cmd := cmdCreate("a", 10_000)
	v1, _ := fsm.EncodeEntryVersion(cmd, fsm.EntryVersionFor(cmd, 1), 0)
	if old, _ := fsm.EncodeEntry(cmd, 0); !bytes.Equal(v1, old) || fsm.EntryVersion(v1) != 1 {
		t.Fatal("an entry at cluster version 1 is not the base frame")
	}
	v2, err := fsm.EncodeEntryVersion(cmd, fsm.EntryVersionFor(cmd, 2), 0)
	if err != nil || fsm.EntryVersion(v2) != 2 || !fsm.Framed(v2) {
		t.Fatalf("entry at version 2: %v, version %d", err, fsm.EntryVersion(v2))
	}
	var got fsmpb.Command
	if err := fsm.DecodeEntry(v2, &got); err != nil || !proto.Equal(&got, cmd) {
		t.Fatalf("decode: %v", err)
	}
	if err := proto.Unmarshal(v2, new(fsmpb.Command)); err == nil {
		t.Fatal("the versioned frame decodes as a bare entry: a base release would apply it")
	}
	bad := bytes.Clone(v2)
	bad[1] = 3 // the version byte is under the checksum
	if err := fsm.CheckEntry(bad); err == nil {
		t.Fatal("a changed version byte passed the checksum")
	}
	// The raise is written in the version it raises to.
	if v := fsm.EntryVersionFor(cmdSetClusterVersion(2), 1); v != 2 {
		t.Fatalf("SetClusterVersion 2 at version 1 is written in version %d", v)
	}
}

// TestLimitsAllowed: a configured limit of a newer format than the
// cluster version is left out of what a node proposes, the rest kept.
func TestLimitsAllowed(t *testing.T) {
	l := fsm.Limits{MaxSessions: 7, MaxEtcdLeases: 9}
	if got := fsm.LimitsAllowed(l, 1); got != (fsm.Limits{MaxSessions: 7}) {
		t.Fatalf("at version 1: %+v", got)
	}
	if got := fsm.LimitsAllowed(l, 2); got != l {
		t.Fatalf("at version 2: %+v", got)
	}
	if err := fsm.CheckVersion(cmdSetLimits(fsm.LimitsAllowed(l, 1)), 1); err != nil {
		t.Fatalf("the allowed limits at version 1 are refused: %v", err)
	}
}
