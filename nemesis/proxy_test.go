//go:build linux || darwin

package nemesis

import (
	"io"
	"net"
	"sync"
	"time"
)

// link is one directed peer link: node `from` dials node `to` through it
// (tenure serve --peer-route). Raft's connections are one-way request
// channels, so blocking the links i→j and j→i cuts i from j, and blocking
// only i→j leaves j able to reach i.
//
// It differs from internal/testutil.Proxy in one respect that partitions
// need: whether the link is blocked is decided under the lock at the moment
// a new connection is registered, so no connection accepted just before
// Block can slip through after it.
type link struct {
	from, to int
	lis      net.Listener
	target   string
	wg       sync.WaitGroup

	// mu guards the fields below.
	mu      sync.Mutex
	blocked bool
	closed  bool
	conns   map[net.Conn]struct{}
}

// newLink listens on a free loopback port and forwards to target.
func newLink(from, to int, target string) (*link, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l := &link{from: from, to: to, lis: lis, target: target, conns: make(map[net.Conn]struct{})}
	l.wg.Add(1)
	go l.serve()
	return l, nil
}

// Addr is the address the `from` node dials.
func (l *link) Addr() string { return l.lis.Addr().String() }

// Block closes every connection and refuses new ones until Unblock.
func (l *link) Block() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.blocked = true
	l.closeAllLocked()
}

// Unblock lets new connections through again.
func (l *link) Unblock() {
	l.mu.Lock()
	l.blocked = false
	l.mu.Unlock()
}

// Close stops the link and waits for its goroutines; it is idempotent.
func (l *link) Close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	l.closeAllLocked()
	l.mu.Unlock()
	l.lis.Close()
	l.wg.Wait()
}

func (l *link) closeAllLocked() {
	for c := range l.conns {
		c.Close()
		delete(l.conns, c)
	}
}

func (l *link) serve() {
	defer l.wg.Done()
	for {
		c, err := l.lis.Accept()
		if err != nil {
			return
		}
		l.wg.Add(1)
		go l.handle(c)
	}
}

// handle forwards one connection in both directions until either side
// closes or the link is blocked.
func (l *link) handle(c net.Conn) {
	defer l.wg.Done()
	s, err := net.DialTimeout("tcp", l.target, 2*time.Second)
	if err != nil {
		c.Close()
		return
	}
	l.mu.Lock()
	if l.blocked || l.closed {
		l.mu.Unlock()
		c.Close()
		s.Close()
		return
	}
	l.conns[c], l.conns[s] = struct{}{}, struct{}{}
	l.mu.Unlock()

	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		_, _ = io.Copy(s, c)
		l.drop(c, s)
	}()
	_, _ = io.Copy(c, s)
	l.drop(c, s)
}

func (l *link) drop(a, b net.Conn) {
	a.Close()
	b.Close()
	l.mu.Lock()
	delete(l.conns, a)
	delete(l.conns, b)
	l.mu.Unlock()
}

// clientProxy stands in front of one node's client API: the workload's
// clients dial it. Blackhole makes it stop forwarding in both directions
// without closing anything, the way a network path that drops every
// packet looks to both ends: calls and keepalives sent meanwhile get no
// answer and no error, and connections opened meanwhile get no handshake.
// Heal resumes forwarding, bytes held back included (TCP would retransmit
// them), in order.
type clientProxy struct {
	lis    net.Listener
	target string
	wg     sync.WaitGroup
	done   chan struct{} // closed by Close

	// mu guards the fields below.
	mu     sync.Mutex
	hole   chan struct{} // non-nil while blackholed; closed by Heal
	closed bool
	conns  map[net.Conn]struct{}
}

func newClientProxy(target string) (*clientProxy, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &clientProxy{lis: lis, target: target, done: make(chan struct{}), conns: make(map[net.Conn]struct{})}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is the address clients dial.
func (p *clientProxy) Addr() string { return p.lis.Addr().String() }

// Blackhole stops forwarding until Heal.
func (p *clientProxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hole == nil {
		p.hole = make(chan struct{})
	}
}

// Heal forwards again.
func (p *clientProxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hole != nil {
		close(p.hole)
		p.hole = nil
	}
}

// Close closes every connection and waits for the proxy's goroutines; it
// is idempotent.
func (p *clientProxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.done)
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.lis.Close()
	p.wg.Wait()
}

// pass waits while the proxy is blackholed; false once it is closed.
func (p *clientProxy) pass() bool {
	for {
		p.mu.Lock()
		hole, closed := p.hole, p.closed
		p.mu.Unlock()
		if closed {
			return false
		}
		if hole == nil {
			return true
		}
		select {
		case <-hole:
		case <-p.done:
			return false
		}
	}
}

func (p *clientProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *clientProxy) drop(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		c.Close()
		delete(p.conns, c)
	}
}

func (p *clientProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			c.Close()
			return
		}
		p.wg.Add(1)
		go p.handle(c)
	}
}

func (p *clientProxy) handle(c net.Conn) {
	defer p.wg.Done()
	if !p.pass() { // a connection opened into the hole waits for the heal
		p.drop(c)
		return
	}
	s, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		p.drop(c)
		return
	}
	if !p.track(s) {
		p.drop(c, s)
		return
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.pump(s, c)
		p.drop(c, s)
	}()
	p.pump(c, s)
	p.drop(c, s)
}

// pump copies src to dst, holding bytes back while blackholed, until
// either side fails or the proxy closes.
func (p *clientProxy) pump(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for p.pass() {
		n, err := src.Read(buf)
		// Bytes read just as the hole opened are held back too.
		if n > 0 && (!p.pass() || writeAll(dst, buf[:n]) != nil) {
			return
		}
		if err != nil {
			p.pass() // and so is a close
			return
		}
	}
}

func writeAll(w io.Writer, b []byte) error {
	_, err := w.Write(b)
	return err
}
