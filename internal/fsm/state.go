package fsm

import (
	"errors"
	"fmt"
	"sort"
	"unicode/utf8"

	"github.com/google/btree"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/version"
)

// Limits the state machine enforces on every command. They are part of the
// replicated contract: changing them changes how the log is interpreted, so
// they are constants, not configuration.
const (
	MinSessionTTLMs = 1_000     // 1 s
	MaxSessionTTLMs = 3_600_000 // 1 h
	// MaxEtcdLeaseTTLMs bounds the TTL of an etcd lease: etcd's maximum,
	// 9,000,000,000 s.
	MaxEtcdLeaseTTLMs = 9_000_000_000 * 1000
	MaxNameLen        = 512      // lock names and register keys, bytes
	MaxOwnerLen       = 256      // bytes
	MaxValueLen       = 64 << 10 // fenced register values and proclaimed values, bytes
	MaxOpIDLen        = 256      // bytes
	MaxLockDelayMs    = 60_000   // 1 min, as Chubby's upper bound
	MaxPermits        = 10_000   // permits of one semaphore
	// HistoryLimit is how many grant records each lock keeps by default
	// (SetRetention changes it, up to MaxHistoryLimit).
	HistoryLimit    = 32
	MaxHistoryLimit = 10_000
	// OpMemory is how many recent operation ids each fenced register
	// remembers by default; a replay of an id older than that is applied as
	// new. SetRetention changes it, up to MaxOpMemory.
	OpMemory    = 128
	MaxOpMemory = 100_000
)

// Sentinel errors returned in Result.Err. The RPC layer maps each to one
// gRPC code in one place.
var (
	// ErrInvalid: the command's arguments are out of range.
	ErrInvalid = errors.New("tenure: invalid argument")
	// ErrSessionNotFound: the session was closed or has expired.
	ErrSessionNotFound = errors.New("tenure: session expired or not found")
	// ErrBusy: a try-once acquire found the lock held.
	ErrBusy = errors.New("tenure: lock is held")
	// ErrNotHeld: the handle (session, token) is not the lock's current holder.
	ErrNotHeld = errors.New("tenure: lock not held by this handle")
	// ErrAlreadyHeld: the session already holds or waits for this lock.
	ErrAlreadyHeld = errors.New("tenure: session already holds or waits for this lock")
	// ErrPermissionDenied: the request acts on an object (a session, a
	// delivery) without the capability the service issued for it, or with
	// a wrong one. Nothing was changed.
	ErrPermissionDenied = errors.New("tenure: permission denied")
)

// PutOutcome is what a FencedPut did.
type PutOutcome uint32

// The values of PutOutcome; they match the API's PutResult numbers.
const (
	PutAccepted PutOutcome = 1
	PutStale    PutOutcome = 2
)

// Result is what applying one command returns to the proposer.
type Result struct {
	Err      error
	Revision uint64 // the state's revision after the command

	Session uint64 // CreateSession: the new session's id
	Expired int    // ExpireSessions: how many of its sessions it ended

	// Acquire: either Granted with Token, or Queued at Position.
	Granted         bool
	Token           uint64
	Queued          bool
	Position        uint32
	AcquireRevision uint64

	// FencedPut
	Put           PutOutcome
	Duplicate     bool
	AcceptedToken uint64

	// Batch: one result per command, in order.
	Batch []Result

	// KV: the result of a key-value command (kv.go).
	KV *KVResult
	// Queue: the result of a queue command (see queue.go).
	Queue *QueueResult
	// Zk: the result of a ZkTxn (znode.go).
	Zk *ZkResult
}

// EventKind says what an Event reports.
type EventKind uint8

// Event kinds.
const (
	// EventGranted: a queued acquisition (Session, Name, AcquireRevision) was
	// granted with Token by someone else's command.
	EventGranted EventKind = iota + 1
	// EventWaitEnded: a queued acquisition was removed without a grant
	// because its session ended.
	EventWaitEnded
	// EventSessionCreated: Session with TTLMs now exists.
	EventSessionCreated
	// EventSessionEnded: Session ended; Expired says whether by expiry.
	EventSessionEnded
	// EventDelayStarted: lock Name is held back for DelayMs; the leader
	// proposes EndLockDelay(Name, Generation) when it has passed.
	EventDelayStarted
	// EventHolderChanged: lock Name's first holder (an election's leader)
	// or its value changed; Session/Owner/Token/Value describe the new
	// first holder (Session 0: none), Revision orders the changes.
	EventHolderChanged
)

// Event is a side effect of Apply that waiting clients or the leader's
// timers must learn about. Events are derived from the log alone, so every
// replica emits the same ones.
type Event struct {
	Kind            EventKind
	Session         uint64
	Name            string
	Token           uint64
	AcquireRevision uint64
	TTLMs           int64
	DelayMs         int64
	Generation      uint64
	Expired         bool
	Owner           string
	Value           []byte
	Revision        uint64
	// KV: the key of EventKVPut / EventKVDelete (kv.go); Prev: the key
	// before the change (nil: it did not exist).
	KV, Prev *KV
	// Queue: the details of a queue event (see queue.go).
	Queue *QueueEvent
	// ZnodeType: what EventZnode reports of the znode Name (znode.go);
	// ZnodeACL: that znode's ACL (before its removal, for a delete), so
	// that a watch on an ancestor is told only of the znodes its client
	// may read. Shared with the state: read only.
	ZnodeType ZnodeEventType
	ZnodeACL  []*fsmpb.ZnodeACL
}

// State is the pure, deterministic lock authority: sessions, locks with FIFO
// waiters, and fenced registers. It is not safe for concurrent use; FSM
// serialises access to it.
type State struct {
	// faults holds the fault-injection switches; it is empty unless built
	// with the tenurefault tag (see faults.go).
	faults faults

	revision     uint64
	historyLimit int // grant records kept per lock
	opMemory     int // operation ids remembered per fenced register
	limits       Limits
	waiting      uint64 // queued acquires on all locks (max-total-waiters)
	// sessions, locks and registers are each indexed by an ordered tree
	// too; they change only through addSession, removeSession, addLock,
	// removeLock, addRegister and removeRegister (index.go).
	sessions      map[uint64]*session
	sessionOrder  *btree.BTreeG[*session]
	locks         map[string]*lock
	lockOrder     *btree.BTreeG[*lock]
	past          pastHistory // grant records of removed locks (history.go)
	registers     map[string]*register
	registerOrder *btree.BTreeG[string]
	registerBytes uint64      // keys and values of all registers (max-register-bytes)
	deleted       deletedRegs // recent fenced deletes and the register floor (deleted.go)
	kv            kvStore
	queues        queueSet   // see queue.go
	zk            znodeStore // ZooKeeper's znodes (znode.go)

	fenceFloor uint64 // fenced writes at or below it are stale (fencefloor.go)

	// heldLocks and delayedLocks count the locks with a holder and those
	// held back by a lock-delay; counters counts what was applied. All
	// three are derived from the rest and not exported (stats.go).
	heldLocks, delayedLocks int
	counters                Counters
	sec                     *Security         // ACLs and signing keys, replaced on change (acl.go)
	etcdURLs                map[string]string // member -> its etcd API address (etcdurls.go)
	clientAddrs             map[string]string // member -> its Tenure API address (clientaddrs.go)
	// etcdLeases counts the sessions that are etcd leases (derived:
	// addSession and removeSession keep it), so that they have a limit
	// of their own, apart from Tenure's sessions.
	etcdLeases uint64
	// ttls holds the TTLs that SetSessionTTL changed, by session: a
	// session's own ttlMs never changes (a snapshot reads it after the
	// state lock is released, snapcore.go), and this index of values is
	// cloned copy-on-write with it (sessionttl.go). removeSession drops
	// a session's entry.
	ttls *btree.BTreeG[sessionTTL]
	// clusterVersion is the replicated cluster version (version.go; 0
	// reads as 1): which formats may be written, and which meaning the
	// commands whose meaning changed have.
	clusterVersion uint32
}

// NewState returns an empty state at revision 0, at the newest cluster
// version (a state a node builds from a log or snapshot starts at version
// 1 instead: FSM, Import).
func NewState() *State {
	return &State{
		clusterVersion: version.Protocol,
		historyLimit:   HistoryLimit,
		opMemory:       OpMemory,
		limits:         DefaultLimits(),
		sessions:       make(map[uint64]*session),
		sessionOrder:   newSessionOrder(),
		ttls:           newSessionTTLs(),
		locks:          make(map[string]*lock),
		lockOrder:      newLockOrder(),
		registers:      make(map[string]*register),
		registerOrder:  newRegisterOrder(),
		kv:             newKVStore(),
		zk:             newZnodeStore(),
		sec:            emptySecurity(),
	}
}

// Revision is the number of state changes applied so far.
func (s *State) Revision() uint64 { return s.revision }

func (s *State) bump() uint64 {
	s.revision++
	return s.revision
}

// EventSink receives the events of Apply, in order. It may be nil.
type EventSink func(Event)

// Apply executes one command. It reads nothing but the state and the
// command, so every replica that applies the same log reaches the same state.
func (s *State) Apply(cmd *fsmpb.Command, emit EventSink) Result {
	if emit == nil {
		emit = func(Event) {}
	}
	var r Result
	if err := s.gateApply(cmd); err != nil {
		return Result{Err: err, Revision: s.revision}
	}
	s.unpackKeys(cmd) // keys that are not UTF-8 (keysbin.go)
	switch op := cmd.GetOp().(type) {
	case *fsmpb.Command_SetClusterVersion:
		r = s.setClusterVersion(op.SetClusterVersion)
	case *fsmpb.Command_CreateSession:
		r = s.createSession(op.CreateSession, emit)
	case *fsmpb.Command_CloseSession:
		r = s.endSession(op.CloseSession.GetSession(), false, emit)
	case *fsmpb.Command_ExpireSession:
		r = s.endSession(op.ExpireSession.GetSession(), true, emit)
	case *fsmpb.Command_ExpireSessions:
		r = s.expireSessions(op.ExpireSessions.GetSessions(), emit)
	case *fsmpb.Command_Acquire:
		r = s.acquire(op.Acquire, emit)
	case *fsmpb.Command_CancelAcquire:
		r = s.cancelAcquire(op.CancelAcquire, emit)
	case *fsmpb.Command_Release:
		r = s.release(op.Release, emit)
	case *fsmpb.Command_EndLockDelay:
		r = s.endLockDelay(op.EndLockDelay, emit)
	case *fsmpb.Command_FencedPut:
		r = s.fencedPut(op.FencedPut)
		s.counters.fenced(r)
	case *fsmpb.Command_FencedDelete:
		r = s.fencedDelete(op.FencedDelete)
		s.counters.fenced(r)
	case *fsmpb.Command_Proclaim:
		r = s.proclaim(op.Proclaim, emit)
	case *fsmpb.Command_SetRetention:
		r = s.setRetention(op.SetRetention)
	case *fsmpb.Command_SetLimits:
		r = s.setLimits(op.SetLimits)
	case *fsmpb.Command_KvPut:
		r = s.kvApplyPut(op.KvPut, emit)
	case *fsmpb.Command_KvDelete:
		r = s.kvApplyDelete(op.KvDelete, emit)
	case *fsmpb.Command_KvTxn:
		r = s.kvApplyTxn(op.KvTxn, emit)
	case *fsmpb.Command_KvCompact:
		r = s.kvCompact(op.KvCompact)
	case *fsmpb.Command_AclBootstrap:
		r = s.aclBootstrap(op.AclBootstrap)
	case *fsmpb.Command_AclPolicySet:
		r = s.aclPolicySet(op.AclPolicySet)
	case *fsmpb.Command_AclPolicyDelete:
		r = s.aclPolicyDelete(op.AclPolicyDelete)
	case *fsmpb.Command_AclTokenCreate:
		r = s.aclTokenCreate(op.AclTokenCreate)
	case *fsmpb.Command_AclTokenRevoke:
		r = s.aclTokenRevoke(op.AclTokenRevoke)
	case *fsmpb.Command_AclBindingSet:
		r = s.aclBindingSet(op.AclBindingSet)
	case *fsmpb.Command_AclEnable:
		r = s.aclEnable()
	case *fsmpb.Command_AclBindingDelete:
		r = s.aclBindingDelete(op.AclBindingDelete)
	case *fsmpb.Command_AddSigningKey:
		r = s.addSigningKey(op.AddSigningKey)
	case *fsmpb.Command_RetireSigningKey:
		r = s.retireSigningKey(op.RetireSigningKey)
	case *fsmpb.Command_RemoveSigningKey:
		r = s.removeSigningKey(op.RemoveSigningKey)
	case *fsmpb.Command_AclTokenUpdate:
		r = s.aclTokenUpdate(op.AclTokenUpdate)
	case *fsmpb.Command_SetEtcdUrl:
		r = s.setEtcdURL(op.SetEtcdUrl)
	case *fsmpb.Command_SetClientAddr:
		r = s.setClientAddr(op.SetClientAddr)
	case *fsmpb.Command_ZkTxn:
		r = s.zkTxn(op.ZkTxn, emit)
	case *fsmpb.Command_ZkSetAddr:
		r = s.setZkAddr(op.ZkSetAddr)
	case *fsmpb.Command_SetSessionTtl:
		r = s.setSessionTTL(op.SetSessionTtl, emit)
	case *fsmpb.Command_Batch:
		r.Batch = make([]Result, len(op.Batch.GetCommands()))
		for i, c := range op.Batch.GetCommands() {
			if _, nested := c.GetOp().(*fsmpb.Command_Batch); nested {
				r.Batch[i] = Result{Err: fmt.Errorf("%w: nested batch", ErrInvalid), Revision: s.revision}
				continue
			}
			r.Batch[i] = s.Apply(c, emit)
		}
	default:
		var ok bool
		if r, ok = s.applyQueue(cmd, emit); !ok {
			r.Err = unknownCommand(cmd) // the state machine stops (FSM.ApplyBatch)
		}
	}
	r.Revision = s.revision
	return r
}

// ValidateName checks a lock name or register key.
func ValidateName(kind, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: %s must not be empty", ErrInvalid, kind)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: %s is %d bytes, the limit is %d", ErrInvalid, kind, len(name), MaxNameLen)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, kind)
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
