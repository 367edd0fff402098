package zkapi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/server"
)

// More of ZooKeeper's codes the front answers with.
const (
	codeMarshalling fsm.ZkCode = -5
	codeAuthFailed  fsm.ZkCode = -115
	codeNoWatcher   fsm.ZkCode = -121
	codeSystemError fsm.ZkCode = -1
)

// errBadPacket: a request did not decode; ZooKeeper closes such a
// connection.
var errBadPacket = errors.New("zookeeper: malformed request")

// request serves one request packet. An error ends the connection.
func (c *conn) request(ctx context.Context, pkt []byte) error {
	d := decoder{b: pkt}
	h := requestHeader{xid: d.int(), op: d.int()}
	if d.err != nil {
		return errBadPacket
	}
	c.cur.xid, c.cur.op, c.cur.start, c.cur.pending = h.xid, h.op, time.Now(), true
	if c.hasToken && !c.tokenValid(ctx) {
		// The token was revoked: what it opened ends. The client,
		// reconnecting, sends its addAuth again and is refused.
		return errConnLoss
	}
	if err := c.touch(ctx, h.op == opPing); err != nil {
		return err
	}
	body := d.b
	switch h.op {
	case opPing:
		c.z.w.mu.Lock()
		c.reply(h.xid, int64(c.z.w.fed), fsm.ZkOK, nil)
		c.z.w.mu.Unlock()
		return nil
	case opCloseSession:
		c.ending.Store(true)
		if c.up != nil {
			rh, rb, err := c.up.call(ctx, opCloseSession, nil)
			if err != nil {
				return errConnLoss
			}
			_ = c.answerAt(ctx, uint64(rh.zxid), h.xid, fsm.ZkCode(rh.err), rb)
			return errClosing
		}
		res, err := c.z.front.Propose(ctx, &fsmpb.CloseSession{Session: c.session})
		if err != nil && !errors.Is(err, fsm.ErrSessionNotFound) {
			return errConnLoss
		}
		_ = c.answerAt(ctx, res.Revision, h.xid, fsm.ZkOK, nil)
		return errClosing
	case opAuth:
		return c.addAuth(ctx, h, body)
	case opCreate, opCreate2, opCreateContainer, opCreateTTL, opDelete, opSetData, opSetACL, opMulti, opCheck:
		return c.write(ctx, h, body)
	case opSync:
		return c.sync(ctx, h, body)
	case opSetWatches, opSetWatches2:
		return c.setWatches(ctx, h, body)
	}
	return c.readOp(ctx, h, body)
}

// zkRight is the Tenure right a znode path needs under --auth: read or
// write on the key-value name "zk" + path (docs/zookeeper.md).
func zkRight(path string, write bool) server.Right {
	if write {
		return server.WriteRight(fsm.KindKV, "zk"+path)
	}
	return server.ReadRight(fsm.KindKV, "zk"+path)
}

// allowed checks the Tenure rights of the request's paths when the ACLs
// are enforced: an anonymous client (no addAuth with a token, no
// verified client certificate) or a caller without the right is refused
// with NoAuth, as ZooKeeper refuses a client its ACLs do not name. A
// token named by addAuth takes precedence over a certificate.
func (c *conn) allowed(method string, write bool, paths ...string) bool {
	if !c.z.srv.AuthEnforced() {
		return true
	}
	sec := c.z.front.Security()
	caller := c.caller
	switch {
	case c.hasToken:
	case c.certNames != nil: // a verified client certificate, as on Tenure's API
		caller = c.z.srv.ResolveCaller(context.Background(), sec, "", false, c.certNames)
	default:
		return false
	}
	for _, p := range paths {
		r := zkRight(p, write)
		if _, ok := c.z.srv.Missing(caller, sec, r); !ok {
			_ = c.z.srv.Denied(caller, "zookeeper/"+method, r)
			return false
		}
	}
	return true
}

// tokenValid re-resolves the connection's token against the current
// ACLs (its policies may have changed, or it may have been revoked).
func (c *conn) tokenValid(ctx context.Context) bool {
	caller := c.z.srv.ResolveCaller(ctx, c.z.front.Security(), c.tokenSecret, true, nil)
	if caller.BadToken() || caller.Identity() != c.caller.Identity() {
		return false
	}
	c.z.w.mu.Lock()
	c.caller = caller
	c.z.w.mu.Unlock()
	return true
}

// op is one decoded write op.
type op struct {
	typ int32
	zk  *fsmpb.ZkOp
}

// decodeWrite decodes the body of a write request of type typ, TTL
// nodes allowed.
func decodeWrite(typ int32, d *decoder) (*fsmpb.ZkOp, fsm.ZkCode) {
	return decodeWriteIn(typ, d, false, true)
}

// multiCreateType is the type of a create op of a multi: ZooKeeper
// (MultiOperationRecord) reads create, create2 and createContainer alike
// and types the op by its flags, so a create2 answers as a create (the
// path alone) and a container as a create2 (path and stat).
func multiCreateType(flags int32) int32 {
	switch {
	case flags == fsm.ZkContainer:
		return opCreateContainer
	case isTTLMode(flags):
		return opCreateTTL
	}
	return opCreate
}

// isTTLMode reports whether create flags are a TTL node's (CreateMode's
// isTTL).
func isTTLMode(flags int32) bool {
	return flags == fsm.ZkPersistentWithTTL || flags == fsm.ZkPersistentSequentialWithTTL
}

// decodeWriteIn decodes a write op; inMulti: an op of a multi, whose
// create ops are typed by their flags (multiCreateType); ttlNodes: TTL
// nodes are on (--zk-ttl-nodes), as ZooKeeper's
// zookeeper.extendedTypesEnabled turns them on.
//
// A TTL create mode (5, 6) is answered Unimplemented while TTL nodes are
// off (PrepRequestProcessor.validateCreateRequest, before anything else).
// Only createTTL carries a ttl: a TTL mode in any other create is
// BadArguments (the state machine finds no ttl), as is a createTTL with
// another mode, as ZooKeeper's EphemeralType.validateTTL refuses them.
// In a multi, ZooKeeper 3.8 reads a createTTL op with another mode as a
// plain create (MultiOperationRecord: the ttl is dropped), and fails a
// multi whose create, create2 or createContainer op has a TTL mode as a
// whole, with MarshallingError: so does this.
func decodeWriteIn(typ int32, d *decoder, inMulti, ttlNodes bool) (*fsmpb.ZkOp, fsm.ZkCode) {
	switch typ {
	case opCreate, opCreate2, opCreateContainer, opCreateTTL:
		cr := &fsmpb.ZkCreate{Path: d.string()}
		cr.Data, cr.DataNull = d.nullableBuffer()
		for _, a := range d.acls() {
			cr.Acl = append(cr.Acl, &fsmpb.ZnodeACL{Perms: a.perms, Scheme: a.scheme, Id: a.id})
		}
		cr.Flags = d.int()
		ttlMode := isTTLMode(cr.Flags)
		if typ == opCreateTTL {
			ttl := d.long()
			switch {
			case ttlMode:
				cr.TtlMs = ttl
			case !inMulti:
				return nil, fsm.ZkBadArguments
			}
		} else if ttlMode && inMulti {
			return nil, codeMarshalling
		}
		if ttlMode && !ttlNodes {
			return nil, fsm.ZkUnimplemented // TTL nodes are off, as ZooKeeper's by default
		}
		if inMulti {
			return &fsmpb.ZkOp{Op: &fsmpb.ZkOp_Create{Create: cr}}, fsm.ZkOK
		}
		if typ == opCreateContainer {
			if cr.Flags != fsm.ZkContainer {
				return nil, fsm.ZkBadArguments
			}
		} else if cr.Flags == fsm.ZkContainer {
			return nil, fsm.ZkBadArguments // a container is made with createContainer only
		}
		return &fsmpb.ZkOp{Op: &fsmpb.ZkOp_Create{Create: cr}}, fsm.ZkOK
	case opDelete:
		return &fsmpb.ZkOp{Op: &fsmpb.ZkOp_Delete{Delete: &fsmpb.ZkDelete{Path: d.string(), Version: d.int()}}}, fsm.ZkOK
	case opSetData:
		sd := &fsmpb.ZkSetData{Path: d.string()}
		sd.Data, sd.DataNull = d.nullableBuffer()
		sd.Version = d.int()
		return &fsmpb.ZkOp{Op: &fsmpb.ZkOp_SetData{SetData: sd}}, fsm.ZkOK
	case opCheck:
		return &fsmpb.ZkOp{Op: &fsmpb.ZkOp_Check{Check: &fsmpb.ZkCheck{Path: d.string(), Version: d.int()}}}, fsm.ZkOK
	case opSetACL:
		sa := &fsmpb.ZkSetACL{Path: d.string()}
		for _, a := range d.acls() {
			sa.Acl = append(sa.Acl, &fsmpb.ZnodeACL{Perms: a.perms, Scheme: a.scheme, Id: a.id})
		}
		sa.Version = d.int()
		return &fsmpb.ZkOp{Op: &fsmpb.ZkOp_SetAcl{SetAcl: sa}}, fsm.ZkOK
	}
	return nil, fsm.ZkUnimplemented
}

func opPath(o *fsmpb.ZkOp) string {
	switch {
	case o.GetCreate() != nil:
		return o.GetCreate().GetPath()
	case o.GetDelete() != nil:
		return o.GetDelete().GetPath()
	case o.GetSetData() != nil:
		return o.GetSetData().GetPath()
	case o.GetCheck() != nil:
		return o.GetCheck().GetPath()
	case o.GetSetAcl() != nil:
		return o.GetSetAcl().GetPath()
	}
	return ""
}

// write serves create, delete, setData, setACL and multi: on a follower
// it relays the request to the leader; on the leader it proposes one
// ZkTxn. The answer waits for this member to apply the write.
func (c *conn) write(ctx context.Context, h requestHeader, body []byte) error {
	if c.up != nil {
		rh, rb, err := c.up.call(ctx, h.op, body)
		if err != nil {
			return errConnLoss
		}
		return c.answerAt(ctx, uint64(rh.zxid), h.xid, fsm.ZkCode(rh.err), rb)
	}
	d := decoder{b: body}
	var ops []op
	if h.op == opMulti {
		for i := 0; ; i++ {
			typ, done := d.int(), d.bool()
			_ = d.int()
			if d.err != nil {
				return errBadPacket
			}
			if done {
				break
			}
			if i >= fsm.MaxZkOps {
				return c.answerAt(ctx, 0, h.xid, fsm.ZkBadArguments, nil)
			}
			zo, code := decodeWriteIn(typ, &d, true, c.z.cfg.TTLNodes)
			if d.err != nil {
				return errBadPacket
			}
			if code != fsm.ZkOK {
				return c.answerAt(ctx, 0, h.xid, code, nil)
			}
			if cr := zo.GetCreate(); cr != nil {
				typ = multiCreateType(cr.GetFlags())
			}
			ops = append(ops, op{typ: typ, zk: zo})
		}
	} else {
		zo, code := decodeWriteIn(h.op, &d, false, c.z.cfg.TTLNodes)
		if d.err != nil {
			return errBadPacket
		}
		if code != fsm.ZkOK {
			return c.answerAt(ctx, 0, h.xid, code, nil)
		}
		ops = []op{{typ: h.op, zk: zo}}
	}
	if h.op == opMulti && len(ops) == 0 {
		var e encoder
		e.int(-1)
		e.bool(true)
		e.int(-1)
		return c.answerAt(ctx, 0, h.xid, fsm.ZkOK, e.b)
	}
	txn := &fsmpb.ZkTxn{Session: c.session, TimeMs: time.Now().UnixMilli(), Ids: c.ids, Multi: h.op == opMulti}
	for _, o := range ops {
		txn.Ops = append(txn.Ops, o.zk)
	}
	for _, o := range txn.Ops {
		if !c.allowed(opName(h.op), true, opPath(o)) {
			return c.answerAt(ctx, 0, h.xid, fsm.ZkNoAuth, nil)
		}
	}
	res, err := c.z.front.Propose(ctx, txn)
	if err != nil && res.Err == nil {
		var ve *fsm.VersionError
		if errors.As(err, &ve) || errors.Is(err, fsm.ErrInvalid) {
			c.z.log.Info("zookeeper write refused", "err", err)
			return c.answerAt(ctx, 0, h.xid, fsm.ZkUnimplemented, nil)
		}
		return errConnLoss
	}
	if res.Err != nil {
		var ze *fsm.ZkError
		switch {
		case errors.As(res.Err, &ze):
			return c.answerAt(ctx, res.Revision, h.xid, ze.Code, nil)
		case errors.Is(res.Err, fsm.ErrVersion):
			return c.answerAt(ctx, res.Revision, h.xid, fsm.ZkUnimplemented, nil)
		}
		c.z.log.Info("zookeeper write failed", "err", res.Err)
		return c.answerAt(ctx, res.Revision, h.xid, codeSystemError, nil)
	}
	var e encoder
	if h.op != opMulti {
		r := res.Zk.Ops[0]
		switch h.op {
		case opCreate:
			e.string(r.Path)
		case opCreate2, opCreateContainer, opCreateTTL:
			e.string(r.Path)
			e.stat(wireStat(r.Stat))
		case opSetData, opSetACL:
			e.stat(wireStat(r.Stat))
		}
		return c.answerAt(ctx, res.Revision, h.xid, fsm.ZkOK, e.b)
	}
	for i, r := range res.Zk.Ops {
		if r.Code != fsm.ZkOK || failedMulti(res.Zk) {
			e.int(opError)
			e.bool(false)
			e.int(int32(r.Code))
			e.int(int32(r.Code))
			continue
		}
		typ := ops[i].typ
		if typ == opCreateContainer || typ == opCreateTTL {
			typ = opCreate2
		}
		e.int(typ)
		e.bool(false)
		e.int(0)
		switch typ {
		case opCreate:
			e.string(r.Path)
		case opCreate2:
			e.string(r.Path)
			e.stat(wireStat(r.Stat))
		case opSetData:
			e.stat(wireStat(r.Stat))
		}
	}
	e.int(-1)
	e.bool(true)
	e.int(-1)
	return c.answerAt(ctx, res.Revision, h.xid, fsm.ZkOK, e.b)
}

func failedMulti(r *fsm.ZkResult) bool {
	for _, o := range r.Ops {
		if o.Code != fsm.ZkOK {
			return true
		}
	}
	return false
}

func opName(op int32) string {
	switch op {
	case opCreate, opCreate2, opCreateContainer, opCreateTTL:
		return "create"
	case opDelete:
		return "delete"
	case opSetData:
		return "setData"
	case opSetACL:
		return "setACL"
	case opMulti:
		return "multi"
	}
	return fmt.Sprintf("op%d", op)
}

func wireStat(s fsm.ZnodeStat) stat {
	return stat{czxid: int64(s.Czxid), mzxid: int64(s.Mzxid), pzxid: int64(s.Pzxid), ctime: s.Ctime, mtime: s.Mtime,
		version: s.Version, cversion: s.Cversion, aversion: s.Aversion, ephemeralOwner: int64(s.EphemeralOwner),
		dataLength: s.DataLength, numChildren: s.NumChildren}
}

// sync makes this member catch up with the leader: on the leader a
// linearizable read; on a follower the leader's answer, then this member
// applies what it had.
func (c *conn) sync(ctx context.Context, h requestHeader, body []byte) error {
	d := decoder{b: body}
	path := d.string()
	if d.err != nil {
		return errBadPacket
	}
	var e encoder
	e.string(path)
	if c.up != nil {
		rh, rb, err := c.up.call(ctx, opSync, body)
		if err != nil {
			return errConnLoss
		}
		return c.answerAt(ctx, uint64(rh.zxid), h.xid, fsm.ZkCode(rh.err), rb)
	}
	if err := c.z.front.LinearizableRead(ctx); err != nil {
		return errConnLoss
	}
	var rev uint64
	c.z.front.Read(func(st *fsm.State) { rev = st.Revision() })
	return c.answerAt(ctx, rev, h.xid, fsm.ZkOK, e.b)
}

// The identities addAuth gives a connection travel in every write it
// proposes (ZkTxn.ids, for the znodes' ACLs), so they are bounded: at
// most maxAuthIDs digests of at most maxAuthLen bytes (user:password).
// Past either, addAuth fails as a wrong one does.
const (
	maxAuthIDs = 16
	maxAuthLen = 1024
)

// addAuth serves an AuthPacket. The digest scheme's user:password is a
// Tenure token's id and secret: a known token gives the connection the
// token's rights under --auth; the digest id (user:base64(sha1)) is the
// identity znode ACLs name, as ZooKeeper computes it. Under --auth an
// unknown token fails (AuthFailed, and the connection closes, as
// ZooKeeper closes it); so does an unknown scheme.
func (c *conn) addAuth(ctx context.Context, h requestHeader, body []byte) error {
	d := decoder{b: body}
	_ = d.int()
	scheme, auth := d.string(), d.buffer()
	if d.err != nil {
		return errBadPacket
	}
	fail := func() error {
		c.z.w.mu.Lock()
		c.reply(h.xid, 0, codeAuthFailed, nil)
		c.z.w.mu.Unlock()
		return errClosing
	}
	if scheme != "digest" {
		return fail()
	}
	userPass := string(auth)
	user, secret, ok := strings.Cut(userPass, ":")
	if !ok || len(userPass) > maxAuthLen {
		return fail()
	}
	sec := c.z.front.Security()
	caller := c.z.srv.ResolveCaller(ctx, sec, secret, true, nil)
	known := !caller.BadToken() && caller.Identity() == "token:"+user
	if !known && c.z.srv.AuthEnforced() {
		return fail()
	}
	if c.up != nil {
		if rh, _, err := c.up.callXid(ctx, xidAuth, opAuth, body); err != nil || rh.err != 0 {
			if err != nil {
				return errConnLoss
			}
			return fail()
		}
	}
	id := &fsmpb.ZnodeACL{Scheme: "digest", Id: digestID(userPass)}
	dup := false
	for _, o := range c.ids {
		dup = dup || (o.GetScheme() == id.GetScheme() && o.GetId() == id.GetId())
	}
	if !dup && len(c.ids) > maxAuthIDs { // the ip, then the digests
		return fail()
	}
	// The identities and the token change under the watches' lock, which
	// the delivery of events reads them under (mayReadLocked).
	c.z.w.mu.Lock()
	defer c.z.w.mu.Unlock()
	if known {
		c.caller, c.hasToken, c.tokenSecret = caller, true, secret
	}
	if !dup {
		c.ids = append(c.ids, id)
	}
	c.reply(h.xid, 0, fsm.ZkOK, nil)
	return nil
}

// setWatches re-registers a reconnecting client's watches, firing at
// once those whose node changed after relativeZxid (ZooKeeper's
// DataTree.setWatches).
func (c *conn) setWatches(ctx context.Context, h requestHeader, body []byte) error {
	d := decoder{b: body}
	rel := d.long()
	data, exist, child := d.strings(), d.strings(), d.strings()
	var persistent, recursive []string
	if h.op == opSetWatches2 {
		persistent, recursive = d.strings(), d.strings()
	}
	if d.err != nil {
		return errBadPacket
	}
	// Under --auth, watches are reads: every path needs the read right,
	// or nothing is registered (an anonymous client would learn the
	// changes of every znode otherwise).
	for _, list := range [][]string{data, exist, child, persistent, recursive} {
		if !c.allowed("setWatches", false, list...) {
			return c.read(ctx, h.xid, func(*fsm.State) (fsm.ZkCode, []byte) { return fsm.ZkNoAuth, nil })
		}
	}
	w := c.z.w
	return c.read(ctx, h.xid, func(st *fsm.State) (fsm.ZkCode, []byte) {
		fire := func(typ fsm.ZnodeEventType, p string) { c.notify(int32(typ), p, int64(w.fed)) }
		for _, p := range data {
			if _, _, s, ok := st.Znode(p); !ok {
				fire(fsm.ZnodeDeleted, p)
			} else if int64(s.Mzxid) > rel {
				fire(fsm.ZnodeDataChanged, p)
			} else {
				w.addLocked(w.data, p, c)
			}
		}
		for _, p := range exist {
			if _, _, _, ok := st.Znode(p); ok {
				fire(fsm.ZnodeCreated, p)
			} else {
				w.addLocked(w.data, p, c)
			}
		}
		for _, p := range child {
			if _, _, s, ok := st.Znode(p); !ok {
				fire(fsm.ZnodeDeleted, p)
			} else if int64(s.Pzxid) > rel {
				fire(fsm.ZnodeChildrenChanged, p)
			} else {
				w.addLocked(w.child, p, c)
			}
		}
		for _, p := range persistent {
			w.addPersistentLocked(p, c, false)
		}
		for _, p := range recursive {
			w.addPersistentLocked(p, c, true)
		}
		return fsm.ZkOK, nil
	})
}
