package zkapi_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	tpb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/daemon"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/testutil"
	"github.com/tenure-io/tenure/internal/zkapi"
)

// ZooKeeper's opcodes the hostile tests send raw.
const (
	opExistsRaw       = 3
	opGetChildrenRaw  = 8
	opSetWatches2Raw  = 105
	xidSetWatchesRaw  = -8
	codeNoAuthRaw     = -102
	codeQuotaExceeded = -125
)

// strs encodes a jute vector of strings.
func (j jute) strs(ss ...string) jute {
	j = j.int(int32(len(ss)))
	for _, s := range ss {
		j = j.str(s)
	}
	return j
}

// event waits up to d for a watch event and returns its path; ok is
// false when none came (or the connection closed).
func (r *rawConn) event(t *testing.T, d time.Duration) (path string, ok bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		_ = r.nc.SetReadDeadline(deadline)
		var lenb [4]byte
		if _, err := io.ReadFull(r.nc, lenb[:]); err != nil {
			return "", false
		}
		pkt := make([]byte, binary.BigEndian.Uint32(lenb[:]))
		if _, err := io.ReadFull(r.nc, pkt); err != nil {
			return "", false
		}
		if int32(binary.BigEndian.Uint32(pkt)) != -1 {
			continue
		}
		// header (16), type, state, path
		n := binary.BigEndian.Uint32(pkt[24:])
		return string(pkt[28 : 28+n]), true
	}
}

// TestSetWatchesNeedsRights: under --auth, setWatches (sent by a client
// reconnecting) is a read like any other: a client without a token is
// refused NoAuth and learns nothing of the changes of znodes it may not
// read, persistent recursive watches on "/" included.
func TestSetWatchesNeedsRights(t *testing.T) {
	d, addr := startNode(t, func(c *daemon.Config) { c.Auth = true })
	tok, _ := aclToken(t, d.Addr(), "kv:zk/:write")
	owner, _ := connect(t, []string{addr}, 5*time.Second)
	if err := owner.AddAuth("digest", []byte(tok.GetId()+":"+tok.GetSecret())); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Create("/secret", []byte("a"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}

	anon := raw(t, addr)
	anon.connect(t, 0, make([]byte, 16), true)
	body := jute{}.append8(0).strs("/secret").strs().strs("/").strs().strs("/")
	if code, _ := anon.call(t, xidSetWatchesRaw, opSetWatches2Raw, body); code != codeNoAuthRaw {
		t.Errorf("anonymous setWatches2: code %d, want NoAuth (%d)", code, codeNoAuthRaw)
	}
	if _, err := owner.Set("/secret", []byte("b"), -1); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Create("/secret2", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if p, ok := anon.event(t, time.Second); ok {
		t.Fatalf("an anonymous client got the event of %q", p)
	}
}

// TestAnswersAreBounded: an answer larger than a ZooKeeper client
// accepts (jute.maxbuffer and its headers) is not built: a multiRead of
// the same big node a hundred times, or a getChildren of many long
// names, closes the connection (the client sees ConnectionLoss, as a
// ZooKeeper client that refuses such a packet does), and the node goes
// on serving.
func TestAnswersAreBounded(t *testing.T) {
	_, addr := startNode(t, nil)
	c, _ := connect(t, []string{addr}, 5*time.Second)
	acl := zk.WorldACL(zk.PermAll)
	if _, err := c.Create("/big", make([]byte, 64<<10), 0, acl); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create("/many", nil, 0, acl); err != nil {
		t.Fatal(err)
	}
	name := make([]byte, 3000)
	for i := range name {
		name[i] = 'n'
	}
	for b := 0; b < 4; b++ {
		var ops []any
		for i := 0; i < 100; i++ {
			ops = append(ops, &zk.CreateRequest{Path: "/many/" + string(name) + string(rune('a'+b)) + string(rune('a'+i%26)) + string(rune('a'+i/26)), Acl: acl})
		}
		if _, err := c.Multi(ops...); err != nil {
			t.Fatal(err)
		}
	}

	mr := jute{}
	for i := 0; i < 100; i++ {
		mr = mr.int(opGetDataRaw).bool(false).int(-1).str("/big").bool(false)
	}
	mr = mr.int(-1).bool(true).int(-1)
	for _, req := range []struct {
		name string
		op   int32
		body jute
	}{
		{"multiRead", opMultiReadRaw, mr},
		{"getChildren", opGetChildrenRaw, jute{}.str("/many").bool(false)},
	} {
		r := raw(t, addr)
		r.connect(t, 0, make([]byte, 16), true)
		if n := r.answerLen(t, 1, req.op, req.body); n >= 0 {
			t.Errorf("%s: an answer of %d bytes was sent", req.name, n)
		}
	}
	if _, _, err := c.Get("/big"); err != nil {
		t.Fatalf("the node stopped serving: %v", err)
	}
}

const (
	opGetDataRaw   = 4
	opMultiReadRaw = 22
)

// answerLen sends one request and returns the length of its answer, or
// -1 when the connection closed instead.
func (r *rawConn) answerLen(t *testing.T, xid, op int32, body []byte) int {
	t.Helper()
	var b []byte
	b = binary.BigEndian.AppendUint32(b, uint32(len(body)+8))
	b = binary.BigEndian.AppendUint32(b, uint32(xid))
	b = binary.BigEndian.AppendUint32(b, uint32(op))
	if _, err := r.nc.Write(append(b, body...)); err != nil {
		return -1
	}
	for {
		_ = r.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		var lenb [4]byte
		if _, err := io.ReadFull(r.nc, lenb[:]); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
				return -1
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("op %d: neither an answer nor a close", op)
			}
			return -1
		}
		pkt := make([]byte, binary.BigEndian.Uint32(lenb[:]))
		if _, err := io.ReadFull(r.nc, pkt); err != nil {
			return -1
		}
		if int32(binary.BigEndian.Uint32(pkt)) == xid {
			return len(pkt)
		}
	}
}

const (
	opAuthRaw       = 100
	xidAuthRaw      = -4
	codeAuthFailRaw = -115
)

func authBody(userPass string) jute { return jute{}.int(0).str("digest").str(userPass) }

// TestAddAuthIdentitiesAreBounded: the identities addAuth gives a
// connection travel in every write it makes (the replicated command
// carries them, for the znodes' ACLs), so they are bounded: a digest
// longer than 1 KiB, or a 17th identity, fails AuthFailed and closes the
// connection, as a failed addAuth does.
func TestAddAuthIdentitiesAreBounded(t *testing.T) {
	_, addr := startNode(t, nil)
	r := raw(t, addr)
	r.connect(t, 0, make([]byte, 16), true)
	long := make([]byte, 64<<10)
	for i := range long {
		long[i] = 'u'
	}
	if code, _ := r.call(t, xidAuthRaw, opAuthRaw, authBody(string(long)+":pw")); code != codeAuthFailRaw {
		t.Errorf("addAuth of a 64 KiB user: code %d, want AuthFailed", code)
	}

	r = raw(t, addr)
	r.connect(t, 0, make([]byte, 16), true)
	for i := 0; i < 16; i++ {
		if code, _ := r.call(t, xidAuthRaw, opAuthRaw, authBody("user"+string(rune('a'+i))+":pw")); code != 0 {
			t.Fatalf("addAuth %d: code %d", i, code)
		}
	}
	if code, _ := r.call(t, xidAuthRaw, opAuthRaw, authBody("one-more:pw")); code != codeAuthFailRaw {
		t.Errorf("the 17th identity: code %d, want AuthFailed", code)
	}
	// The same identity again adds nothing and is accepted.
	r = raw(t, addr)
	r.connect(t, 0, make([]byte, 16), true)
	for i := 0; i < 20; i++ {
		if code, _ := r.call(t, xidAuthRaw, opAuthRaw, authBody("same:pw")); code != 0 {
			t.Fatalf("addAuth of the same identity, %d: code %d", i, code)
		}
	}
}

// TestConnectionsPerAddress: as ZooKeeper's maxClientCnxns, one IP
// address holds at most --zk-max-client-cnxns connections; one more is
// closed at once, and a place freed is taken again.
func TestConnectionsPerAddress(t *testing.T) {
	d, addr := startNode(t, func(c *daemon.Config) { c.ZkMaxClientCnxns = 3 })
	var held []*rawConn
	for i := 0; i < 3; i++ {
		r := raw(t, addr)
		r.connect(t, 0, make([]byte, 16), true)
		held = append(held, r)
	}
	extra := raw(t, addr)
	if !extra.closed(t) {
		t.Fatal("a 4th connection from the same address was kept")
	}
	if n := requestCount(t, d, "zk.connect", "ResourceExhausted"); n < 1 {
		t.Errorf("refused connections counted: %v, want at least 1", n)
	}
	held[0].nc.Close()
	testutil.WaitFor(t, "a freed place", 10*time.Second, func() bool {
		r := raw(t, addr)
		_ = r.nc.SetDeadline(time.Now().Add(2 * time.Second))
		return r.tryConnect() == nil
	})
}

// TestHandshakeIsBounded: a connection that sends nothing, or half a
// packet, is closed once the handshake's time has passed (ZooKeeper's
// sessionless connection timeout), not after the longest session
// timeout.
func TestHandshakeIsBounded(t *testing.T) {
	t.Cleanup(zkapi.SetHandshakeTimeout(500 * time.Millisecond)) // restored after the node stops
	_, addr := startNode(t, func(c *daemon.Config) { c.ZkMaxSessionTimeout = time.Minute })
	silent := raw(t, addr)
	half := raw(t, addr)
	if _, err := half.nc.Write([]byte{0, 0, 0, 44, 0, 0}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*rawConn{silent, half} {
		if !r.closed(t) {
			t.Fatal("a connection without a handshake is still open after 5 s")
		}
	}
}

// tryConnect sends a ConnectRequest and reads a ConnectResponse.
func (r *rawConn) tryConnect() error {
	var b []byte
	b = binary.BigEndian.AppendUint32(b, 0)
	b = binary.BigEndian.AppendUint64(b, 0)
	b = binary.BigEndian.AppendUint32(b, 30000)
	b = binary.BigEndian.AppendUint64(b, 0)
	b = binary.BigEndian.AppendUint32(b, 16)
	b = append(b, make([]byte, 17)...)
	if _, err := r.nc.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...)); err != nil {
		return err
	}
	var lenb [4]byte
	if _, err := io.ReadFull(r.nc, lenb[:]); err != nil {
		return err
	}
	_, err := io.ReadFull(r.nc, make([]byte, binary.BigEndian.Uint32(lenb[:])))
	return err
}

// TestWatchesAreBoundedOnTheNode: besides --zk-max-watches per
// connection, the watches of all connections hold at most
// --zk-max-watch-bytes (each its path and 128 bytes): past it a watching
// read is answered QuotaExceeded on any connection, until watches go. A
// watch on a path longer than any znode's is not kept (it could never
// fire), so a client cannot make the node hold megabyte paths.
func TestWatchesAreBoundedOnTheNode(t *testing.T) {
	_, addr := startNode(t, func(c *daemon.Config) { c.ZkMaxWatchBytes = 64 << 10 })
	a := raw(t, addr)
	a.connect(t, 0, make([]byte, 16), true)
	quota := -1
	for i := 0; i < 1000; i++ {
		code, _ := a.call(t, int32(i+1), opExistsRaw, jute{}.str(fmt.Sprintf("/w%04d", i)).bool(true))
		if code == codeQuotaExceeded {
			quota = i
			break
		}
	}
	if quota < 0 {
		t.Fatal("1000 watches of 134 bytes were kept on a node bounded to 64 KiB")
	}
	b := raw(t, addr)
	b.connect(t, 0, make([]byte, 16), true)
	if code, _ := b.call(t, 1, opExistsRaw, jute{}.str("/b").bool(true)); code != codeQuotaExceeded {
		t.Fatalf("another connection's watch past the node's bound: code %d, want QuotaExceeded", code)
	}
	a.nc.Close()
	testutil.WaitFor(t, "the watches of a closed connection freed", 10*time.Second, func() bool {
		code, _ := b.call(t, 2, opExistsRaw, jute{}.str("/b").bool(true))
		return code == -101 // NoNode: the watch is set
	})

	long := "/" + strings.Repeat("x", 100<<10)
	if code, _ := b.call(t, 3, opExistsRaw, jute{}.str(long).bool(true)); code != -101 {
		t.Fatalf("exists of a 100 KiB path: code %d, want NoNode", code)
	}
	if code, _ := b.call(t, 4, opCheckWatchesRaw, jute{}.str(long).int(3)); code != -121 {
		t.Fatalf("checkWatches of the 100 KiB path: code %d, want NoWatcher (-121): the node keeps it", code)
	}
}

const opCheckWatchesRaw = 17

// TestSlowReadersAreBoundedTogether: the bytes queued to all
// connections together are bounded: a client that sets a watch on
// every change and never reads is disconnected, the slowest first, once
// the connections' queues pass their bound, however far each is from its
// own; the clients that read go on.
func TestSlowReadersAreBoundedTogether(t *testing.T) {
	t.Cleanup(zkapi.SetMaxQueuedTotal(2 << 20)) // restored after the node stops
	_, addr := startNode(t, nil)
	slow := raw(t, addr)
	slow.connect(t, 0, make([]byte, 16), true)
	if code, _ := slow.call(t, 1, opAddWatchRaw, jute{}.str("/").int(1)); code != 0 {
		t.Fatalf("addWatch: code %d", code)
	}
	w, _ := connect(t, []string{addr}, 5*time.Second)
	acl := zk.WorldACL(zk.PermAll)
	name := strings.Repeat("n", 4000)
	if _, err := w.Create("/d", nil, 0, acl); err != nil {
		t.Fatal(err)
	}
	// 32 MiB of events: 8,000 creates of 4 KiB paths, each an event of
	// the recursive watch.
	for b := 0; b < 40; b++ {
		var ops []any
		for i := 0; i < 200; i++ {
			ops = append(ops, &zk.CreateRequest{Path: fmt.Sprintf("/d/%s%03d%03d", name, b, i), Acl: acl})
		}
		if _, err := w.Multi(ops...); err != nil {
			t.Fatalf("multi %d: %v", b, err)
		}
	}
	if _, _, err := w.Get("/d"); err != nil {
		t.Fatalf("the reading client was disconnected: %v", err)
	}
	// Drain what the slow client was sent: it ends with the close.
	_ = slow.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := io.Copy(io.Discard, slow.nc)
	if err != nil {
		t.Fatalf("the slow client was not disconnected (read %d bytes, then %v)", n, err)
	}
	if n >= 30<<20 {
		t.Fatalf("the slow client was sent %d bytes before its disconnection", n)
	}
	t.Logf("the slow client read %d bytes, then its connection closed", n)
}

const opAddWatchRaw = 106

// TestPipelinedReadsWait: a client that sends many requests before it
// reads their answers (a pipelining client, or one that reads slowly) is
// not read further while its answers wait to be written, instead of
// growing its queue: 200 reads of a 512 KiB znode (100 MiB of answers)
// are all answered, to a client that starts reading once it has sent
// them all.
func TestPipelinedReadsWait(t *testing.T) {
	_, addr := startNode(t, nil)
	c, _ := connect(t, []string{addr}, 5*time.Second)
	if _, err := c.Create("/big", make([]byte, 512<<10), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	r := raw(t, addr)
	r.connect(t, 0, make([]byte, 16), true)
	const n = 200
	sent := make(chan error, 1)
	go func() {
		var b []byte
		body := jute{}.str("/big").bool(false)
		for i := 0; i < n; i++ {
			b = binary.BigEndian.AppendUint32(b, uint32(len(body)+8))
			b = binary.BigEndian.AppendUint32(b, uint32(i+1))
			b = binary.BigEndian.AppendUint32(b, opGetDataRaw)
			b = append(b, body...)
		}
		_, err := r.nc.Write(b)
		sent <- err
	}()
	// The client reads late: a second after it sent its requests (the
	// scenario, not a synchronization: the node answers 200 reads well
	// within it).
	var sendErr error
	done := false
	select {
	case sendErr = <-sent:
		done = true
	case <-time.After(time.Second):
	}
	time.Sleep(time.Second)
	for i := 0; i < n; i++ {
		_ = r.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		var lenb [4]byte
		if _, err := io.ReadFull(r.nc, lenb[:]); err != nil {
			t.Fatalf("answer %d of %d: %v", i+1, n, err)
		}
		if _, err := io.ReadFull(r.nc, make([]byte, binary.BigEndian.Uint32(lenb[:]))); err != nil {
			t.Fatalf("answer %d of %d: %v", i+1, n, err)
		}
	}
	if !done {
		sendErr = <-sent
	}
	if sendErr != nil {
		t.Fatal(sendErr)
	}
}

// TestSessionsPerAddress: a session outlives its connection by its
// timeout, so a client that connects again and again could fill the
// cluster's --max-sessions (shared with Tenure's own clients) from one
// address, anonymous under --auth too. The live sessions created by one
// address are bounded (10 × --zk-max-client-cnxns): past it a connection
// asking for a new session is closed, as ZooKeeper closes one past
// maxClientCnxns; resuming a session is not refused, and a session's end
// makes room.
func TestSessionsPerAddress(t *testing.T) {
	d, addr := startNode(t, func(c *daemon.Config) { c.ZkMaxClientCnxns = 2 })
	var first rawConnectResponse
	for i := 0; i < 20; i++ {
		r := raw(t, addr)
		resp := r.connect(t, 0, make([]byte, 16), true)
		if resp.sessionID == 0 {
			t.Fatalf("session %d refused", i+1)
		}
		if i == 0 {
			first = resp
		}
		r.nc.Close()
		waitConnections(t, addr, 0) // its place is free again
	}
	r := raw(t, addr)
	_ = r.nc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := r.tryConnect(); err == nil {
		t.Fatal("a 21st live session was created from one address")
	}
	waitConnections(t, addr, 0)
	if n := requestCount(t, d, "zk.connect", "ResourceExhausted"); n < 1 {
		t.Errorf("refused sessions counted: %v, want at least 1", n)
	}
	// Resuming is not refused; closing the session makes room.
	waitConnections(t, addr, 0)
	r = raw(t, addr)
	if resp := r.connect(t, first.sessionID, first.passwd, true); resp.sessionID != first.sessionID {
		t.Fatalf("resuming a session: %+v", resp)
	}
	if code, _ := r.call(t, 1, -11, nil); code != 0 {
		t.Fatalf("closeSession: %d", code)
	}
	testutil.WaitFor(t, "room for a new session", 10*time.Second, func() bool {
		r := raw(t, addr)
		_ = r.nc.SetDeadline(time.Now().Add(2 * time.Second))
		return r.tryConnect() == nil
	})
}

// TestMembersAreNotBoundedPerAddress: a follower relays each of its
// clients' connections to the leader from its own address, so the
// members' addresses are exempt from --zk-max-client-cnxns and the
// sessions' bound: three clients of a follower, with a bound of one
// connection per address, all write through it.
func TestMembersAreNotBoundedPerAddress(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster")
	}
	cl := startZkCluster(t, func(_ string, cfg *daemon.Config) {
		cfg.ZkListen, cfg.ZkMaxClientCnxns = "127.0.0.1:0", 1
	})
	daemons, follower := cl.daemons, cl.followers[0]
	for i := 0; i < 3; i++ {
		c, _ := connect(t, []string{daemons[follower].ZkAddr()}, 10*time.Second)
		if _, err := c.Create(fmt.Sprintf("/c%d", i), nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatalf("client %d through the follower: %v", i, err)
		}
	}
}

// TestRecursiveWatchesTellOnlyWhatTheClientMayRead: a persistent
// recursive watch on a znode the client may read is not told of the
// descendants it may not read (their path would leak: ZooKeeper's
// CVE-2024-23944): neither those whose own ACL refuses the client, nor,
// under --auth, those its token's policies deny.
func TestRecursiveWatchesTellOnlyWhatTheClientMayRead(t *testing.T) {
	check := func(t *testing.T, owner *zk.Conn, watcher *rawConn, secretACL []zk.ACL) {
		t.Helper()
		open := zk.WorldACL(zk.PermAll)
		if _, err := owner.Create("/app", nil, 0, open); err != nil {
			t.Fatal(err)
		}
		if code, _ := watcher.call(t, 1, opAddWatchRaw, jute{}.str("/app").int(1)); code != 0 {
			t.Fatalf("addWatch: code %d", code)
		}
		if _, err := owner.Create("/app/secret", []byte("s"), 0, secretACL); err != nil {
			t.Fatal(err)
		}
		if _, err := owner.Set("/app/secret", []byte("t"), -1); err != nil {
			t.Fatal(err)
		}
		if _, err := owner.Create("/app/open", nil, 0, open); err != nil {
			t.Fatal(err)
		}
		if p, ok := watcher.event(t, 5*time.Second); !ok || p != "/app/open" {
			t.Fatalf("the first event told: %q (%v), want /app/open", p, ok)
		}
	}
	t.Run("znode ACL", func(t *testing.T) {
		_, addr := startNode(t, nil)
		owner, _ := connect(t, []string{addr}, 5*time.Second)
		if err := owner.AddAuth("digest", []byte("alice:pw")); err != nil {
			t.Fatal(err)
		}
		watcher := raw(t, addr)
		watcher.connect(t, 0, make([]byte, 16), true)
		check(t, owner, watcher, zk.DigestACL(zk.PermAll, "alice", "pw"))
	})
	t.Run("policies", func(t *testing.T) {
		d, addr := startNode(t, func(c *daemon.Config) { c.Auth = true })
		tok, mgmt := aclToken(t, d.Addr(), "kv:zk/:write")
		ro := readToken(t, d.Addr(), mgmt, "kv:zk/app:read", "kv:zk/app/secret:deny")
		owner, _ := connect(t, []string{addr}, 5*time.Second)
		if err := owner.AddAuth("digest", []byte(tok.GetId()+":"+tok.GetSecret())); err != nil {
			t.Fatal(err)
		}
		watcher := raw(t, addr)
		watcher.connect(t, 0, make([]byte, 16), true)
		if code, _ := watcher.call(t, xidAuthRaw, opAuthRaw, authBody(ro.GetId()+":"+ro.GetSecret())); code != 0 {
			t.Fatalf("addAuth: code %d", code)
		}
		check(t, owner, watcher, zk.WorldACL(zk.PermAll))
	})
}

// readToken creates a token of a new policy holding rules, with the
// management context of aclToken.
func readToken(t *testing.T, addr string, mgmt context.Context, rules ...string) *tpb.AclTokenSecret {
	t.Helper()
	api := testutil.API(t, addr)
	p := &tpb.AclPolicy{Name: "zk-ro"}
	for _, r := range rules {
		rule, err := fsm.ParseRule(r)
		if err != nil {
			t.Fatal(err)
		}
		p.Rules = append(p.Rules, &tpb.AclRule{Kind: string(rule.Kind), Prefix: rule.Prefix, Access: rule.Access.String()})
	}
	if _, err := api.AclPolicyCreate(mgmt, &tpb.AclPolicyCreateRequest{Policy: p}); err != nil {
		t.Fatal(err)
	}
	tok, err := api.AclTokenCreate(mgmt, &tpb.AclTokenCreateRequest{Policies: []string{"zk-ro"}})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestFourLetterWordsUnderAuth: a four-letter word carries no
// credential, so under --auth srvr (the zxid, the znode count, the
// connections) is refused as a word off ZooKeeper's whitelist; ruok and
// isro, liveness alone, are answered.
func TestFourLetterWordsUnderAuth(t *testing.T) {
	_, addr := startNode(t, func(c *daemon.Config) { c.Auth = true })
	for cmd, want := range map[string]string{"ruok": "imok", "isro": "rw", "srvr": "srvr is not executed because it is not in the whitelist."} {
		r := raw(t, addr)
		if _, err := r.nc.Write([]byte(cmd)); err != nil {
			t.Fatal(err)
		}
		_ = r.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		got, _ := io.ReadAll(r.nc)
		if !strings.Contains(string(got), want) {
			t.Errorf("%s under --auth: %q, want it to contain %q", cmd, got, want)
		}
	}
}

// waitConnections waits until the node holds n ZooKeeper connections
// besides the one asking (srvr's count).
func waitConnections(t *testing.T, addr string, n int) {
	t.Helper()
	want := fmt.Sprintf("Connections: %d\n", n+1)
	testutil.WaitFor(t, want, 10*time.Second, func() bool {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			return false
		}
		defer nc.Close()
		_ = nc.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := nc.Write([]byte("srvr")); err != nil {
			return false
		}
		got, _ := io.ReadAll(nc)
		return strings.Contains(string(got), want)
	})
}
