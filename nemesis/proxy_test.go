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
