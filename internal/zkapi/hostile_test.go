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
