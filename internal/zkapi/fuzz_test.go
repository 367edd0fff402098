package zkapi

import (
	"bytes"
	"testing"
)

// FuzzDecode: no packet makes the decoders panic or read past the
// packet, and a ConnectRequest that decodes encodes back to its bytes.
func FuzzDecode(f *testing.F) {
	f.Add(connectRequest{timeout: 30000, passwd: make([]byte, 16), hasReadOnly: true}.encode())
	f.Add(connectRequest{sessionID: 7, passwd: []byte("x")}.encode())
	var e encoder
	e.int(1)
	e.int(opMulti)
	e.int(opCreate)
	e.bool(false)
	e.int(-1)
	e.string("/a")
	e.buffer([]byte("d"))
	e.acls([]acl{{perms: 31, scheme: "world", id: "anyone"}})
	e.int(0)
	e.int(-1)
	e.bool(true)
	e.int(-1)
	f.Add(e.b)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		if c, err := decodeConnect(b); err == nil {
			again, err := decodeConnect(c.encode())
			if err != nil || again.sessionID != c.sessionID || again.timeout != c.timeout || !bytes.Equal(again.passwd, c.passwd) || again.hasReadOnly != c.hasReadOnly || again.readOnly != c.readOnly {
				t.Fatalf("connect request %+v re-decodes as %+v, %v", c, again, err)
			}
		}
		d := decoder{b: b}
		h := requestHeader{xid: d.int(), op: d.int()}
		_ = h
		for i := 0; i < 64 && d.err == nil; i++ {
			typ, done := d.int(), d.bool()
			_ = d.int()
			if done {
				break
			}
			_, _ = decodeWrite(typ, &d)
			_ = d.stat()
			_ = d.strings()
		}
		if len(d.b) > len(b) {
			t.Fatal("the decoder grew its input")
		}
	})
}
