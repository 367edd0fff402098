package zkcompat

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// A small client of ZooKeeper's wire protocol (jute records over TCP, each
// frame prefixed by its length), written here so that the differential
// test sees every answer as the server sent it: the reply header's error
// code, each field of a stat, each result of a multi, each watch event in
// the order it arrived. It is not a general client: one request at a
// time, no reconnection.

// Operation codes (ZooKeeper's ZooDefs.OpCode).
const (
	opCreate               = 1
	opDelete               = 2
	opExists               = 3
	opGetData              = 4
	opSetData              = 5
	opGetACL               = 6
	opSetACL               = 7
	opGetChildren          = 8
	opSync                 = 9
	opPing                 = 11
	opGetChildren2         = 12
	opCheck                = 13
	opMulti                = 14
	opCreate2              = 15
	opCreateContainer      = 19
	opAuth                 = 100
	opSetWatches           = 101
	opGetEphemerals        = 103
	opGetAllChildrenNumber = 104
	opAddWatch             = 106
	opWhoAmI               = 107
	opClose                = -11
	opError                = -1
)

// Special request ids.
const (
	xidWatchEvent = -1
	xidPing       = -2
	xidAuth       = -4
	xidSetWatches = -8
)

// Create flags (CreateMode).
const (
	flagPersistent   = 0
	flagEphemeral    = 1
	flagSequential   = 2
	flagEphemeralSeq = 3
	flagContainer    = 4
)

// errNames are ZooKeeper's KeeperException codes.
var errNames = map[int32]string{
	0: "OK", -1: "SystemError", -2: "RuntimeInconsistency", -3: "DataInconsistency", -4: "ConnectionLoss",
	-5: "MarshallingError", -6: "Unimplemented", -7: "OperationTimeout", -8: "BadArguments", -12: "UnknownSession",
	-13: "NewConfigNoQuorum", -14: "ReconfigInProgress", -100: "APIError", -101: "NoNode", -102: "NoAuth",
	-103: "BadVersion", -108: "NoChildrenForEphemerals", -110: "NodeExists", -111: "NotEmpty",
	-112: "SessionExpired", -113: "InvalidCallback", -114: "InvalidACL", -115: "AuthFailed", -118: "SessionMoved",
	-119: "NotReadOnly", -120: "EphemeralOnLocalSession", -121: "NoWatcher", -122: "RequestTimeout",
	-123: "ReconfigDisabled", -124: "SessionClosedRequireSaslAuth", -125: "QuotaExceeded", -127: "Throttled",
}

func errName(code int32) string {
	if n, ok := errNames[code]; ok {
		return n
	}
	return fmt.Sprintf("code(%d)", code)
}

// eventNames are the watch event types (Watcher.Event.EventType).
var eventNames = map[int32]string{
	-1: "None", 1: "NodeCreated", 2: "NodeDeleted", 3: "NodeDataChanged", 4: "NodeChildrenChanged",
	5: "DataWatchRemoved", 6: "ChildWatchRemoved", 7: "PersistentWatchRemoved",
}

// enc builds a jute record.
type enc []byte

func (e enc) i32(v int32) enc  { return binary.BigEndian.AppendUint32(e, uint32(v)) }
func (e enc) i64(v int64) enc  { return binary.BigEndian.AppendUint64(e, uint64(v)) }
func (e enc) str(s string) enc { return append(e.i32(int32(len(s))), s...) }
func (e enc) boolean(b bool) enc {
	if b {
		return append(e, 1)
	}
	return append(e, 0)
}

// buf writes a byte buffer; nil is jute's null (-1).
func (e enc) buf(b []byte) enc {
	if b == nil {
		return e.i32(-1)
	}
	return append(e.i32(int32(len(b))), b...)
}

func (e enc) strs(ss []string) enc {
	e = e.i32(int32(len(ss)))
	for _, s := range ss {
		e = e.str(s)
	}
	return e
}

// acl is one ACL entry: permissions, scheme and id.
type acl struct {
	Perms      int32
	Scheme, ID string
}

// openACL is ZooDefs.Ids.OPEN_ACL_UNSAFE: everyone may do everything.
var openACL = []acl{{31, "world", "anyone"}}

func (e enc) acls(as []acl) enc {
	e = e.i32(int32(len(as)))
	for _, a := range as {
		e = e.i32(a.Perms).str(a.Scheme).str(a.ID)
	}
	return e
}

// dec reads a jute record; the first error sticks.
type dec struct {
	b   []byte
	err error
}

func (d *dec) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.err = fmt.Errorf("record too short: want %d bytes, have %d", n, len(d.b))
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *dec) i32() int32 {
	b := d.take(4)
	if b == nil {
		return 0
	}
	return int32(binary.BigEndian.Uint32(b))
}

func (d *dec) i64() int64 {
	b := d.take(8)
	if b == nil {
		return 0
	}
	return int64(binary.BigEndian.Uint64(b))
}

func (d *dec) boolean() bool {
	b := d.take(1)
	return b != nil && b[0] != 0
}

// buf reads a byte buffer; jute's null (-1) reads as nil.
func (d *dec) buf() []byte {
	n := d.i32()
	if n < 0 {
		return nil
	}
	return append([]byte{}, d.take(int(n))...)
}

func (d *dec) str() string { return string(d.buf()) }

func (d *dec) strs() []string {
	n := d.i32()
	if n < 0 {
		return nil
	}
	out := []string{}
	for i := int32(0); i < n && d.err == nil; i++ {
		out = append(out, d.str())
	}
	return out
}

func (d *dec) acls() []acl {
	n := d.i32()
	var out []acl
	for i := int32(0); i < n && d.err == nil; i++ {
		out = append(out, acl{d.i32(), d.str(), d.str()})
	}
	return out
}

// stat is a znode's Stat record.
type stat struct {
	Czxid, Mzxid, Ctime, Mtime  int64
	Version, Cversion, Aversion int32
	EphemeralOwner              int64
	DataLength, NumChildren     int32
	Pzxid                       int64
}

func (d *dec) stat() stat {
	return stat{Czxid: d.i64(), Mzxid: d.i64(), Ctime: d.i64(), Mtime: d.i64(), Version: d.i32(), Cversion: d.i32(),
		Aversion: d.i32(), EphemeralOwner: d.i64(), DataLength: d.i32(), NumChildren: d.i32(), Pzxid: d.i64()}
}

// event is a watch notification as it arrived.
type event struct {
	Type, State int32
	Path        string
}

func (e event) String() string {
	return fmt.Sprintf("%s %s state=%d", eventNames[e.Type], e.Path, e.State)
}

// reply is a reply header and its body.
type reply struct {
	Xid  int32
	Zxid int64
	Err  int32
	Body []byte
}

// callTimeout bounds the wait for a reply (as a client's connection-loss
// detection would, at 2/3 of a 15s session).
const callTimeout = 10 * time.Second

// errConnClosed is returned for a request on a connection the server
// closed.
var errConnClosed = errors.New("zkwire: connection closed")

// zkConn is one session over one TCP connection.
type zkConn struct {
	nc        net.Conn
	SessionID int64
	Passwd    []byte
	Timeout   int32 // the negotiated session timeout, ms

	// wmu serializes writes of frames (requests and pings).
	wmu sync.Mutex
	// reqMu allows one request in flight, so the next non-event frame is
	// its reply.
	reqMu   sync.Mutex
	xid     int32
	replies chan reply
	// closing is set once closeSession has been sent.
	closing bool

	// mu guards events and lastZxid.
	mu     sync.Mutex
	events []event
	// lastZxid is the highest zxid a reply header carried.
	lastZxid int64

	stop chan struct{}
	once sync.Once
}

// dialZK opens a new session with the given timeout.
func dialZK(addr string, timeout time.Duration) (*zkConn, error) {
	return dialSession(addr, timeout, 0, make([]byte, 16))
}

// errRefused is a connect answer with a zero timeout: the server refused
// the session (expired, unknown, or a wrong password).
var errRefused = errors.New("zkwire: session refused (zero timeout in the connect answer)")

// dialSession connects and sends a ConnectRequest for session id (0: a new
// one) with passwd.
func dialSession(addr string, timeout time.Duration, id int64, passwd []byte) (*zkConn, error) {
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	req := enc{}.i32(0).i64(0).i32(int32(timeout.Milliseconds())).i64(id).buf(passwd).boolean(false)
	if err := writeFrame(nc, req); err != nil {
		nc.Close()
		return nil, err
	}
	br := bufio.NewReader(nc)
	frame, err := readFrame(br)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("zkwire: reading the connect answer: %w", err)
	}
	d := &dec{b: frame}
	_ = d.i32() // protocol version
	to := d.i32()
	sid := d.i64()
	pw := d.buf()
	if d.err != nil {
		nc.Close()
		return nil, fmt.Errorf("zkwire: connect answer: %w", d.err)
	}
	if to <= 0 {
		nc.Close()
		return nil, errRefused
	}
	_ = nc.SetDeadline(time.Time{})
	c := &zkConn{nc: nc, SessionID: sid, Passwd: pw, Timeout: to, replies: make(chan reply, 1), stop: make(chan struct{})}
	go c.readLoop(br)
	go c.pingLoop()
	return c, nil
}

func writeFrame(w io.Writer, b []byte) error {
	_, err := w.Write(append(enc{}.i32(int32(len(b))), b...))
	return err
}

func readFrame(r *bufio.Reader) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	size := int32(binary.BigEndian.Uint32(n[:]))
	if size < 0 || size > 16<<20 {
		return nil, fmt.Errorf("zkwire: frame of %d bytes", size)
	}
	b := make([]byte, size)
	_, err := io.ReadFull(r, b)
	return b, err
}

func (c *zkConn) readLoop(br *bufio.Reader) {
	defer close(c.replies)
	for {
		frame, err := readFrame(br)
		if err != nil {
			return
		}
		d := &dec{b: frame}
		r := reply{Xid: d.i32(), Zxid: d.i64(), Err: d.i32()}
		if d.err != nil {
			return
		}
		r.Body = d.b
		c.mu.Lock()
		c.lastZxid = max(c.lastZxid, r.Zxid)
		c.mu.Unlock()
		switch r.Xid {
		case xidPing:
		case xidWatchEvent:
			e := event{Type: d.i32(), State: d.i32(), Path: d.str()}
			c.mu.Lock()
			c.events = append(c.events, e)
			c.mu.Unlock()
		default:
			c.replies <- r
		}
	}
}

// pingLoop keeps the session alive while the test holds it.
func (c *zkConn) pingLoop() {
	t := time.NewTicker(time.Duration(c.Timeout) * time.Millisecond / 3)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			if c.write(enc{}.i32(xidPing).i32(opPing)) != nil {
				return
			}
		}
	}
}

func (c *zkConn) write(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	return writeFrame(c.nc, b)
}

// call sends request op with body and waits for its reply (an error only
// if the connection failed; the reply's Err is the server's answer).
func (c *zkConn) call(op int32, body []byte) (reply, error) {
	c.reqMu.Lock()
	defer c.reqMu.Unlock()
	var xid int32
	switch op {
	case opAuth:
		xid = xidAuth
	case opSetWatches:
		xid = xidSetWatches
	case opClose:
		c.closing = true
		fallthrough
	default:
		c.xid++
		xid = c.xid
	}
	if err := c.write(append(enc{}.i32(xid).i32(op), body...)); err != nil {
		return reply{}, err
	}
	select {
	case r, ok := <-c.replies:
		if !ok {
			return reply{}, errConnClosed
		}
		if r.Xid != xid {
			return r, fmt.Errorf("zkwire: reply xid %d to request xid %d", r.Xid, xid)
		}
		return r, nil
	case <-time.After(callTimeout):
		return reply{}, fmt.Errorf("zkwire: no reply to op %d within %v", op, callTimeout)
	}
}

// takeEvents returns the events received so far and forgets them.
func (c *zkConn) takeEvents() []event {
	c.mu.Lock()
	defer c.mu.Unlock()
	ev := c.events
	c.events = nil
	return ev
}

// seenZxid is the highest zxid a reply header carried so far.
func (c *zkConn) seenZxid() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastZxid
}

// close sends closeSession (best effort) and closes the connection.
func (c *zkConn) close() {
	c.once.Do(func() {
		close(c.stop)
		c.reqMu.Lock()
		closing := c.closing
		c.reqMu.Unlock()
		if !closing {
			_ = c.nc.SetDeadline(time.Now().Add(5 * time.Second))
			_, _ = c.call(opClose, nil)
		}
		c.nc.Close()
	})
}

// drop closes the TCP connection without closing the session.
func (c *zkConn) drop() {
	c.once.Do(func() {
		close(c.stop)
		c.nc.Close()
	})
}

// Convenience calls for the tests that use this client as an observer.

func (c *zkConn) create(path string, data []byte, flags int32) (string, int32, error) {
	r, err := c.call(opCreate, enc{}.str(path).buf(data).acls(openACL).i32(flags))
	if err != nil || r.Err != 0 {
		return "", r.Err, err
	}
	d := &dec{b: r.Body}
	return d.str(), 0, d.err
}

func (c *zkConn) exists(path string) (bool, error) {
	r, err := c.call(opExists, enc{}.str(path).boolean(false))
	if err != nil {
		return false, err
	}
	switch r.Err {
	case 0:
		return true, nil
	case -101:
		return false, nil
	}
	return false, fmt.Errorf("exists %s: %s", path, errName(r.Err))
}

func (c *zkConn) getData(path string) ([]byte, stat, error) {
	r, err := c.call(opGetData, enc{}.str(path).boolean(false))
	if err != nil {
		return nil, stat{}, err
	}
	if r.Err != 0 {
		return nil, stat{}, fmt.Errorf("getData %s: %s", path, errName(r.Err))
	}
	d := &dec{b: r.Body}
	data, st := d.buf(), d.stat()
	return data, st, d.err
}

func (c *zkConn) children(path string) ([]string, error) {
	r, err := c.call(opGetChildren, enc{}.str(path).boolean(false))
	if err != nil {
		return nil, err
	}
	if r.Err != 0 {
		return nil, fmt.Errorf("getChildren %s: %s", path, errName(r.Err))
	}
	d := &dec{b: r.Body}
	return d.strs(), d.err
}
