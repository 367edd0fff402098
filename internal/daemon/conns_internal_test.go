package daemon

import (
	"net"
	"testing"
	"time"
)

func TestConnBudget(t *testing.T) {
	for _, c := range []struct {
		fds                    uint64
		perListener, listeners int
		want                   int
	}{
		{0, 10_000, 3, 30_000},       // limit unknown
		{1 << 20, 10_000, 3, 30_000}, // plenty
		{20_000, 10_000, 3, 20_000 - fdReserve},
		{256, 10_000, 2, 256 - fdReserve},
		{100, 10_000, 2, 50}, // too few for the reserve: half
	} {
		if got := connBudget(c.fds, c.perListener, c.listeners); got != c.want {
			t.Errorf("connBudget(%d, %d, %d) = %d, want %d", c.fds, c.perListener, c.listeners, got, c.want)
		}
	}
}

// TestConnTableEvictsTheQuietest: at a listener's limit a new connection
// is accepted and the connection of that listener that read nothing for
// the longest time is closed; at the total limit, the quietest of any
// listener; a closed connection frees its place.
func TestConnTableEvictsTheQuietest(t *testing.T) {
	table := &connTable{perListener: 3, total: 5, conns: make(map[*trackedConn]struct{})}
	a, b := &limitedListener{table: table}, &limitedListener{table: table}
	at := time.Now().UnixNano()
	conn := func(l *limitedListener, age time.Duration) *trackedConn {
		c := &trackedConn{Conn: nopConn{}, lis: l}
		c.active.Store(at - int64(age))
		return c
	}
	a1, a2, a3 := conn(a, 5*time.Second), conn(a, time.Second), conn(a, 3*time.Second)
	for _, c := range []*trackedConn{a1, a2, a3} {
		if v := table.admit(c); len(v) != 0 {
			t.Fatalf("under the limit: %d evicted", len(v))
		}
	}
	if v := table.admit(conn(a, 0)); len(v) != 1 || v[0] != a1 {
		t.Fatalf("a's fourth connection evicted %v, want a1 (the quietest)", v)
	}
	b1 := conn(b, 10*time.Second)
	table.admit(b1)
	table.admit(conn(b, 0))
	// 5 open: a2, a3, a4, b1, b2. A sixth evicts the quietest of all: b1.
	if v := table.admit(conn(b, 0)); len(v) != 1 || v[0] != b1 {
		t.Fatalf("at the total limit evicted %v, want b1", v)
	}
	a3.Close()
	if v := table.admit(conn(b, 0)); len(v) != 0 {
		t.Fatalf("after a close: %d evicted", len(v))
	}
	if a.open != 2 || b.open != 3 || len(table.conns) != 5 {
		t.Fatalf("open: a %d, b %d, all %d", a.open, b.open, len(table.conns))
	}
}

type nopConn struct{ net.Conn }

func (nopConn) Close() error { return nil }
