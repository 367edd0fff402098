package zkapi_test

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-io/tenure/internal/daemon"
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

var _ = errors.Is
var _ = net.Dial
var _ = os.Getenv

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
