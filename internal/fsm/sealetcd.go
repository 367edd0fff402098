package fsm

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
)

// Snapshots saved through etcd's API
//
// etcd's clients (clientv3's snapshot.Save, `etcdctl snapshot save`)
// accept a snapshot stream only if it ends in the SHA-256 of what came
// before it, on a size that is 32 bytes past a multiple of 512 (etcd's
// bolt file is made of whole pages). So etcd's Maintenance.Snapshot
// streams a sealed snapshot in an etcd frame:
//
//	sealed snapshot  the file `tenure snapshot save` writes
//	padding          zero bytes, up to a multiple of EtcdFrameBlock
//	checksum         32 bytes  SHA-256 of every byte before it
//
// OpenSnapshot takes the sealed snapshot out of a whole frame, so that
// `tenure snapshot restore` restores a file `etcdctl snapshot save` wrote;
// a frame that is cut or changed is left as it is, and the seal's checks
// refuse it.

// EtcdFrameBlock is the block size etcd's clients check a snapshot's
// size against.
const EtcdFrameBlock = 512

// EtcdFramePadding is the padding that follows a sealed snapshot of n
// bytes in its etcd frame.
func EtcdFramePadding(n int) int {
	return (EtcdFrameBlock - n%EtcdFrameBlock) % EtcdFrameBlock
}

// unframeEtcd returns the sealed snapshot of a whole etcd frame, or data
// itself when data is not one.
func unframeEtcd(data []byte) []byte {
	if len(data)%EtcdFrameBlock != sha256.Size || len(data) < EtcdFrameBlock+sha256.Size {
		return data
	}
	body := data[:len(data)-sha256.Size]
	if sum := sha256.Sum256(body); !bytes.Equal(sum[:], data[len(body):]) {
		return data
	}
	n, ok := sealedLen(body)
	if !ok || n > len(body) || len(body)-n != EtcdFramePadding(n) || len(bytes.Trim(body[n:], "\x00")) != 0 {
		return data
	}
	return body[:n]
}

// sealedLen reads the length of the sealed snapshot that starts data
// from its header.
func sealedLen(data []byte) (int, bool) {
	if !bytes.HasPrefix(data, []byte(SnapshotMagic)) {
		return 0, false
	}
	rest := data[len(SnapshotMagic):]
	if len(rest) < 3 {
		return 0, false
	}
	idLen := int(rest[2])
	rest = rest[3:]
	if idLen > maxSealedClusterID || len(rest) < idLen+8 {
		return 0, false
	}
	n := binary.BigEndian.Uint64(rest[idLen:])
	head := len(data) - len(rest) + idLen + 8
	if n > uint64(len(data)) {
		return 0, false
	}
	return head + int(n) + sealChecksum, true
}
