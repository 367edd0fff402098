package client

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	pb "github.com/tenure-io/tenure/api/tenurepb"
)

// Preferring the leader. A follower serves a client's requests that need
// the leader by forwarding them over the cluster's peer port, and names
// the leader's client address in the answer's header (leaderHintHeader).
// A client that learns so moves to the leader, to save the hop, but only
// after it checked, in the background, that the leader's endpoint answers
// as the leader (probeTimeout): a client that cannot reach the leader's
// client API stays on the follower, whose forwarding keeps it working.
// After a failed check the client asks again only after a pause that
// doubles from preferMinWait to preferMaxWait (reset by a check that
// succeeds to preferMinWait, so that a client that moved and came back
// waits before it tries again): it never swings between the two.
//
// The hinted address is used as a leader named in a "not the leader"
// answer is (Client.follow): one of the endpoints given to Dial, or, with
// WithDiscovery, any; without WithDiscovery a hint naming an address not
// given is ignored, since the given endpoints may be the only way to the
// members (proxies, tunnels).
//
// Sessions move at a safe point: the keeper opens the session again on
// the leader's endpoint and only once that answered leaves the old stream
// (make before break), so the session's holds stay Held throughout; the
// requests pending on the old stream are sent again on the new one, as
// after a broken stream (they are safe to repeat, see Session.do).

// leaderHintHeader is the header in which a follower that forwarded a
// request names the leader's client address (the server's
// LeaderHintHeader).
const leaderHintHeader = "tenure-leader"

// Bounds of preferring the leader.
const (
	// probeTimeout bounds the check of the leader's endpoint, and a
	// session's open there.
	probeTimeout = time.Second
	// preferMinWait and preferMaxWait bound the pause before checking
	// the leader's endpoint again after a check failed.
	preferMinWait = time.Second
	preferMaxWait = 30 * time.Second
)

// preferState is the client's state of preferring the leader; guarded by
// Client.mu.
type preferState struct {
	addr    string        // the leader's client address last hinted
	running bool          // a prefer goroutine runs
	wait    time.Duration // the pause before the next check (0: none)
}

// hintInterceptor reads the leader hint of the answers of endpoint i's
// unary calls.
func (c *Client) hintInterceptor(i uint32) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		var md metadata.MD
		err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Header(&md))...)
		if len(md) > 0 {
			c.hinted(i, md)
		}
		return err
	}
}

// hinted takes the header md of an answer of endpoint from: when it names
// the leader's client address and from is the endpoint in use, the
// client checks the leader in the background (prefer). It never blocks.
func (c *Client) hinted(from uint32, md metadata.MD) {
	vs := md.Get(leaderHintHeader)
	if len(vs) == 0 || vs[0] == "" || c.cur.Load() != from {
		return
	}
	if !c.discover && !c.has(vs[0]) {
		return // not an endpoint it was given: it stays (and is forwarded)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pref.addr = vs[0]
	if c.closed || c.pref.running {
		return
	}
	c.pref.running = true
	c.bg.Add(1) // under mu, before Close can wait: Close sets closed first
	go func() {
		defer c.bg.Done()
		c.prefer(from)
	}()
}

// prefer moves the client from endpoint from, a follower that forwards
// its requests, to the leader last hinted, once a check of the leader's
// endpoint succeeds; it checks again after a growing pause while the
// client stays on from, and returns once it moved, the client moved
// elsewhere by itself, or the client is closed.
func (c *Client) prefer(from uint32) {
	defer func() {
		c.mu.Lock()
		c.pref.running = false
		c.mu.Unlock()
	}()
	for {
		c.mu.Lock()
		addr, wait := c.pref.addr, c.pref.wait
		c.mu.Unlock()
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-c.bgCtx.Done():
				t.Stop()
				return
			}
		}
		if c.cur.Load() != from || c.bgCtx.Err() != nil {
			return
		}
		j, ok := c.endpointOf(addr)
		if !ok || j == from {
			return
		}
		good := c.probe(j)
		c.mu.Lock()
		if good {
			c.pref.wait = preferMinWait
		} else {
			c.pref.wait = min(max(2*c.pref.wait, preferMinWait), preferMaxWait)
		}
		c.mu.Unlock()
		if good {
			if c.cur.CompareAndSwap(from, j) {
				c.moveSessions(j)
			}
			return
		}
	}
}

// has reports whether the client has an endpoint at addr.
func (c *Client) has(addr string) bool {
	for _, ep := range c.all() {
		if ep.addr == addr {
			return true
		}
	}
	return false
}

// endpointOf returns the index of the endpoint at addr: one the client
// has, or, WithDiscovery, a new one.
func (c *Client) endpointOf(addr string) (uint32, bool) {
	for k, ep := range c.all() {
		if ep.addr == addr {
			return uint32(k), true
		}
	}
	if !c.discover {
		return 0, false
	}
	j, err := c.addEndpoint(addr)
	return j, err == nil
}

// probe reports whether endpoint j answers, within probeTimeout, that it
// is the leader.
func (c *Client) probe(j uint32) bool {
	ctx, cancel := context.WithTimeout(c.bgCtx, probeTimeout)
	defer cancel()
	resp, err := c.all()[j].api.Status(ctx, &pb.StatusRequest{})
	return err == nil && resp.GetNode() != "" && resp.GetLeader() == resp.GetNode()
}

// moveSessions asks every session to move to endpoint j (Session.move).
func (c *Client) moveSessions(j uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for s := range c.sessions {
		s.mu.Lock()
		s.moveTo = j + 1
		s.mu.Unlock()
		s.poke()
	}
}

// move opens the session again on endpoint j and, once that answered,
// makes it the session's stream and leaves the old one (make before
// break: the holds stay Held). The requests pending on the old stream are
// told it broke, and are sent again on the new one. When the open fails
// the session stays where it is (a session the server reports gone is
// lost). Run by the keeper only.
func (s *Session) move(j uint32) {
	s.mu.Lock()
	left := s.safeUntil.Sub(s.clk.Now())
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(s.ctx, min(left, probeTimeout))
	defer cancel()
	st, _, sentAt, err := s.openOn(ctx, j, s.id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if errors.Is(err, ErrSessionExpired) {
			s.loseLocked(err)
		}
		return
	}
	old := s.st
	switch {
	case s.state >= sessLost:
		st.leave()
		return
	case old == nil:
		s.attachLocked(st, sentAt)
		return
	}
	s.st = st
	clear(s.kaSent)
	for _, c := range s.pending {
		if c.st == old {
			select {
			case c.ch <- callResult{err: errDisconnected}:
			default:
			}
		}
	}
	old.leave()
	s.extendLocked(sentAt)
	select {
	case <-st.done: // it ended after the open was answered
		s.streamBrokenLocked(st)
	default:
	}
}
