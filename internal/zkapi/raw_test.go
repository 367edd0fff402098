package zkapi_test

import (
	"encoding/binary"
	"io"
	"net"
	"reflect"
	"testing"
	"time"
	"unsafe"

	"github.com/go-zookeeper/zk"
)

// rawConn speaks the handshake byte by byte, to check what clients
// parse loosely.
type rawConn struct{ nc net.Conn }

func raw(t *testing.T, addr string) *rawConn {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &rawConn{nc}
}

type rawConnectResponse struct {
	timeout     int32
	sessionID   int64
	passwd      []byte
	hasReadOnly bool
}

// connect sends a ConnectRequest (with the readOnly flag of 3.4+ clients
// or without it) asking for a 30 s timeout, and reads the answer.
func (r *rawConn) connect(t *testing.T, session int64, passwd []byte, readOnly bool) rawConnectResponse {
	t.Helper()
	return r.connectWith(t, 30_000, session, passwd, readOnly)
}

// connectAsking is connect with the session timeout the client asks (ms)
// and the readOnly flag.
func (r *rawConn) connectAsking(t *testing.T, timeout int32, session int64, passwd []byte) rawConnectResponse {
	t.Helper()
	return r.connectWith(t, timeout, session, passwd, true)
}

func (r *rawConn) connectWith(t *testing.T, timeout int32, session int64, passwd []byte, readOnly bool) rawConnectResponse {
	t.Helper()
	var b []byte
	b = binary.BigEndian.AppendUint32(b, 0) // protocol version
	b = binary.BigEndian.AppendUint64(b, 0) // last zxid seen
	b = binary.BigEndian.AppendUint32(b, uint32(timeout))
	b = binary.BigEndian.AppendUint64(b, uint64(session))
	b = binary.BigEndian.AppendUint32(b, uint32(len(passwd)))
	b = append(b, passwd...)
	if readOnly {
		b = append(b, 0)
	}
	pkt := binary.BigEndian.AppendUint32(nil, uint32(len(b)))
	if _, err := r.nc.Write(append(pkt, b...)); err != nil {
		t.Fatal(err)
	}
	_ = r.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	var lenb [4]byte
	if _, err := io.ReadFull(r.nc, lenb[:]); err != nil {
		t.Fatalf("reading the connect response: %v", err)
	}
	resp := make([]byte, binary.BigEndian.Uint32(lenb[:]))
	if _, err := io.ReadFull(r.nc, resp); err != nil {
		t.Fatal(err)
	}
	var out rawConnectResponse
	out.timeout = int32(binary.BigEndian.Uint32(resp[4:]))
	out.sessionID = int64(binary.BigEndian.Uint64(resp[8:]))
	n := binary.BigEndian.Uint32(resp[16:])
	out.passwd = append([]byte(nil), resp[20:20+n]...)
	out.hasReadOnly = len(resp) > int(20+n)
	return out
}

// closed reports whether the server closes the connection (EOF) soon.
func (r *rawConn) closed(t *testing.T) bool {
	_ = r.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := r.nc.Read(make([]byte, 1))
	return err == io.EOF
}

// sessionPassword reads a go-zookeeper connection's session password,
// which it does not export.
func sessionPassword(t *testing.T, c *zk.Conn) []byte {
	f := reflect.ValueOf(c).Elem().FieldByName("passwd")
	if !f.IsValid() {
		t.Fatal("go-zookeeper has no passwd field")
	}
	return append([]byte(nil), reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Bytes()...)
}

// call sends one request on a connected rawConn and reads the answer,
// skipping watch events.
func (r *rawConn) call(t *testing.T, xid, op int32, body []byte) (code int32, resp []byte) {
	t.Helper()
	var b []byte
	b = binary.BigEndian.AppendUint32(b, uint32(len(body)+8))
	b = binary.BigEndian.AppendUint32(b, uint32(xid))
	b = binary.BigEndian.AppendUint32(b, uint32(op))
	if _, err := r.nc.Write(append(b, body...)); err != nil {
		t.Fatal(err)
	}
	for {
		_ = r.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		var lenb [4]byte
		if _, err := io.ReadFull(r.nc, lenb[:]); err != nil {
			t.Fatalf("op %d: %v", op, err)
		}
		pkt := make([]byte, binary.BigEndian.Uint32(lenb[:]))
		if _, err := io.ReadFull(r.nc, pkt); err != nil {
			t.Fatal(err)
		}
		got := int32(binary.BigEndian.Uint32(pkt))
		if got == -1 {
			continue
		}
		if got != xid {
			t.Fatalf("op %d: answer to xid %d, want %d", op, got, xid)
		}
		return int32(binary.BigEndian.Uint32(pkt[12:])), pkt[16:]
	}
}

// jute builds a request body.
type jute []byte

func (j jute) int(v int32) jute { return binary.BigEndian.AppendUint32(j, uint32(v)) }
func (j jute) str(s string) jute {
	return append(j.int(int32(len(s))), s...)
}
func (j jute) bool(v bool) jute {
	if v {
		return append(j, 1)
	}
	return append(j, 0)
}

func (j jute) append8(v int64) jute { return binary.BigEndian.AppendUint64(j, uint64(v)) }
