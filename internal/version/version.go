// Package version says which build of Tenure this is.
package version

import (
	"runtime"
	"runtime/debug"
)

// Version is set at link time for a release:
//
//	go build -ldflags "-X github.com/tenure-io/tenure/internal/version.Version=v1.2.0" ./cmd/tenure
//
// Empty: the module version from the build information, or "devel".
var Version string

// String is this build's version: Version, else the main module's version
// (as `go install module@version` records it), else "devel", with the
// VCS revision when the build recorded one ("devel+1a2b3c4d5e6f").
func String() string {
	if Version != "" {
		return Version
	}
	v := "devel"
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	if mv := bi.Main.Version; mv != "" && mv != "(devel)" {
		return mv
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += "+" + s.Value[:12]
		}
	}
	return v
}

// Go is the Go release this build was made with.
func Go() string { return runtime.Version() }

// Protocol versions
//
// Every replicated format this build writes (a log entry's framing and
// command, a snapshot) has a format version, and the cluster agrees on
// the newest one every member may write: its cluster version, raised by
// the leader only once every voter reports a protocol at least that new
// (internal/fsm/version.go, internal/node/upgrade.go). A build reads every
// format from MinProtocol to Protocol and stops at anything newer.
//
// Version 1 is every format written before versions were recorded: a
// member that reports no version counts as 1.
//
// Version 2: the commands AclEnable, RetireSigningKey, RemoveSigningKey,
// AclTokenUpdate, SetClientAddr and SetClusterVersion; the etcd lease limit of its own;
// registers bound to a lock; a transaction's answer bound; ACLs put in
// force on every member by their bootstrap.
//
// Version 3: the etcd API's history of past revisions and its compaction
// (KVHistoryCompact, the limits max_kv_history_revisions and
// max_kv_history_bytes, the snapshot's kv_history and kv_compact_revision),
// nested transactions, keys that are not UTF-8 (key_bin) and values up
// to 1.5 MiB, and ZooKeeper's znodes with the leader's removal of emptied
// containers (ZkDelete.container), null data (data_null), TTL nodes
// (ZkCreate.ttl_ms, ZnodeState.ttl_ms, and their removal: ZkDelete.ttl,
// seen_mzxid, seen_cversion), and a session's TTL renegotiated by a
// ZooKeeper client that resumes it (SetSessionTTL); each command and
// field is named in internal/fsm's Gates.
const (
	// Protocol is the newest format version this build reads and writes.
	Protocol uint32 = 3
	// MinProtocol is the oldest cluster version this build serves in:
	// it may join (or be upgraded into) a cluster whose members speak
	// MinProtocol or newer.
	MinProtocol uint32 = 1
)
