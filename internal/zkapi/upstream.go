package zkapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/tenure-io/tenure/internal/server"
)

// upstream is a follower's relay of one client connection to the
// leader's ZooKeeper front: a connection of the same session, over which
// the follower sends what needs the leader (writes, pings, sync,
// addAuth, close) and reads each answer in turn. It sets no watches
// there: the follower serves watches from its own applied state.
//
// The connection goes over the peer port (Front.DialZkRelay: proved a
// member's, under peer TLS when it is on), and starts with a preamble
// naming the client (its address, its verified certificate), which the
// leader believes as it believes a forwarded request's certificate: the
// leader serves it as that client's connection. A leader that does not
// take relay connections (an older release) is reached at the ZooKeeper
// address it published instead (ZkSetAddr), as a plain client.
type upstream struct {
	nc  net.Conn
	xid int32
	// mu serialises calls (the connection's requests come one at a time;
	// mu keeps a late close apart from a call).
	mu  sync.Mutex
	buf []byte
}

// relayRecheck is how long a leader that refused a relay connection
// over the peer port is reached at its published address without trying
// the peer port first.
const relayRecheck = time.Minute

// relayPreambleVersion is the version of the relay preamble.
const relayPreambleVersion = 1

// maxRelayPreamble bounds a relay preamble.
const maxRelayPreamble = 64 << 10

// relayPreamble is what a follower tells the leader of its client before
// the client's ConnectRequest, on a relay connection over the peer port.
type relayPreamble struct {
	// remote is the client's address (host:port): the leader's logs, the
	// session's owner and the connection's ip id name it.
	remote string
	// x509 is ZooKeeper's x509 id of the client's verified certificate
	// ("" without one); certNames are the certificate's names for
	// Tenure's ACLs (nil without one).
	x509      string
	certNames []string
}

func (p relayPreamble) encode() []byte {
	var e encoder
	e.int(relayPreambleVersion)
	e.string(p.remote)
	e.string(p.x509)
	e.bool(p.certNames != nil)
	e.strings(p.certNames)
	return e.b
}

func decodeRelayPreamble(b []byte) (relayPreamble, error) {
	d := decoder{b: b}
	if v := d.int(); d.err == nil && v != relayPreambleVersion {
		return relayPreamble{}, fmt.Errorf("zookeeper relay: preamble version %d, this node speaks %d", v, relayPreambleVersion)
	}
	p := relayPreamble{remote: d.string(), x509: d.string()}
	hasCert := d.bool()
	p.certNames = d.strings()
	if hasCert && p.certNames == nil {
		p.certNames = []string{}
	}
	if d.err != nil {
		return relayPreamble{}, d.err
	}
	if len(d.b) > 0 {
		return relayPreamble{}, errors.New("zookeeper relay: trailing bytes after the preamble")
	}
	return p, nil
}

// dialLeader opens the relay of this (follower's) connection to the
// leader and sends the client's ConnectRequest there, returning the
// leader's answer: over the peer port, or, when the leader does not take
// relay connections there, to its published ZooKeeper address.
func (c *conn) dialLeader(ctx context.Context, req connectRequest) (*upstream, connectResponse, error) {
	z := c.z
	leader := z.front.Leader()
	if leader == "" {
		return nil, connectResponse{}, errors.New("no leader known")
	}
	if z.relayTaken(leader) {
		nc, err := z.front.DialZkRelay(ctx, leader)
		if err == nil {
			pre := relayPreamble{remote: c.remote, x509: c.x509, certNames: c.certNames}
			u, resp, err := startUpstream(nc, pre.encode(), req)
			if err == nil {
				return u, resp, nil
			}
			z.log.Debug("zookeeper relay over the peer port broke; trying the leader's ZooKeeper address", "leader", leader, "err", err)
		} else {
			if errors.Is(err, server.ErrDoorUnsupported) {
				z.relayRefusedBy(leader)
			}
			z.log.Debug("zookeeper relay over the peer port refused; trying the leader's ZooKeeper address", "leader", leader, "err", err)
		}
	}
	addr := z.leaderAddr()
	if addr == "" {
		return nil, connectResponse{}, fmt.Errorf("the leader %s published no ZooKeeper address", leader)
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var dialer net.Dialer
	nc, err := dialer.DialContext(dctx, "tcp", addr)
	if err != nil {
		return nil, connectResponse{}, err
	}
	return startUpstream(nc, nil, req)
}

// relayTaken reports whether leader is to be tried over the peer port
// (it did not refuse a relay connection within relayRecheck).
func (z *Server) relayTaken(leader string) bool {
	z.relayMu.Lock()
	defer z.relayMu.Unlock()
	until, ok := z.relayRefused[leader]
	if ok && time.Now().After(until) {
		delete(z.relayRefused, leader)
		ok = false
	}
	return !ok
}

// relayRefusedBy records that leader refused a relay connection.
func (z *Server) relayRefusedBy(leader string) {
	z.relayMu.Lock()
	defer z.relayMu.Unlock()
	if len(z.relayRefused) >= 64 { // members, bounded: forget the oldest news
		clear(z.relayRefused)
	}
	z.relayRefused[leader] = time.Now().Add(relayRecheck)
}

// startUpstream sends, on nc, the preamble (nil: none, a plain client
// connection) and the client's ConnectRequest (without the zxid it has
// seen, which the follower checked), and returns the leader's answer.
func startUpstream(nc net.Conn, preamble []byte, req connectRequest) (*upstream, connectResponse, error) {
	u := &upstream{nc: nc}
	if preamble != nil {
		if err := u.send(preamble); err != nil {
			nc.Close()
			return nil, connectResponse{}, err
		}
	}
	req.lastZxidSeen = 0
	req.hasReadOnly = true
	if err := u.send(req.encode()); err != nil {
		nc.Close()
		return nil, connectResponse{}, err
	}
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	pkt, err := readPacket(nc, nil, maxRelayPacket)
	if err != nil {
		nc.Close()
		return nil, connectResponse{}, err
	}
	resp, err := decodeConnectResponse(pkt)
	if err != nil {
		nc.Close()
		return nil, connectResponse{}, err
	}
	return u, resp, nil
}

// readPreamble reads the preamble of a relay connection (the leader's
// side) and makes the connection the client's it names.
func (c *conn) readPreamble() error {
	_ = c.nc.SetReadDeadline(time.Now().Add(handshakeTimeout))
	pkt, err := readPacket(c.nc, nil, maxRelayPreamble)
	if err != nil {
		return err
	}
	pre, err := decodeRelayPreamble(pkt)
	if err != nil {
		return err
	}
	c.setRemote(pre.remote)
	if pre.certNames != nil || pre.x509 != "" {
		c.setCert(pre.x509, pre.certNames)
	}
	return nil
}

func (u *upstream) send(pkt []byte) error {
	var e encoder
	e.int(int32(len(pkt)))
	e.b = append(e.b, pkt...)
	_ = u.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := u.nc.Write(e.b)
	return err
}

// call sends one request and returns the leader's reply header and body.
func (u *upstream) call(ctx context.Context, op int32, body []byte) (replyHeader, []byte, error) {
	u.mu.Lock()
	u.xid++
	xid := u.xid
	u.mu.Unlock()
	if op == opPing {
		xid = xidPing
	}
	return u.callXid(ctx, xid, op, body)
}

// callXid is call with the request's xid given.
func (u *upstream) callXid(ctx context.Context, xid, op int32, body []byte) (replyHeader, []byte, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	var e encoder
	e.int(xid)
	e.int(op)
	e.b = append(e.b, body...)
	if err := u.send(e.b); err != nil {
		return replyHeader{}, nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	for range 1 << 20 {
		_ = u.nc.SetReadDeadline(deadline)
		pkt, err := readPacket(u.nc, u.buf, maxRelayPacket)
		if err != nil {
			return replyHeader{}, nil, err
		}
		u.buf = pkt
		d := decoder{b: pkt}
		h := replyHeader{xid: d.int(), zxid: d.long(), err: d.int()}
		if d.err != nil {
			return replyHeader{}, nil, d.err
		}
		if h.xid == xidNotification {
			continue
		}
		if h.xid != xid {
			return replyHeader{}, nil, fmt.Errorf("zookeeper relay: answer %d to request %d", h.xid, xid)
		}
		return h, append([]byte(nil), d.b...), nil
	}
	return replyHeader{}, nil, fmt.Errorf("zookeeper relay: no answer")
}

func (u *upstream) close() { u.nc.Close() }
