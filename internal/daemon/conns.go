package daemon

// Connection limits. Every listener of the process (the client API, the
// HTTP listener, the etcd API) accepts through a limitedListener of one
// shared connTable, so that a flood of connections, idle or not
// authenticated, cannot take the descriptors the process needs nor stop
// an authorized client from being served:
//
//   - a listener holds at most --max-connections connections, and all of
//     them together at most what the descriptor limit (RLIMIT_NOFILE,
//     raised to its hard limit at startup) leaves after fdReserve for
//     raft, its log and snapshot files, and the peers;
//   - a new connection is always accepted: at a limit, the connection of
//     that listener (or, at the process's limit, of any listener) that
//     has been quiet longest (read nothing for the longest time) is closed
//     to make room. An attacker's idle connections go first; a client
//     that has just connected and sends its request is the last to go;
//   - an Accept that fails for want of descriptors (EMFILE, ENFILE: taken
//     by something else) closes the quietest connection and tries again,
//     rather than leaving new clients waiting in the kernel's backlog.
//
// Idle connections are also ended by the servers themselves: HTTP's
// IdleTimeout and ReadTimeout (http.go), gRPC's MaxConnectionIdle and
// handshake timeout (server.ConnectionOptions).

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// DefaultMaxConnections is the default Config.MaxConnections.
const DefaultMaxConnections = 10_000

// fdReserve is the descriptors kept out of the connection limit for the
// rest of the process: raft's log and snapshot files, its peer
// connections, the data directory's files.
const fdReserve = 128

// minConnections is the least the descriptor limit may leave for
// connections; below it the process's limit is used as it is, less
// half (a very low limit is an operator's deliberate choice).
const minConnections = 16

// raiseFDLimit raises the soft descriptor limit to the hard one and
// returns it (0 if unknown). Go's runtime does the same at startup since
// Go 1.19; this keeps it explicit and reports the result.
func raiseFDLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	if rl.Cur < rl.Max {
		want := rl
		want.Cur = rl.Max
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want) == nil {
			rl = want
		}
	}
	return rl.Cur
}

// connBudget is how many connections all listeners together may hold
// under a descriptor limit of fds (0: unknown, no bound but perListener
// times listeners).
func connBudget(fds uint64, perListener, listeners int) int {
	total := perListener * listeners
	if fds == 0 || fds > uint64(1<<31) {
		return total
	}
	left := int(fds) - fdReserve
	if left < minConnections {
		left = max(int(fds)/2, 1)
	}
	return min(total, left)
}

// connTable holds the open connections of every limitedListener of the
// process. It is safe for concurrent use.
type connTable struct {
	perListener, total int
	fds                uint64 // the descriptor limit (0: unknown)

	mu    sync.Mutex // guards conns and the listeners' counts
	conns map[*trackedConn]struct{}
	// evicted counts the connections closed to make room (tests).
	evicted atomic.Int64
}

// newConnTable bounds each listener at perListener connections (<= 0:
// DefaultMaxConnections) and all of them at what the descriptor limit
// leaves for listeners listeners.
func newConnTable(perListener, listeners int) *connTable {
	if perListener <= 0 {
		perListener = DefaultMaxConnections
	}
	fds := raiseFDLimit()
	return &connTable{perListener: perListener, total: connBudget(fds, perListener, listeners), fds: fds, conns: make(map[*trackedConn]struct{})}
}

// wrap returns l accepting through t.
func (t *connTable) wrap(l net.Listener) net.Listener {
	return &limitedListener{Listener: l, table: t}
}

// admit registers c and returns the connections to close to make room
// for it (the caller closes them, outside the lock).
func (t *connTable) admit(c *trackedConn) []*trackedConn {
	t.mu.Lock()
	defer t.mu.Unlock()
	var victims []*trackedConn
	for c.lis.open >= t.perListener {
		v := t.quietestLocked(c.lis)
		if v == nil {
			break
		}
		victims = append(victims, v)
	}
	for len(t.conns) >= t.total {
		v := t.quietestLocked(nil)
		if v == nil {
			break
		}
		victims = append(victims, v)
	}
	t.conns[c] = struct{}{}
	c.lis.open++
	return victims
}

// evictOne removes the quietest connection of any listener and returns
// it (nil if there is none); the caller closes it.
func (t *connTable) evictOne() *trackedConn {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.quietestLocked(nil)
}

// quietestLocked removes and returns the connection, of lis (nil: of any
// listener), that has read nothing for the longest time. It scans the
// table: it runs only at a limit, and a table holds at most a few ten
// thousand connections.
func (t *connTable) quietestLocked(lis *limitedListener) *trackedConn {
	var v *trackedConn
	var oldest int64
	for c := range t.conns {
		if lis != nil && c.lis != lis {
			continue
		}
		if at := c.active.Load(); v == nil || at < oldest {
			v, oldest = c, at
		}
	}
	if v != nil {
		t.removeLocked(v)
		t.evicted.Add(1)
	}
	return v
}

func (t *connTable) removeLocked(c *trackedConn) {
	if _, ok := t.conns[c]; ok {
		delete(t.conns, c)
		c.lis.open--
	}
}

// forget removes c once it is closed.
func (t *connTable) forget(c *trackedConn) {
	t.mu.Lock()
	t.removeLocked(c)
	t.mu.Unlock()
}

// limitedListener accepts within its connTable's limits.
type limitedListener struct {
	net.Listener
	table *connTable
	open  int // guarded by table.mu
}

// Accept implements net.Listener.
func (l *limitedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				if v := l.table.evictOne(); v != nil {
					v.Conn.Close()
					continue
				}
			}
			return nil, err
		}
		tc := &trackedConn{Conn: c, lis: l}
		tc.touch()
		for _, v := range l.table.admit(tc) {
			v.Conn.Close()
		}
		return tc, nil
	}
}

// trackedConn is a connection of a limitedListener: it records when it
// last read something, and leaves the table when closed.
type trackedConn struct {
	net.Conn
	lis    *limitedListener
	active atomic.Int64 // unix nanoseconds of the last read (or accept)
	closed atomic.Bool
}

func (c *trackedConn) touch() { c.active.Store(time.Now().UnixNano()) }

// Read implements net.Conn.
func (c *trackedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.touch()
	}
	return n, err
}

// Close implements net.Conn.
func (c *trackedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.lis.table.forget(c)
	}
	return c.Conn.Close()
}
