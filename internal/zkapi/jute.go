package zkapi

// Jute, ZooKeeper's serialization (zookeeper.jute): big-endian ints and
// longs, one-byte booleans, buffers and strings as an int length (-1:
// null) and bytes, vectors as an int count (-1: null) and items, records
// as their fields in order. Every packet on the wire is an int length and
// that many bytes.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"
)

// errShort: a packet ended inside a field.
var errShort = errors.New("zookeeper: packet too short")

// decoder reads jute fields from one packet; the first error sticks and
// every later read returns zero values.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(err error) {
	if d.err == nil {
		d.err = err
	}
}

func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.fail(errShort)
		return nil
	}
	out := d.b[:n]
	d.b = d.b[n:]
	return out
}

func (d *decoder) int() int32 {
	b := d.take(4)
	if b == nil {
		return 0
	}
	return int32(binary.BigEndian.Uint32(b))
}

func (d *decoder) long() int64 {
	b := d.take(8)
	if b == nil {
		return 0
	}
	return int64(binary.BigEndian.Uint64(b))
}

func (d *decoder) bool() bool {
	b := d.take(1)
	return b != nil && b[0] != 0
}

// buffer reads a buffer; null (-1) reads as nil.
func (d *decoder) buffer() []byte {
	n := d.int()
	if d.err != nil || n == -1 {
		return nil
	}
	if n < 0 {
		d.fail(fmt.Errorf("zookeeper: negative length %d", n))
		return nil
	}
	return d.take(int(n))
}

// nullableBuffer reads a buffer and whether it is null (-1).
func (d *decoder) nullableBuffer() ([]byte, bool) {
	if len(d.b) >= 4 && d.err == nil && int32(binary.BigEndian.Uint32(d.b)) == -1 {
		d.take(4)
		return nil, true
	}
	return d.buffer(), false
}

// string reads a ustring, which must be UTF-8.
func (d *decoder) string() string {
	b := d.buffer()
	if !utf8.Valid(b) {
		d.fail(errors.New("zookeeper: a string is not UTF-8"))
		return ""
	}
	return string(b)
}

// count reads a vector's count, bounded by what the packet can hold
// (each item at least min bytes); null reads as 0.
func (d *decoder) count(min int) int {
	n := d.int()
	if d.err != nil || n == -1 {
		return 0
	}
	if n < 0 || int(n) > len(d.b)/max(min, 1) {
		d.fail(fmt.Errorf("zookeeper: vector of %d items in %d bytes", n, len(d.b)))
		return 0
	}
	return int(n)
}

func (d *decoder) strings() []string {
	n := d.count(4)
	if n == 0 {
		return nil
	}
	out := make([]string, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		out = append(out, d.string())
	}
	return out
}

func (d *decoder) acls() []acl {
	n := d.count(12)
	var out []acl
	for i := 0; i < n && d.err == nil; i++ {
		out = append(out, acl{perms: d.int(), scheme: d.string(), id: d.string()})
	}
	return out
}

// encoder appends jute fields to a packet.
type encoder struct{ b []byte }

func (e *encoder) int(v int32)  { e.b = binary.BigEndian.AppendUint32(e.b, uint32(v)) }
func (e *encoder) long(v int64) { e.b = binary.BigEndian.AppendUint64(e.b, uint64(v)) }
func (e *encoder) bool(v bool) {
	if v {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}

// buffer writes b; nil is written as null (-1), as ZooKeeper writes a
// null buffer.
func (e *encoder) buffer(b []byte) {
	if b == nil {
		e.int(-1)
		return
	}
	e.int(int32(len(b)))
	e.b = append(e.b, b...)
}

func (e *encoder) string(s string) {
	e.int(int32(len(s)))
	e.b = append(e.b, s...)
}

func (e *encoder) strings(ss []string) {
	e.int(int32(len(ss)))
	for _, s := range ss {
		e.string(s)
	}
}

func (e *encoder) acls(as []acl) {
	e.int(int32(len(as)))
	for _, a := range as {
		e.int(a.perms)
		e.string(a.scheme)
		e.string(a.id)
	}
}

func (e *encoder) stat(s stat) {
	e.long(s.czxid)
	e.long(s.mzxid)
	e.long(s.ctime)
	e.long(s.mtime)
	e.int(s.version)
	e.int(s.cversion)
	e.int(s.aversion)
	e.long(s.ephemeralOwner)
	e.int(s.dataLength)
	e.int(s.numChildren)
	e.long(s.pzxid)
}

func (d *decoder) stat() stat {
	return stat{czxid: d.long(), mzxid: d.long(), ctime: d.long(), mtime: d.long(), version: d.int(), cversion: d.int(),
		aversion: d.int(), ephemeralOwner: d.long(), dataLength: d.int(), numChildren: d.int(), pzxid: d.long()}
}

// acl is one ACL entry on the wire.
type acl struct {
	perms      int32
	scheme, id string
}

// stat is ZooKeeper's Stat on the wire.
type stat struct {
	czxid, mzxid, ctime, mtime  int64
	version, cversion, aversion int32
	ephemeralOwner              int64
	dataLength, numChildren     int32
	pzxid                       int64
}

// connectRequest is ZooKeeper's ConnectRequest; readOnly is absent
// (hasReadOnly false) in the handshake of clients older than 3.4.
type connectRequest struct {
	protocolVersion int32
	lastZxidSeen    int64
	timeout         int32
	sessionID       int64
	passwd          []byte
	readOnly        bool
	hasReadOnly     bool
}

func decodeConnect(b []byte) (connectRequest, error) {
	d := decoder{b: b}
	c := connectRequest{protocolVersion: d.int(), lastZxidSeen: d.long(), timeout: d.int(), sessionID: d.long(), passwd: d.buffer()}
	if d.err == nil && len(d.b) > 0 {
		c.readOnly, c.hasReadOnly = d.bool(), true
	}
	return c, d.err
}

func (c connectRequest) encode() []byte {
	var e encoder
	e.int(c.protocolVersion)
	e.long(c.lastZxidSeen)
	e.int(c.timeout)
	e.long(c.sessionID)
	e.buffer(c.passwd)
	if c.hasReadOnly {
		e.bool(c.readOnly)
	}
	return e.b
}

// connectResponse is ZooKeeper's ConnectResponse, with the readOnly flag
// that the server adds for a client that sent one.
type connectResponse struct {
	protocolVersion int32
	timeout         int32
	sessionID       int64
	passwd          []byte
	readOnly        bool
	hasReadOnly     bool
}

func (c connectResponse) encode() []byte {
	var e encoder
	e.int(c.protocolVersion)
	e.int(c.timeout)
	e.long(c.sessionID)
	e.buffer(c.passwd)
	if c.hasReadOnly {
		e.bool(c.readOnly)
	}
	return e.b
}

func decodeConnectResponse(b []byte) (connectResponse, error) {
	d := decoder{b: b}
	c := connectResponse{protocolVersion: d.int(), timeout: d.int(), sessionID: d.long(), passwd: d.buffer()}
	if d.err == nil && len(d.b) > 0 {
		c.readOnly, c.hasReadOnly = d.bool(), true
	}
	return c, d.err
}

// Opcodes (ZooDefs.OpCode).
const (
	opNotification    = 0
	opCreate          = 1
	opDelete          = 2
	opExists          = 3
	opGetData         = 4
	opSetData         = 5
	opGetACL          = 6
	opSetACL          = 7
	opGetChildren     = 8
	opSync            = 9
	opPing            = 11
	opGetChildren2    = 12
	opCheck           = 13
	opMulti           = 14
	opCreate2         = 15
	opReconfig        = 16
	opCheckWatches    = 17
	opRemoveWatches   = 18
	opCreateContainer = 19
	opDeleteContainer = 20
	opCreateTTL       = 21
	opMultiRead       = 22
	opAuth            = 100
	opSetWatches      = 101
	opSasl            = 102
	opGetEphemerals   = 103
	opGetAllChildren  = 104
	opSetWatches2     = 105
	opAddWatch        = 106
	opWhoAmI          = 107
	opCloseSession    = -11
	opError           = -1
)

// Special xids.
const (
	xidNotification = -1
	xidPing         = -2
	xidAuth         = -4
	xidSetWatches   = -8
)

// requestHeader is ZooKeeper's RequestHeader.
type requestHeader struct {
	xid, op int32
}

// replyHeader is ZooKeeper's ReplyHeader.
type replyHeader struct {
	xid  int32
	zxid int64
	err  int32
}

func (e *encoder) reply(h replyHeader) {
	e.int(h.xid)
	e.long(h.zxid)
	e.int(h.err)
}

// Watcher states and event types of a WatcherEvent.
const (
	stateSyncConnected = 3
	eventNone          = -1
)

// addWatch modes (AddWatchMode).
const (
	addWatchPersistent          = 0
	addWatchPersistentRecursive = 1
)
