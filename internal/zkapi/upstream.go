package zkapi

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"
)

// upstream is a follower's relay of one client connection to the
// leader's ZooKeeper listener: a connection of the same session, over
// which the follower sends what needs the leader (writes, pings, sync,
// addAuth, close) and reads each answer in turn. It sets no watches
// there: the follower serves watches from its own applied state.
type upstream struct {
	nc  net.Conn
	xid int32
	// mu serialises calls (the connection's requests come one at a time;
	// mu keeps a late close apart from a call).
	mu  sync.Mutex
	buf []byte
}

// dialUpstream connects to the leader's listener at addr and sends the
// client's ConnectRequest (without the zxid it has seen, which the
// follower checked), returning the leader's answer.
func dialUpstream(ctx context.Context, addr string, req connectRequest) (*upstream, connectResponse, error) {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var dialer net.Dialer
	nc, err := dialer.DialContext(dctx, "tcp", addr)
	if err != nil {
		return nil, connectResponse{}, err
	}
	u := &upstream{nc: nc}
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
