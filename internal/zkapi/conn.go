package zkapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/server"
)

// errConnLoss ends a connection whose client must reconnect (this node
// lost its leader, or the leader's relay broke): the client sees
// ConnectionLoss and resumes its session elsewhere.
var errConnLoss = errors.New("zookeeper: connection loss")

// conn is one client connection. Its requests are read and served one at
// a time by serve; answers and watch events are queued (out) and written
// by one writer goroutine, in queue order.
type conn struct {
	z  *Server
	nc net.Conn
	// remote and ip are the client's address and host (on the leader's
	// side of a follower's relay, the client's as the follower names it).
	remote, ip string
	// x509 is ZooKeeper's x509 id of the client's verified certificate
	// ("" none); certNames are its names, which identify the caller for
	// Tenure's ACLs when it named no token (nil: no certificate).
	x509      string
	certNames []string
	// relayed: a follower's relay over the peer port (upstream.go).
	relayed bool
	// member: the connection comes from a member (a follower's relay),
	// exempt from the per-address bounds; countedIP: the address it
	// counts against in z.perIP ("" none), guarded by z.mu.
	member    bool
	countedIP string

	// Set by the handshake, then read only by serve.
	session   uint64
	timeout   time.Duration
	oldClient bool
	up        *upstream // on a follower: the relay to the leader
	lastTouch time.Time

	// ids: the ZooKeeper identities of the connection (ip, then what
	// addAuth added); caller and hasToken: the Tenure token addAuth
	// named (under --auth, the rights of every request are its).
	ids         []*fsmpb.ZnodeACL
	caller      server.Caller
	hasToken    bool
	tokenSecret string

	// watchCount is guarded by z.w.mu.
	watchCount int

	// cur is the request being served (serve's goroutine only), for the
	// request metrics.
	cur struct {
		xid, op int32
		start   time.Time
		pending bool
	}

	// out is the queue of packets to write. bytes counts what is queued
	// and what the writer is writing, in the node's total too (z.queued)
	// until it is written or the connection closes (dead).
	out struct {
		mu      sync.Mutex
		q       [][]byte
		bytes   int
		closing bool // close once the queue is written
		dead    bool // closed: nothing more is queued or counted
	}
	// written is signalled when the writer has written a batch.
	written chan struct{}
	// ending: the client asked to close its session; the session's end
	// then leaves this connection to answer it before closing.
	ending    atomic.Bool
	wake      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

func newConn(z *Server, nc net.Conn) *conn {
	c := &conn{z: z, nc: nc, wake: make(chan struct{}, 1), written: make(chan struct{}, 1), done: make(chan struct{})}
	c.setRemote(nc.RemoteAddr().String())
	return c
}

// setRemote makes addr the client's address, and its host the
// connection's ip id.
func (c *conn) setRemote(addr string) {
	ip := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		ip = h
	}
	c.remote, c.ip = addr, ip
	c.ids = []*fsmpb.ZnodeACL{{Scheme: "ip", Id: ip}}
}

// setCert gives the connection the identity of a verified client
// certificate: ZooKeeper's x509 id (the subject, as RFC 2253 writes it,
// as ZooKeeper's X509AuthenticationProvider names it) and the names
// Tenure's ACLs bind (server.CertNamesOf).
func (c *conn) setCert(x509ID string, names []string) {
	if names == nil {
		names = []string{}
	}
	c.x509, c.certNames = x509ID, names
	if x509ID != "" { // before the ip id, as ZooKeeper lists them
		c.ids = append([]*fsmpb.ZnodeACL{{Scheme: "x509", Id: x509ID}}, c.ids...)
	}
}

// handshakeTimeout bounds a TLS handshake, a relay's preamble, and the
// wait for a connection's first packet (a ConnectRequest or a
// four-letter word), however slowly it comes: ZooKeeper's
// zookeeper.nio.sessionlessCnxnTimeout (a variable for the tests).
var handshakeTimeout = 10 * time.Second

// tlsHandshake runs the TLS handshake of a connection of the secure
// listener, within handshakeTimeout, and takes the identity of the
// client certificate it verified.
func (c *conn) tlsHandshake(ctx context.Context) error {
	tc, ok := c.nc.(*tls.Conn)
	if !ok {
		return nil
	}
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	_ = tc.SetDeadline(time.Now().Add(handshakeTimeout))
	if err := tc.HandshakeContext(hctx); err != nil {
		return err
	}
	_ = tc.SetDeadline(time.Time{})
	if st := tc.ConnectionState(); len(st.VerifiedChains) > 0 && len(st.VerifiedChains[0]) > 0 {
		cert := st.VerifiedChains[0][0]
		c.setCert(cert.Subject.String(), server.CertNamesOf(cert))
	}
	return nil
}

// close ends the connection now; it does not block.
func (c *conn) close() {
	c.closeOnce.Do(func() {
		close(c.done)
		c.nc.Close()
		c.out.mu.Lock()
		c.out.dead = true
		c.z.queued.Add(-int64(c.out.bytes))
		c.out.q, c.out.bytes = nil, 0
		c.out.mu.Unlock()
	})
}

// closeAfterWrite ends the connection once what is queued is written.
func (c *conn) closeAfterWrite() {
	c.out.mu.Lock()
	c.out.closing = true
	c.out.mu.Unlock()
	c.signal()
}

func (c *conn) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// maxQueuedTotal bounds the bytes queued to all connections together:
// past it the connection with the most queued, the slowest reader, is
// closed (z.evictSlowest).
var maxQueuedTotal int64 = 256 << 20

// queue appends one packet (without its length) to the output; it never
// blocks. A client too slow to read what is queued is disconnected: past
// maxQueued on its connection, or when it is the slowest once the
// connections together pass maxQueuedTotal.
func (c *conn) queue(pkt []byte) {
	c.out.mu.Lock()
	if c.out.dead {
		c.out.mu.Unlock()
		return
	}
	if c.out.bytes+len(pkt) > maxQueued {
		c.out.mu.Unlock()
		c.close()
		return
	}
	c.out.q = append(c.out.q, pkt)
	c.out.bytes += len(pkt)
	total := c.z.queued.Add(int64(len(pkt)))
	c.out.mu.Unlock()
	c.signal()
	if total > maxQueuedTotal {
		c.z.evictSlowest()
	}
}

// queuedBytes is what is queued to c and not yet written.
func (c *conn) queuedBytes() int {
	c.out.mu.Lock()
	defer c.out.mu.Unlock()
	return c.out.bytes
}

// waitWritten waits until at most limit bytes are queued to c; false if
// the connection closed first. A connection's requests wait for it, so
// that a client that sends requests and does not read their answers
// stops being read (ZooKeeper stops reading a connection whose
// answers are outstanding) instead of growing its queue.
func (c *conn) waitWritten(limit int) bool {
	for c.queuedBytes() > limit {
		select {
		case <-c.written:
		case <-c.done:
			return false
		}
	}
	return true
}

// writer writes the queue until the connection closes.
func (c *conn) writer() {
	var lenb [4]byte
	for {
		select {
		case <-c.done:
			return
		case <-c.wake:
		}
		c.out.mu.Lock()
		q, closing := c.out.q, c.out.closing
		c.out.q = nil
		c.out.mu.Unlock()
		bufs := make(net.Buffers, 0, 2*len(q))
		n := 0
		for _, p := range q {
			binary.BigEndian.PutUint32(lenb[:], uint32(len(p)))
			bufs = append(bufs, append([]byte(nil), lenb[:]...), p)
			n += len(p)
		}
		_ = c.nc.SetWriteDeadline(time.Now().Add(30 * time.Second))
		_, err := bufs.WriteTo(c.nc)
		c.out.mu.Lock()
		if !c.out.dead {
			c.out.bytes -= n
			c.z.queued.Add(-int64(n))
		}
		c.out.mu.Unlock()
		select {
		case c.written <- struct{}{}:
		default:
		}
		if err != nil || closing {
			c.close()
			return
		}
	}
}

// notify queues a watch event.
func (c *conn) notify(typ int32, path string, zxid int64) {
	var e encoder
	e.reply(replyHeader{xid: xidNotification, zxid: zxid})
	e.int(typ)
	e.int(stateSyncConnected)
	e.string(path)
	c.queue(e.b)
}

// reply queues an answer.
func (c *conn) reply(xid int32, zxid int64, code fsm.ZkCode, body []byte) {
	var e encoder
	e.reply(replyHeader{xid: xid, zxid: zxid, err: int32(code)})
	if code == fsm.ZkOK {
		e.b = append(e.b, body...)
	}
	c.queue(e.b)
	c.answered(xid, code)
}

// readPacket reads one length-prefixed packet of at most limit bytes.
func readPacket(r io.Reader, buf []byte, limit int32) ([]byte, error) {
	var lenb [4]byte
	if _, err := io.ReadFull(r, lenb[:]); err != nil {
		return nil, err
	}
	n := int32(binary.BigEndian.Uint32(lenb[:]))
	if n < 0 || n > limit {
		return nil, fmt.Errorf("zookeeper: packet length %d is outside 0..%d (jute.maxbuffer)", n, limit)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	_, err := io.ReadFull(r, buf)
	return buf, err
}

// serve runs the connection: the handshake, then requests until the
// client closes, the session ends or the connection breaks.
func (c *conn) serve(ctx context.Context) {
	var wg sync.WaitGroup
	defer func() {
		c.close()
		wg.Wait()
		c.z.w.mu.Lock()
		c.z.w.removeConnLocked(c)
		c.z.w.mu.Unlock()
		c.z.detach(c)
		if c.up != nil {
			c.up.close()
		}
	}()
	_ = c.nc.SetReadDeadline(time.Now().Add(handshakeTimeout))
	var first [4]byte
	if _, err := io.ReadFull(c.nc, first[:]); err != nil {
		return
	}
	if isFourLetterWord(first[:]) {
		c.fourLetterWord(string(first[:]))
		return
	}
	pkt, err := readPacket(io.MultiReader(bytes.NewReader(first[:]), c.nc), nil, MaxPacket)
	if err != nil {
		return
	}
	req, err := decodeConnect(pkt)
	newSession := err == nil && req.sessionID == 0
	if newSession && !c.z.admitSession(c) {
		return // refused as ZooKeeper refuses a connection past maxClientCnxns: closed
	}
	ok := c.handshake(ctx, pkt)
	if ok && newSession {
		c.z.sessionCreated(c)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.writer()
	}()
	if !ok {
		c.closeAfterWrite()
		<-c.done
		return
	}
	c.z.attach(c)
	var buf []byte
	for {
		if !c.waitWritten(maxAnswer) {
			return
		}
		_ = c.nc.SetReadDeadline(time.Now().Add(2 * c.timeout))
		pkt, err := readPacket(c.nc, buf, MaxPacket)
		if err != nil {
			c.z.log.Debug("zookeeper connection ended", "remote", c.remote, "session", c.session, "err", err)
			return
		}
		buf = pkt
		if err := c.request(ctx, pkt); err != nil {
			if errors.Is(err, errTooLarge) {
				c.z.log.Info("zookeeper connection closed: an answer would exceed jute.maxbuffer", "remote", c.remote, "session", c.session, "op", c.cur.op)
			} else if !errors.Is(err, errClosing) {
				c.z.log.Debug("zookeeper connection ended", "remote", c.remote, "session", c.session, "err", err)
			}
			if errors.Is(err, errClosing) {
				c.closeAfterWrite()
				select {
				case <-c.done:
				case <-time.After(5 * time.Second):
				}
			}
			return
		}
		select {
		case <-c.done:
			return
		default:
		}
	}
}

// errClosing: the session was closed; the answer is written, then the
// connection closes.
var errClosing = errors.New("zookeeper: closing")

// handshake answers the ConnectRequest: creates a session (id 0) or
// resumes one with its password. It reports whether the connection may
// go on; a refusal is queued for the writer.
func (c *conn) handshake(ctx context.Context, pkt []byte) bool {
	req, err := decodeConnect(pkt)
	if err != nil {
		return false
	}
	c.oldClient = !req.hasReadOnly
	resp := connectResponse{hasReadOnly: req.hasReadOnly, passwd: make([]byte, 16)}
	refuse := func() bool {
		c.queue(resp.encode())
		return false
	}
	// A client that has seen more than this member applied waits for it
	// briefly, then goes elsewhere (ZooKeeper refuses it at once).
	if req.lastZxidSeen > 0 && !c.waitFed(ctx, uint64(req.lastZxidSeen), 2*time.Second) {
		c.z.log.Debug("zookeeper client has seen a newer zxid than this member applied", "zxid", req.lastZxidSeen)
		return false
	}
	leader := c.z.front.IsLeader()
	if !leader {
		if c.relayed {
			// Relayed to a member that no longer leads: not relayed
			// again; the follower's client reconnects.
			return false
		}
		up, cresp, err := c.dialLeader(ctx, req)
		if err != nil {
			c.z.log.Debug("zookeeper relay to the leader", "err", err)
			return false // the client tries another member
		}
		c.up = up
		cresp.hasReadOnly = req.hasReadOnly
		if cresp.sessionID == 0 || cresp.timeout <= 0 {
			up.close()
			c.up = nil
			resp.passwd = cresp.passwd
			return refuse()
		}
		c.session, c.timeout = uint64(cresp.sessionID), time.Duration(cresp.timeout)*time.Millisecond
		c.lastTouch = time.Now()
		c.queue(cresp.encode())
		return true
	}
	if req.sessionID == 0 {
		secret := newSecret()
		ttl := c.z.negotiate(req.timeout)
		res, err := c.z.front.Propose(ctx, &fsmpb.CreateSession{Owner: "zookeeper " + c.remote, TtlMs: ttl, SecretHash: fsm.HashSecret(secret)})
		if err == nil {
			err = res.Err
		}
		if err != nil {
			c.z.log.Debug("zookeeper session not created", "err", err)
			return false
		}
		c.session, c.timeout = res.Session, time.Duration(ttl)*time.Millisecond
		resp.sessionID, resp.timeout, resp.passwd = int64(res.Session), int32(ttl), secret
	} else {
		var ttl int64
		var cerr error
		c.z.front.Read(func(st *fsm.State) {
			cerr = st.CheckSession(uint64(req.sessionID), req.passwd)
			ttl, _ = st.Session(uint64(req.sessionID))
		})
		if cerr != nil {
			return refuse()
		}
		if ttl, err = c.renegotiate(ctx, uint64(req.sessionID), ttl, req.timeout); err != nil {
			if errors.Is(err, fsm.ErrSessionNotFound) {
				return refuse()
			}
			c.z.log.Debug("zookeeper session timeout not renegotiated", "session", req.sessionID, "err", err)
			return false
		}
		if _, err := c.z.front.KeepAlive(ctx, uint64(req.sessionID)); err != nil {
			if errors.Is(err, fsm.ErrSessionNotFound) {
				return refuse()
			}
			return false
		}
		c.session, c.timeout = uint64(req.sessionID), time.Duration(ttl)*time.Millisecond
		resp.sessionID, resp.timeout, resp.passwd = req.sessionID, int32(ttl), req.passwd
	}
	c.lastTouch = time.Now()
	c.queue(resp.encode())
	return true
}

// renegotiate gives a resumed session the timeout its client asks now,
// clamped to the flags' bounds, as ZooKeeper does (its touchSession with
// the reconnecting connection's timeout): when it differs from the
// session's TTL (ttlMs), the leader commits SetSessionTTL, and the
// session is timed, and answered, with it from then on. It returns the
// session's TTL. Before cluster version 3 the session keeps its TTL, as
// it did before SetSessionTTL existed.
func (c *conn) renegotiate(ctx context.Context, id uint64, ttlMs int64, asked int32) (int64, error) {
	want := c.z.negotiate(asked)
	if want == ttlMs {
		return ttlMs, nil
	}
	res, err := c.z.front.Propose(ctx, &fsmpb.SetSessionTTL{Session: id, TtlMs: want})
	if err == nil {
		err = res.Err
	}
	switch {
	case errors.Is(err, fsm.ErrVersion):
		return ttlMs, nil
	case err != nil:
		return 0, err
	}
	return want, nil
}

// waitFed waits until the watches were fed revision rev.
func (c *conn) waitFed(ctx context.Context, rev uint64, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		c.z.w.mu.Lock()
		fed, moved := c.z.w.fed, c.z.w.moved
		c.z.w.mu.Unlock()
		if fed >= rev {
			return true
		}
		select {
		case <-moved:
		case <-t.C:
			return false
		case <-ctx.Done():
			return false
		case <-c.done:
			return false
		}
	}
}

// answerAt queues an answer once every watch event up to zxid is queued
// (a write's own events before its answer), under the watches' lock so
// that no later event overtakes it.
func (c *conn) answerAt(ctx context.Context, zxid uint64, xid int32, code fsm.ZkCode, body []byte) error {
	if !c.waitFed(ctx, zxid, 10*time.Second) {
		return errConnLoss
	}
	c.z.w.mu.Lock()
	defer c.z.w.mu.Unlock()
	c.reply(xid, int64(c.z.w.fed), code, body)
	return nil
}

// maxAnswer bounds an answer read from the state: the largest packet a
// ZooKeeper client accepts is jute.maxbuffer (Java's refuses a longer one
// and drops the connection), and the largest answer the front sends, a
// znode's data with its stat, fits in it and 1 KiB. A read whose answer
// would be longer (a getChildren of many long names, a multiRead of big
// nodes) is not built: the connection is closed, as the client would
// close it, and the client sees ConnectionLoss.
const maxAnswer = maxRelayPacket

// codeTooLarge is what a read's fn returns, instead of building an
// answer past maxAnswer; it is never sent.
const codeTooLarge fsm.ZkCode = -1 << 31

// errTooLarge ends a connection whose answer would pass maxAnswer.
var errTooLarge = errors.New("zookeeper: the answer would exceed jute.maxbuffer")

// read runs fn on the applied state at the revision every watch event
// has reached, and queues its answer before any later event; an fn that
// answers codeTooLarge ends the connection instead.
func (c *conn) read(ctx context.Context, xid int32, fn func(st *fsm.State) (fsm.ZkCode, []byte)) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		w := c.z.w
		w.mu.Lock()
		done, tooLarge := false, false
		c.z.front.Read(func(st *fsm.State) {
			if st.Revision() != w.fed {
				return
			}
			done = true
			code, body := fn(st)
			if code == codeTooLarge {
				tooLarge = true
				return
			}
			c.reply(xid, int64(w.fed), code, body)
		})
		moved := w.moved
		w.mu.Unlock()
		if tooLarge {
			return errTooLarge
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return errConnLoss
		}
		select {
		case <-moved:
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		case <-c.done:
			return errConnLoss
		}
	}
}

// touch renews the session when a third of its timeout has passed since
// the last renewal: every request counts as ZooKeeper's ping does.
func (c *conn) touch(ctx context.Context, force bool) error {
	if !force && time.Since(c.lastTouch) < c.timeout/3 {
		return nil
	}
	if c.up != nil {
		if _, _, err := c.up.call(ctx, opPing, nil); err != nil {
			return errConnLoss
		}
	} else if _, err := c.z.front.KeepAlive(ctx, c.session); err != nil {
		return errConnLoss
	}
	c.lastTouch = time.Now()
	return nil
}
