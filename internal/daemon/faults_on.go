//go:build tenurefault

package daemon

import (
	"net"
	"sync"
)

// clientFaults is the client API listener's fault switch of a tenurefault
// build (tests only; a normal build has none, see faults.go).
type clientFaults struct{ b *blackhole }

func newClientFaults(lis net.Listener) (net.Listener, clientFaults) {
	b := &blackhole{off: make(chan struct{})}
	close(b.off)
	return blackholeListener{Listener: lis, b: b}, clientFaults{b: b}
}

// BlackholeClientAPI cuts the client API off (on) or restores it: while
// it is cut, nothing a connection of the client API sends or receives
// gets through (it is held back, as a network that drops packets holds a
// TCP stream back), new connections included; the node itself, its peer
// port and its other listeners go on as before.
func (d *Daemon) BlackholeClientAPI(on bool) { d.clientFaults.b.set(on) }

// blackhole holds back the traffic of the connections it covers while on.
type blackhole struct {
	// mu guards on and off.
	mu  sync.Mutex
	on  bool
	off chan struct{} // closed while off
}

func (b *blackhole) set(on bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if on == b.on {
		return
	}
	b.on = on
	if on {
		b.off = make(chan struct{})
	} else {
		close(b.off)
	}
}

// wait returns once the blackhole is off, or false when done closes first.
func (b *blackhole) wait(done <-chan struct{}) bool {
	b.mu.Lock()
	off := b.off
	b.mu.Unlock()
	select {
	case <-off:
		return true
	case <-done:
		return false
	}
}

type blackholeListener struct {
	net.Listener
	b *blackhole
}

func (l blackholeListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &blackholeConn{Conn: c, b: l.b, closed: make(chan struct{})}, nil
}

type blackholeConn struct {
	net.Conn
	b      *blackhole
	once   sync.Once
	closed chan struct{}
}

// Read holds back what arrives while the blackhole is on.
func (c *blackholeConn) Read(p []byte) (int, error) {
	if !c.b.wait(c.closed) {
		return 0, net.ErrClosed
	}
	n, err := c.Conn.Read(p)
	if !c.b.wait(c.closed) {
		return 0, net.ErrClosed
	}
	return n, err
}

// Write holds back what is sent while the blackhole is on.
func (c *blackholeConn) Write(p []byte) (int, error) {
	if !c.b.wait(c.closed) {
		return 0, net.ErrClosed
	}
	return c.Conn.Write(p)
}

func (c *blackholeConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}
