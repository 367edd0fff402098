package fsm

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// Export returns the whole state with every list in a deterministic order:
// equal states export to equal messages.
func (s *State) Export() *fsmpb.Snapshot {
	snap := s.exportCore()
	exportKV(snap, s.kv.tree)
	exportKVHistory(snap, s.copyKVHistory())
	exportQueues(snap, s.CloneQueues())
	return snap
}

// exportQueues adds the cloned queues to snap, their items as
// Snapshot.queue_items.
func exportQueues(snap *fsmpb.Snapshot, qs QueueSnapshot) {
	snap.Queues = qs.Export()
	_ = qs.Items(func(c *fsmpb.QueueItems) error {
		snap.QueueItems = append(snap.QueueItems, &fsmpb.QueueItems{Queue: c.GetQueue(), Dead: c.GetDead(), Packed: append([]byte(nil), c.GetPacked()...)})
		return nil
	})
}

// exportCore is Export without the keys of the key-value store and the
// queues, which may be large: FSM.Snapshot clones those copy-on-write under
// the lock and serialises them after it. It builds the message of a
// coreCopy at once (FSM.Snapshot builds it outside the lock), so it
// needs no clone of the session index.
func (s *State) exportCore() *fsmpb.Snapshot {
	return s.copyCoreWith(s.sessionOrder, s.ttls).export()
}

// Import builds a state from a snapshot made by Export. The state may
// share snap's bytes: snap must not change afterwards.
func Import(snap *fsmpb.Snapshot) (*State, error) {
	var items itemLoader
	for _, c := range snap.GetQueueItems() {
		if err := items.chunk(c); err != nil {
			return nil, err
		}
	}
	return importWith(snap, &items)
}

// importWith is Import with the queue items gathered already (snap's own
// queue_items are ignored).
func importWith(snap *fsmpb.Snapshot, items *itemLoader) (*State, error) {
	if err := checkSnapshotVersion(snap); err != nil {
		return nil, err
	}
	s := NewState()
	s.clusterVersion = max(snap.GetClusterVersion(), 1)
	s.revision = snap.GetRevision()
	if err := checkFenceFloor(snap.GetFenceFloor(), s.revision); err != nil {
		return nil, err
	}
	s.fenceFloor = snap.GetFenceFloor()
	if r := snap.GetRetention(); r != nil {
		if err := ValidateRetention(int(r.GetLockHistory()), int(r.GetRegisterOpMemory())); err != nil {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
		if r.GetLockHistory() > 0 {
			s.historyLimit = int(r.GetLockHistory())
		}
		if r.GetRegisterOpMemory() > 0 {
			s.opMemory = int(r.GetRegisterOpMemory())
		}
	}
	s.limits = s.limits.Merge(LimitsFromProto(snap.GetLimits()))
	sec, err := importSecurity(snap.GetSecurity())
	if err != nil {
		return nil, err
	}
	s.sec = sec
	s.etcdURLs = importEtcdURLs(snap.GetEtcdUrls())
	s.clientAddrs = importEtcdURLs(snap.GetClientAddrs())
	for _, ss := range snap.GetSessions() {
		hash, err := secretHashOf(ss.GetSecretHash())
		if err != nil {
			return nil, fmt.Errorf("snapshot: session %d: %w", ss.GetId(), err)
		}
		s.addSession(&session{id: ss.GetId(), owner: ss.GetOwner(), ttlMs: ss.GetTtlMs(), secretHash: hash, identity: ss.GetIdentity(), etcdLease: ss.GetEtcdLease()})
	}
	for _, ls := range snap.GetLocks() {
		l := &lock{name: ls.GetName(), delayed: ls.GetDelayed(), delayGen: ls.GetDelayGeneration(), delayMs: ls.GetDelayMs(), permits: int(max(ls.GetPermits(), 1)), election: ls.GetElection()}
		holders := ls.GetHolders()
		if g := ls.GetHolder(); g != nil && len(holders) == 0 {
			holders = []*fsmpb.GrantState{g} // written before semaphores
		}
		for _, g := range holders {
			sess := s.sessions[g.GetSession()]
			if sess == nil {
				return nil, fmt.Errorf("snapshot: lock %q held by unknown session %d", l.name, g.GetSession())
			}
			l.holders = append(l.holders, &grant{sess: sess, token: g.GetToken(), acqRev: g.GetAcquireRevision(), delayMs: g.GetLockDelayMs(), shared: g.GetShared(), value: g.GetValue()})
			if g.GetShared() {
				l.nshared++
			}
			sess.hold(l.name)
		}
		for _, ws := range ls.GetWaiters() {
			sess := s.sessions[ws.GetSession()]
			if sess == nil {
				return nil, fmt.Errorf("snapshot: lock %q awaited by unknown session %d", l.name, ws.GetSession())
			}
			s.addWaiter(l, &waiter{sess: sess, acqRev: ws.GetAcquireRevision(), delayMs: ws.GetLockDelayMs(), shared: ws.GetShared(), value: ws.GetValue()})
		}
		for _, h := range ls.GetHistory() {
			l.history = append(l.history, histFromProto(h))
		}
		if len(l.holders) > 0 {
			s.heldLocks++
		}
		if l.delayed {
			s.delayedLocks++
		}
		s.addLock(l)
		s.forget(l) // written before unused locks were removed
	}
	for _, h := range snap.GetRemovedLockHistory() {
		s.past.add(h.GetName(), []histRec{histFromProto(h)})
	}
	for _, rs := range snap.GetRegisters() {
		if l := rs.GetLock(); l != "" {
			if err := ValidateName("register lock", l); err != nil {
				return nil, fmt.Errorf("snapshot: register %q: %w", rs.GetKey(), err)
			}
		}
		r := &register{value: rs.GetValue(), token: rs.GetToken(), modRev: rs.GetModRevision(), opIdx: make(map[string]int), lock: rs.GetLock()}
		for _, op := range rs.GetOps() {
			r.remember(opRec{id: op.GetOperationId(), result: PutOutcome(op.GetResult()), token: op.GetToken()}, s.opMemory)
		}
		s.addRegister(rs.GetKey(), r)
		s.registerBytes += uint64(len(rs.GetKey()) + len(r.value))
	}
	s.deleted.floor = snap.GetRegisterFloor()
	for _, d := range snap.GetDeletedRegisters() {
		if err := ValidateName("deleted register key", d.GetKey()); err != nil {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
		if l := d.GetLock(); l != "" {
			if err := ValidateName("deleted register lock", l); err != nil {
				return nil, fmt.Errorf("snapshot: %w", err)
			}
		}
		s.deleted.record(d.GetKey(), d.GetToken(), d.GetLock())
	}
	if err := s.importKV(snap); err != nil {
		return nil, err
	}
	if err := s.importKVHistory(snap); err != nil {
		return nil, err
	}
	if err := s.importZnodes(snap); err != nil {
		return nil, err
	}
	if err := s.importQueues(snap.GetQueues(), items); err != nil {
		return nil, err
	}
	return s, nil
}

// ReadSnapshot decodes a snapshot written by FSM.Snapshot's Persist (or
// any encoding of a Snapshot) from r and builds its state. It reads the
// stream field by field: the queue items chunk by chunk as they come
// (queue_snapshot.go), everything else into one message decoded at the
// end, so the snapshot is never held whole in memory.
func ReadSnapshot(r io.Reader) (*State, error) {
	br := bufio.NewReaderSize(r, 1<<20)
	var core []byte
	var items itemLoader
	for {
		tag, err := binary.ReadUvarint(br)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading a field tag: %w", unexpectedEOF(err))
		}
		num, typ := protowire.DecodeTag(tag)
		if !num.IsValid() {
			return nil, fmt.Errorf("field number %d is invalid", num)
		}
		switch typ {
		case protowire.VarintType:
			v, err := binary.ReadUvarint(br)
			if err != nil {
				return nil, fmt.Errorf("reading field %d: %w", num, unexpectedEOF(err))
			}
			core = protowire.AppendVarint(protowire.AppendTag(core, num, typ), v)
		case protowire.Fixed32Type, protowire.Fixed64Type, protowire.BytesType:
			size := uint64(4)
			if typ == protowire.Fixed64Type {
				size = 8
			}
			if typ == protowire.BytesType {
				if size, err = binary.ReadUvarint(br); err != nil {
					return nil, fmt.Errorf("reading the length of field %d: %w", num, unexpectedEOF(err))
				}
				if size > maxSnapshotField {
					return nil, fmt.Errorf("field %d is %d bytes long", num, size)
				}
			}
			if num == snapshotQueueItems && typ == protowire.BytesType {
				buf, err := appendRead(nil, br, size)
				if err != nil {
					return nil, fmt.Errorf("reading queue items: %w", unexpectedEOF(err))
				}
				c, err := parseQueueItems(buf)
				if err != nil {
					return nil, fmt.Errorf("queue items: %w", err)
				}
				if err := items.chunk(c); err != nil {
					return nil, err
				}
				continue
			}
			core = protowire.AppendTag(core, num, typ)
			if typ == protowire.BytesType {
				core = protowire.AppendVarint(core, size)
			}
			if core, err = appendRead(core, br, size); err != nil {
				return nil, fmt.Errorf("reading field %d: %w", num, unexpectedEOF(err))
			}
		default:
			return nil, fmt.Errorf("field %d has wire type %d", num, typ)
		}
	}
	snap := &fsmpb.Snapshot{}
	if err := proto.Unmarshal(core, snap); err != nil {
		return nil, err
	}
	return importWith(snap, &items)
}

// parseQueueItems decodes a QueueItems message whose packed items keep
// sharing b (proto.Unmarshal would copy them).
func parseQueueItems(b []byte) (*fsmpb.QueueItems, error) {
	c := &fsmpb.QueueItems{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			if !utf8.Valid(v) {
				return nil, errors.New("the queue name is not valid UTF-8")
			}
			c.Queue, b = string(v), b[n:]
		case num == 2 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			c.Dead, b = protowire.DecodeBool(v), b[n:]
		case num == 3 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			c.Packed, b = v, b[n:]
		default: // a field this version does not know
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	return c, nil
}

// maxSnapshotField bounds one length-delimited field of a snapshot read
// by ReadSnapshot (the key-value store and the queues' own state are
// fields of that kind; their items come in chunks).
const maxSnapshotField = 1 << 34

func unexpectedEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

func histToProto(name string, h histRec) *fsmpb.HistoryRecord {
	return &fsmpb.HistoryRecord{Name: name, Owner: h.owner, Session: h.session, Token: h.token, GrantedRevision: h.grantedRev, Ended: h.ended, EndedRevision: h.endedRev}
}

func histFromProto(h *fsmpb.HistoryRecord) histRec {
	return histRec{owner: h.GetOwner(), session: h.GetSession(), token: h.GetToken(), grantedRev: h.GetGrantedRevision(), ended: h.GetEnded(), endedRev: h.GetEndedRevision()}
}

// ValidateSnapshot checks that every number a snapshot holds that the
// state machine drew from its revision (session ids, grant and delivery
// tokens, acquire, grant, modify, create and retire revisions, queue item
// ids, the fence and register floors) is at or below its revision, and
// that no lock has more holders than it can; it fails with ErrInvalid
// naming the first that is not. A state edited past these would let a
// restored holder or register carry a token above the revision, so that
// the tokens granted after it went backwards. A restore through the API
// runs it before Import (node.RestoreSnapshot); the state machine's own
// snapshots, which it wrote, are not checked again, so that a data
// directory written by an earlier version (which accepted fenced writes
// with tokens never issued) still starts.
func ValidateSnapshot(snap *fsmpb.Snapshot) error {
	rev := snap.GetRevision()
	above := func(what string, n uint64) error {
		if n > rev {
			return fmt.Errorf("%w: snapshot: %s %d is above the snapshot's revision %d", ErrInvalid, what, n, rev)
		}
		return nil
	}
	check := func(errs ...error) error { // the first, for a one-line answer
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		return nil
	}
	if err := check(above("the fence floor", snap.GetFenceFloor()), above("the register floor", snap.GetRegisterFloor())); err != nil {
		return err
	}
	seen := make(map[uint64]bool, len(snap.GetSessions()))
	for _, ss := range snap.GetSessions() {
		if ss.GetId() == 0 || seen[ss.GetId()] {
			return fmt.Errorf("%w: snapshot: session id %d is zero or appears twice", ErrInvalid, ss.GetId())
		}
		seen[ss.GetId()] = true
		if err := above("session id", ss.GetId()); err != nil {
			return err
		}
	}
	hist := func(lock string, h *fsmpb.HistoryRecord) error {
		return check(above(fmt.Sprintf("lock %q history token", lock), h.GetToken()),
			above(fmt.Sprintf("lock %q history grant revision", lock), h.GetGrantedRevision()),
			above(fmt.Sprintf("lock %q history end revision", lock), h.GetEndedRevision()))
	}
	for _, ls := range snap.GetLocks() {
		holders := ls.GetHolders()
		if g := ls.GetHolder(); g != nil && len(holders) == 0 {
			holders = []*fsmpb.GrantState{g}
		}
		permits := int(max(ls.GetPermits(), 1))
		shared := 0
		for _, g := range holders {
			if g.GetToken() == 0 {
				return fmt.Errorf("%w: snapshot: lock %q has a holder with token 0", ErrInvalid, ls.GetName())
			}
			if err := check(above(fmt.Sprintf("lock %q holder token", ls.GetName()), g.GetToken()),
				above(fmt.Sprintf("lock %q holder acquire revision", ls.GetName()), g.GetAcquireRevision())); err != nil {
				return err
			}
			if g.GetShared() {
				shared++
			}
		}
		switch {
		case permits > MaxPermits:
			return fmt.Errorf("%w: snapshot: lock %q has %d permits, the limit is %d", ErrInvalid, ls.GetName(), permits, MaxPermits)
		case shared > 0 && (shared != len(holders) || permits != 1):
			return fmt.Errorf("%w: snapshot: lock %q has readers and %d other holders (%d permits)", ErrInvalid, ls.GetName(), len(holders)-shared, permits)
		case shared == 0 && len(holders) > permits:
			return fmt.Errorf("%w: snapshot: lock %q has %d holders and %d permits", ErrInvalid, ls.GetName(), len(holders), permits)
		}
		for _, w := range ls.GetWaiters() {
			if err := above(fmt.Sprintf("lock %q waiter acquire revision", ls.GetName()), w.GetAcquireRevision()); err != nil {
				return err
			}
		}
		for _, h := range ls.GetHistory() {
			if err := hist(ls.GetName(), h); err != nil {
				return err
			}
		}
	}
	for _, h := range snap.GetRemovedLockHistory() {
		if err := hist(h.GetName(), h); err != nil {
			return err
		}
	}
	for _, rs := range snap.GetRegisters() {
		if err := check(above(fmt.Sprintf("register %q token", rs.GetKey()), rs.GetToken()),
			above(fmt.Sprintf("register %q modify revision", rs.GetKey()), rs.GetModRevision())); err != nil {
			return err
		}
		for _, op := range rs.GetOps() {
			if err := above(fmt.Sprintf("register %q operation token", rs.GetKey()), op.GetToken()); err != nil {
				return err
			}
		}
	}
	for _, d := range snap.GetDeletedRegisters() {
		if err := above(fmt.Sprintf("deleted register %q token", d.GetKey()), d.GetToken()); err != nil {
			return err
		}
	}
	for _, kv := range snap.GetKv() {
		if err := check(above(fmt.Sprintf("key %q create revision", kv.GetKey()), kv.GetCreateRevision()),
			above(fmt.Sprintf("key %q modify revision", kv.GetKey()), kv.GetModRevision()),
			above(fmt.Sprintf("key %q session", kv.GetKey()), kv.GetSession())); err != nil {
			return err
		}
	}
	for _, q := range snap.GetQueues() {
		if err := above(fmt.Sprintf("queue %q empty-since revision", q.GetName()), q.GetEmptySince()); err != nil {
			return err
		}
		for _, it := range q.GetInFlight() {
			if err := check(above(fmt.Sprintf("queue %q item id", q.GetName()), it.GetId()),
				above(fmt.Sprintf("queue %q delivery token", q.GetName()), it.GetDeliveryToken())); err != nil {
				return err
			}
		}
		for _, m := range append(append([]*fsmpb.QueueMemo(nil), q.GetOps()...), q.GetAcks()...) {
			if err := check(above(fmt.Sprintf("queue %q remembered item id", q.GetName()), m.GetId()),
				above(fmt.Sprintf("queue %q remembered token", q.GetName()), m.GetToken())); err != nil {
				return err
			}
		}
	}
	if sec := snap.GetSecurity(); sec != nil {
		for _, t := range sec.GetTokens() {
			if err := above(fmt.Sprintf("ACL token %q create revision", t.GetId()), t.GetCreateRevision()); err != nil {
				return err
			}
		}
		for _, k := range sec.GetSigningKeys() {
			if err := check(above(fmt.Sprintf("signing key %s create revision", k.GetId()), k.GetCreateRevision()),
				above(fmt.Sprintf("signing key %s retire revision", k.GetId()), k.GetRetiredRevision())); err != nil {
				return err
			}
		}
	}
	return nil
}
