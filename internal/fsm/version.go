package fsm

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/version"
)

// Rolling upgrades
//
// The cluster version is replicated state: the newest format version
// (internal/version) that a log entry, a command or a snapshot may be
// written in. It starts at 1, the formats of every release before versions
// were recorded, and only SetClusterVersion raises it; the leader proposes
// that once every voter reports a protocol at least as new (its peer
// listener answers a version probe, internal/node/upgrade.go; a member
// that does not answer one counts as 1). Nothing lowers it.
//
// While it is older than a command or field of Gates:
//
//   - a proposal that uses it is refused before it is written
//     (ErrVersion, FailedPrecondition naming both versions);
//   - Apply refuses such a command, changing nothing and leaving the
//     revision alone, as a member of an older release does with a command
//     it does not know; and a field's meaning is ignored, as an older
//     release ignores the field;
//   - every command whose meaning changed applies the old way (the list
//     in Gates' doc), reading the replicated cluster version: every
//     replica applies the same entry the same way, whatever its build.
//
// A node that meets a log entry or a snapshot of a newer format version
// than it speaks, or a command it does not know, stops (FormatError): it
// never applies it as a no-op.

// ErrVersion: the command needs a newer cluster version than the one in
// effect (the leader raises it once every voter speaks the newer
// protocol). Nothing was changed.
var ErrVersion = errors.New("tenure: cluster version too old")

// VersionError is the ErrVersion of one command: what it uses, the
// cluster version it needs and the one in effect.
type VersionError struct {
	What    string
	Need    uint32
	Cluster uint32
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("%v: %s needs cluster version %d, the cluster is at version %d (it is raised once every voter runs a release of protocol %d or newer: tenure member list shows each one's)", ErrVersion, e.What, e.Need, e.Cluster, e.Need)
}

// Unwrap makes errors.Is(err, ErrVersion) hold.
func (e *VersionError) Unwrap() error { return ErrVersion }

// FormatError: a log entry, a command or a snapshot is of a newer format
// than this build reads. The state machine stops at it (see FSM.Err): the
// node must be upgraded, not go on without it.
type FormatError struct {
	// What it is: "log entry", "snapshot", "command".
	What string
	// Index is the log entry's index (0: not a log entry).
	Index uint64
	// Version is its format version; Unknown, for a command, says which
	// command this build does not know.
	Version uint32
	Unknown string
}

func (e *FormatError) Error() string {
	what := e.What
	if e.Index != 0 {
		what = fmt.Sprintf("%s %d", e.What, e.Index)
	}
	if e.Unknown != "" {
		return fmt.Sprintf("%s holds a command this build does not know (%s); this build speaks format versions up to %d: upgrade this member to the release the cluster runs", what, e.Unknown, version.Protocol)
	}
	return fmt.Sprintf("%s is format version %d, newer than this build speaks (up to %d): upgrade this member to the release the cluster runs (a downgrade below the cluster version is not supported)", what, e.Version, version.Protocol)
}

// Gate is one entry of Gates.
type Gate struct {
	// Field is the full name of a protobuf field of a command: a member
	// of Command's oneof is a command.
	Field protoreflect.FullName
	// Version is the cluster version that may write it.
	Version uint32
}

// Gates lists every command, and every field of a command, newer than
// format version 1, with the cluster version that may write it: the one
// table the proposal gate (CheckVersion) and Apply read. A command or
// field added later is added here, with the version of the release that
// adds it.
//
// Commands whose meaning changed apply the old way while the cluster
// version is below 2 (each reads State.ClusterVersion):
//
//   - AclBootstrap does not put the ACLs in force on every member
//     (Security.Enforced): each member enforces them as its --auth says;
//   - AclPolicySet refuses a policy with no rules;
//   - CreateSession counts etcd leases against max-sessions, with no
//     limit of their own (max-etcd-leases);
//   - FencedPut and FencedDelete do not bind a register to a lock, nor
//     refuse a write naming another lock;
//   - KVTxn ignores max_answer_bytes (the server checks the answer's size
//     before it proposes; paged shapes only the answer, not the state);
//   - SetLimits ignores max_etcd_leases.
//
// Below version 3, KVTxn refuses a nested transaction (KVOp.txn) with
// ErrVersion, changing nothing, as an older member refuses the op it
// does not know; and KVPut and KVTxn refuse a value over 1 MiB (version
// 3 raises MaxKVValueLen to etcd's 1.5 MiB).
//
// Below version 3 (kvhistory.go) no past version of a key is kept: a
// read names the current revision or nothing, SetLimits ignores
// max_kv_history_revisions and max_kv_history_bytes, and a snapshot holds
// no history window.
var Gates = []Gate{
	{"tenure.fsm.v1.Command.acl_enable", 2},
	{"tenure.fsm.v1.Command.retire_signing_key", 2},
	{"tenure.fsm.v1.Command.remove_signing_key", 2},
	{"tenure.fsm.v1.Command.acl_token_update", 2},
	{"tenure.fsm.v1.Command.set_client_addr", 2},
	{"tenure.fsm.v1.Limits.max_etcd_leases", 2},
	{"tenure.fsm.v1.Command.kv_compact", 3},
	{"tenure.fsm.v1.Limits.max_kv_history_revisions", 3},
	{"tenure.fsm.v1.Limits.max_kv_history_bytes", 3},
	{"tenure.fsm.v1.Snapshot.kv_history", 3},
	{"tenure.fsm.v1.Snapshot.kv_compact_revision", 3},
	{"tenure.fsm.v1.KVOp.txn", 3},
	{"tenure.fsm.v1.KVPut.key_bin", 3},
	{"tenure.fsm.v1.KVDelete.key_bin", 3},
	{"tenure.fsm.v1.KVRange.key_bin", 3},
	{"tenure.fsm.v1.KVRange.start_key_bin", 3},
	{"tenure.fsm.v1.KVCompare.key_bin", 3},
	{"tenure.fsm.v1.KVState.key_bin", 3},
	{"tenure.fsm.v1.KVHistoryRecord.key_bin", 3},
	{"tenure.fsm.v1.Command.zk_txn", 3},
	{"tenure.fsm.v1.Command.zk_set_addr", 3},
	{"tenure.fsm.v1.Snapshot.znodes", 3},
	{"tenure.fsm.v1.Snapshot.zk_addrs", 3},
	{"tenure.fsm.v1.ZkDelete.container", 3},
	{"tenure.fsm.v1.ZkCreate.data_null", 3},
	{"tenure.fsm.v1.ZkSetData.data_null", 3},
	{"tenure.fsm.v1.ZnodeState.data_null", 3},
	{"tenure.fsm.v1.Command.set_session_ttl", 3},
	{"tenure.fsm.v1.ZkCreate.ttl_ms", 3},
	{"tenure.fsm.v1.ZkDelete.ttl", 3},
	{"tenure.fsm.v1.ZkDelete.seen_mzxid", 3},
	{"tenure.fsm.v1.ZkDelete.seen_cversion", 3},
	{"tenure.fsm.v1.ZnodeState.ttl_ms", 3},
}

// gates is Gates by field; maxGate the newest version it names.
var gates, maxGate = func() (map[protoreflect.FullName]uint32, uint32) {
	m := make(map[protoreflect.FullName]uint32, len(Gates))
	var top uint32
	for _, g := range Gates {
		m[g.Field] = g.Version
		top = max(top, g.Version)
	}
	return m, top
}()

// setClusterVersionField is Command.set_cluster_version.
const setClusterVersionField protoreflect.FullName = "tenure.fsm.v1.Command.set_cluster_version"

// requiredVersion is the format version cmd needs (at least 1), and what
// needs it: the newest gate among the fields it sets, walked through every
// nested message; for SetClusterVersion, the version it raises to.
func requiredVersion(cmd *fsmpb.Command) (uint32, string) {
	if sv := cmd.GetSetClusterVersion(); sv != nil {
		return max(sv.GetVersion(), 1), "SetClusterVersion"
	}
	need, what := uint32(1), ""
	var walk func(m protoreflect.Message, depth int)
	walk = func(m protoreflect.Message, depth int) {
		if depth > 16 {
			return
		}
		m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			if g, ok := gates[fd.FullName()]; ok && g > need {
				need, what = g, string(fd.FullName())
			}
			switch {
			case fd.Message() == nil:
			case fd.IsList():
				for i, l := 0, v.List(); i < l.Len(); i++ {
					walk(l.Get(i).Message(), depth+1)
				}
			case fd.IsMap():
				if fd.MapValue().Message() != nil {
					v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
						walk(mv.Message(), depth+1)
						return true
					})
				}
			default:
				walk(v.Message(), depth+1)
			}
			return true
		})
	}
	walk(cmd.ProtoReflect(), 0)
	return need, what
}

// CheckVersion refuses, with a *VersionError, a command that needs a newer
// cluster version than cluster (the one in effect): the proposal gate. It
// costs nothing once the cluster version is the newest any gate names.
// SetClusterVersion passes: the leader proposes it only once every voter
// speaks its version.
func CheckVersion(cmd *fsmpb.Command, cluster uint32) error {
	if cluster >= maxGate || cmd.GetSetClusterVersion() != nil {
		return nil
	}
	// As it will be encoded: a key that is not UTF-8 takes key_bin.
	if need, what := requiredVersion(PackKeys(cmd)); need > cluster {
		return &VersionError{What: what, Need: need, Cluster: cluster}
	}
	return nil
}

// EntryVersionFor is the format version an entry holding cmd is written in
// while the cluster version is cluster: the cluster version, or the
// version a SetClusterVersion raises it to (so that a member too old for
// it stops at it rather than skip it).
func EntryVersionFor(cmd *fsmpb.Command, cluster uint32) uint32 {
	v := max(cluster, 1)
	if sv := cmd.GetSetClusterVersion(); sv != nil {
		v = max(v, sv.GetVersion())
	}
	for _, c := range cmd.GetBatch().GetCommands() {
		if sv := c.GetSetClusterVersion(); sv != nil {
			v = max(v, sv.GetVersion())
		}
	}
	return min(v, version.Protocol)
}

// ClusterVersion is the cluster version in effect (at least 1).
func (s *State) ClusterVersion() uint32 { return max(s.clusterVersion, 1) }

// at reports whether the cluster version is v or newer: whether a change
// of meaning that version made applies.
func (s *State) at(v uint32) bool { return s.ClusterVersion() >= v }

// gateApply is Apply's gate: a command the cluster version does not allow
// yet is refused, changing nothing (as an older member, which does not
// know it, leaves the state). Fields are not refused here: their meaning
// is ignored where they are read.
func (s *State) gateApply(cmd *fsmpb.Command) error {
	cv := s.ClusterVersion()
	if cv >= maxGate {
		return nil
	}
	oneof := cmd.ProtoReflect().WhichOneof(cmd.ProtoReflect().Descriptor().Oneofs().ByName("op"))
	if oneof == nil {
		return nil
	}
	if need, ok := gates[oneof.FullName()]; ok && need > cv {
		return &VersionError{What: string(oneof.FullName()), Need: need, Cluster: cv}
	}
	return nil
}

// setClusterVersion raises the cluster version. A version this build
// does not speak never gets here (its entry's format version stops the
// node first); one at or below the current is refused.
func (s *State) setClusterVersion(c *fsmpb.SetClusterVersion) Result {
	v := c.GetVersion()
	switch {
	case v <= s.ClusterVersion():
		return Result{Err: fmt.Errorf("%w: the cluster version is %d already; it is never lowered", ErrInvalid, s.ClusterVersion())}
	case v > version.Protocol:
		return Result{Err: &FormatError{What: "command", Unknown: fmt.Sprintf("SetClusterVersion to %d", v)}}
	}
	s.bump()
	before := s.ClusterVersion()
	s.clusterVersion = v
	if before < historyVersion && v >= historyVersion {
		s.startKVHistory()
	}
	return Result{}
}

// errUnknownCommand is Apply's answer to a command this build does not
// know: the state machine stops at it (FSM.ApplyBatch).
func unknownCommand(cmd *fsmpb.Command) error {
	what := "no operation"
	if u := cmd.ProtoReflect().GetUnknown(); len(u) > 0 {
		what = fmt.Sprintf("fields this build does not know, %d bytes", len(u))
	}
	return &FormatError{What: "command", Unknown: what}
}

// checkSnapshotVersion refuses a snapshot written in, or at a cluster
// version of, a newer format than this build speaks.
func checkSnapshotVersion(snap *fsmpb.Snapshot) error {
	if v := max(snap.GetFormatVersion(), snap.GetClusterVersion()); v > version.Protocol {
		return &FormatError{What: "snapshot", Version: v}
	}
	return nil
}

// LimitsAllowed is l without the limits the cluster version cluster does
// not allow yet (Gates): the change a node may propose of its configured
// limits, the rest once the version is raised.
func LimitsAllowed(l Limits, cluster uint32) Limits {
	p := LimitsToProto(l)
	m := p.ProtoReflect()
	var newer []protoreflect.FieldDescriptor
	m.Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		if gates[fd.FullName()] > cluster {
			newer = append(newer, fd)
		}
		return true
	})
	for _, fd := range newer {
		m.Clear(fd)
	}
	return LimitsFromProto(p)
}
