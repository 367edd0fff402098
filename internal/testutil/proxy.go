package testutil

import (
	"net"
	"sync"
	"testing"
)

// Proxy is a fault-injecting TCP proxy on loopback in front of a server.
// It can hold back traffic in either direction (a stalled network) and cut
// every connection (a broken one).
type Proxy struct {
	lis    net.Listener
	target string

	// mu guards the fields below; cond signals pause changes.
	mu       sync.Mutex
	cond     *sync.Cond
	pauseIn  bool // client → server held back
	pauseOut bool // server → client held back
	conns    map[net.Conn]struct{}
	blocked  bool
	closed   bool
	wg       sync.WaitGroup
}

// StartProxy listens on a free loopback port and forwards to target.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{lis: lis, target: target, conns: make(map[net.Conn]struct{})}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the address clients dial.
func (p *Proxy) Addr() string { return p.lis.Addr().String() }

// Pause holds back traffic: in = client→server, out = server→client.
func (p *Proxy) Pause(in, out bool) {
	p.mu.Lock()
	p.pauseIn, p.pauseOut = in, out
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Resume lets traffic flow again (what was held back is delivered).
func (p *Proxy) Resume() { p.Pause(false, false) }

// Cut closes every open connection; new ones are accepted.
func (p *Proxy) Cut() {
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Block cuts every connection and refuses new ones until Unblock: the link
// is down in both directions.
func (p *Proxy) Block() {
	p.mu.Lock()
	p.blocked = true
	p.mu.Unlock()
	p.Cut()
}

// Unblock lets new connections through again.
func (p *Proxy) Unblock() {
	p.mu.Lock()
	p.blocked = false
	p.mu.Unlock()
}

// Close stops the proxy and waits for its goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.mu.Unlock()
	p.lis.Close()
	p.Cut()
	p.Resume()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		blocked := p.blocked
		p.mu.Unlock()
		if blocked {
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.blocked || p.closed { // blocked while we dialled
			p.mu.Unlock()
			c.Close()
			s.Close()
			continue
		}
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(s, c, true)
		go p.pipe(c, s, false)
	}
}

func (p *Proxy) pipe(dst, src net.Conn, in bool) {
	defer p.wg.Done()
	defer func() {
		dst.Close()
		src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for !p.closed && ((in && p.pauseIn) || (!in && p.pauseOut)) {
				if _, alive := p.conns[src]; !alive {
					break
				}
				p.cond.Wait()
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // io.EOF or a cut
		}
	}
}
