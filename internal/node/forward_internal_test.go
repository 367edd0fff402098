package node

import (
	"net"
	"testing"
	"time"
)

// TestForwardListenerBound: the forward listener holds at most
// MaxForwardConns connections open; one more is closed as it is handed
// over, and closing one makes room again. After Close, Accept fails and
// a connection handed over is closed.
func TestForwardListenerBound(t *testing.T) {
	l := newForwardListener(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, MaxForwardConns, 8)
	var accepted []net.Conn
	for i := range MaxForwardConns {
		a, b := net.Pipe()
		defer b.Close()
		l.hand(a)
		c, err := l.Accept()
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		accepted = append(accepted, c)
	}
	closed := func(c net.Conn) bool {
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, err := c.Write([]byte{1})
		return err != nil && !isTimeout(err)
	}
	over, peer := net.Pipe()
	l.hand(over)
	if !closed(peer) {
		t.Fatal("a connection past the bound was kept")
	}
	accepted[0].Close()
	again, peer2 := net.Pipe()
	defer peer2.Close()
	l.hand(again)
	if _, err := l.Accept(); err != nil {
		t.Fatalf("after one closed: %v", err)
	}
	l.Close()
	if _, err := l.Accept(); err == nil {
		t.Fatal("Accept after Close succeeded")
	}
	for _, c := range accepted[1:] {
		c.Close()
	}
	late, peer3 := net.Pipe()
	l.hand(late)
	if !closed(peer3) {
		t.Fatal("a connection handed over after Close was kept")
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
