//go:build linux || darwin

package nemesis

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// TestClientProxyBlackhole: a blackholed client proxy forwards nothing in
// either direction and closes nothing, also for a connection opened into
// the hole, and after Heal delivers what was held back, in order.
func TestClientProxyBlackhole(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() { // an echo server, line by line
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	p, err := newClientProxy(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	send := func(c net.Conn, s string) {
		if _, err := c.Write([]byte(s + "\n")); err != nil {
			t.Fatalf("write through the proxy: %v", err)
		}
	}
	// expect reads a line within d; want "" means nothing may arrive (and
	// the connection must stay open) for d.
	expect := func(c net.Conn, r *bufio.Reader, want string, d time.Duration) {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(d))
		line, err := r.ReadString('\n')
		_ = c.SetReadDeadline(time.Time{})
		if want == "" {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("through the blackhole: read %q, %v; want silence", line, err)
			}
			return
		}
		if err != nil || line != want+"\n" {
			t.Fatalf("read %q, %v; want %q", line, err, want)
		}
	}

	a, ra := dial()
	send(a, "one")
	expect(a, ra, "one", 5*time.Second)

	p.Blackhole()
	send(a, "two")
	expect(a, ra, "", 300*time.Millisecond)
	b, rb := dial() // opened into the hole
	send(b, "three")
	expect(b, rb, "", 300*time.Millisecond)

	p.Heal()
	expect(a, ra, "two", 5*time.Second)
	expect(b, rb, "three", 5*time.Second)
	send(a, "four")
	expect(a, ra, "four", 5*time.Second)
}
