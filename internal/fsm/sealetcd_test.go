package fsm_test

import (
	"bytes"
	"crypto/sha256"
	"testing"

	"github.com/tenure-io/tenure/internal/fsm"
)

// frame is what etcd's Maintenance.Snapshot streams for a sealed file.
func frame(sealed []byte) []byte {
	out := append(bytes.Clone(sealed), make([]byte, fsm.EtcdFramePadding(len(sealed)))...)
	sum := sha256.Sum256(out)
	return append(out, sum[:]...)
}

// TestEtcdFramedSnapshotOpens: a sealed snapshot in etcd's frame (zero
// padding to 512 bytes, then the SHA-256) opens as the sealed snapshot,
// whatever its length (padding of 0 to 511 bytes); a frame that is cut,
// changed, or pads with anything but zeros is refused.
func TestEtcdFramedSnapshotOpens(t *testing.T) {
	for n := 440; n < 1500; n += 7 { // 454: a seal of 512 bytes, no padding
		state := bytes.Repeat([]byte{7}, n)
		sealed, err := fsm.SealSnapshot([]byte("cluster"), state)
		if err != nil {
			t.Fatal(err)
		}
		f := frame(sealed)
		if len(f)%512 != 32 {
			t.Fatalf("frame of %d bytes", len(f))
		}
		id, got, err := fsm.OpenSnapshot(f)
		if err != nil || string(id) != "cluster" || !bytes.Equal(got, state) {
			t.Fatalf("state of %d bytes: %v", n, err)
		}
		if _, _, err := fsm.OpenSnapshot(f[:len(f)-1]); err == nil {
			t.Fatal("a cut frame opened")
		}
		changed := bytes.Clone(f)
		changed[len(sealed)/2] ^= 1
		if _, _, err := fsm.OpenSnapshot(changed); err == nil {
			t.Fatal("a changed frame opened")
		}
		if pad := fsm.EtcdFramePadding(len(sealed)); pad > 0 {
			dirty := append(bytes.Clone(sealed), bytes.Repeat([]byte{1}, pad)...)
			sum := sha256.Sum256(dirty)
			if _, _, err := fsm.OpenSnapshot(append(dirty, sum[:]...)); err == nil {
				t.Fatal("a frame padded with ones opened")
			}
		}
	}
}
