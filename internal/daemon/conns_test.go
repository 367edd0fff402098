package daemon_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/daemon"
)

// fdChildEnv names the data directory of the daemon TestFDFloodChild
// runs; unset, that test does nothing.
const fdChildEnv = "TENURE_FD_FLOOD_CHILD"

// TestFDFloodChild is the server of TestIdleFloodLeavesRoomForClients,
// run in a child process under a lowered descriptor limit, with --auth:
// it prints its addresses and a management token once ready and serves
// until its stdin closes.
func TestFDFloodChild(t *testing.T) {
	dir := os.Getenv(fdChildEnv)
	if dir == "" {
		return // run only as TestIdleFloodLeavesRoomForClients's child
	}
	d, err := daemon.Start(daemon.Config{NodeID: "n1", DataDir: dir, Listen: "127.0.0.1:0", HTTPListen: "127.0.0.1:0", LogOutput: os.Stderr, Auth: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	select {
	case <-d.Ready():
	case err := <-done:
		t.Fatalf("stopped before ready: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("not ready after 30s")
	}
	bctx, bcancel := context.WithTimeout(ctx, 20*time.Second)
	c, err := client.Dial(bctx, d.Addr())
	if err != nil {
		t.Fatal(err)
	}
	root, err := c.BootstrapACL(bctx)
	c.Close()
	bcancel()
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("ADDRS %s %s %s\n", d.Addr(), d.HTTPAddr(), root.Secret)
	io.Copy(io.Discard, os.Stdin) // until the parent closes it
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestIdleFloodLeavesRoomForClients: a server whose descriptor limit is
// 256 is flooded with idle HTTP keep-alive connections and idle gRPC
// connections (HTTP/2 preface sent, then nothing), 400 in all, none
// authenticated, more than its descriptors. Before, it then accepted
// nothing more: status, a new lock and /healthz failed for everyone until
// the attacker left. Now a client with a token (the server runs --auth)
// is served within a bounded time, and the server closed some of the
// attacker's connections to make room.
func TestIdleFloodLeavesRoomForClients(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("descriptor limits are set with sh's ulimit on Linux")
	}
	var stderr syncBuffer
	cmd := exec.Command("sh", "-c", `ulimit -n 256 && exec "$0" -test.run='^TestFDFloodChild$' -test.count=1`, os.Args[0])
	cmd.Env = append(os.Environ(), fdChildEnv+"="+t.TempDir())
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill() // the child this test started
			<-exited
		}
		if t.Failed() {
			t.Logf("server's stderr:\n%s", stderr.String())
		}
	})
	addrs := make(chan []string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) == 4 && f[0] == "ADDRS" {
				addrs <- f[1:]
				io.Copy(io.Discard, stdout)
				return
			}
		}
	}()
	var grpcAddr, httpAddr, secret string
	select {
	case a := <-addrs:
		grpcAddr, httpAddr, secret = a[0], a[1], a[2]
	case <-exited:
		t.Fatal("the server exited before it was ready")
	case <-time.After(60 * time.Second):
		t.Fatal("the server was not ready within 60s")
	}

	// The flood: 200 idle HTTP keep-alive connections (each served one
	// request, if it could), then 200 idle gRPC connections.
	var flood []net.Conn
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	for range 200 {
		c, err := net.DialTimeout("tcp", httpAddr, 2*time.Second)
		if err != nil {
			continue
		}
		flood = append(flood, c)
		c.SetDeadline(time.Now().Add(500 * time.Millisecond))
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: "+httpAddr+"\r\n\r\n"); err == nil {
			if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
		c.SetDeadline(time.Time{})
	}
	preface := append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0) // and an empty SETTINGS frame
	for range 200 {
		c, err := net.DialTimeout("tcp", grpcAddr, 2*time.Second)
		if err != nil {
			continue
		}
		flood = append(flood, c)
		c.Write(preface)
	}

	// An authorized client: status, a new lock, /healthz, each within a
	// bounded time.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, grpcAddr, client.WithAuthToken(secret))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Status(ctx); err != nil {
		t.Fatalf("status during the flood: %v", err)
	}
	s, err := c.NewSession(ctx)
	if err != nil {
		t.Fatalf("a new session during the flood: %v", err)
	}
	m, err := s.Mutex("flood/lock")
	if err != nil {
		t.Fatal(err)
	}
	h, err := m.Lock(ctx)
	if err != nil {
		t.Fatalf("a new lock during the flood: %v", err)
	}
	if h.Token() == 0 {
		t.Fatal("the new lock has no token")
	}
	s.Close(ctx)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Get("http://" + httpAddr + "/healthz")
	if err != nil {
		t.Fatalf("/healthz during the flood: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz during the flood: %s", resp.Status)
	}

	// The server closed attacker connections to make room: reads on the
	// oldest end (EOF or reset) rather than time out.
	closed := 0
	for _, fc := range flood[:50] {
		fc.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if _, err := io.Copy(io.Discard, fc); err == nil || !isTimeout(err) {
			closed++
		}
	}
	if closed == 0 {
		t.Fatal("none of the 50 oldest flood connections was closed by the server")
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
