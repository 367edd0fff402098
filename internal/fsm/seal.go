package fsm

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
)

// Sealed snapshot files
//
// `tenure snapshot save` (the SnapshotSave RPC) hands out the state sealed
// in a small envelope, so that a restore can tell a whole, unchanged file
// of a known cluster from anything else before it reads a field of it:
//
//	magic       8 bytes   "\x89TNRSNP\n"
//	version     2 bytes   big-endian, 1
//	id length   1 byte    0..64
//	cluster id  id length bytes (empty for a cluster without an id yet)
//	length      8 bytes   big-endian, of the state that follows
//	state       length bytes: the fsmpb.Snapshot encoding
//	checksum    32 bytes  SHA-256 of every byte before it
//
// An empty file, a file cut anywhere, one with bytes added, and one with
// any byte changed are refused (ErrSnapshotDamaged); a file that does not
// start with the magic is not a sealed snapshot (ErrNotSealed), which is
// what snapshots saved before the seal existed are. The checksum detects
// damage and edits by anyone who does not also recompute it: it is not a
// signature. A file anyone could write is validated again as a state
// (Import), and a snapshot file holds the cluster's private signing keys,
// so it is kept like a private key (mode 0600).

// SnapshotMagic starts every sealed snapshot file. The high first byte and
// the newline catch transfers that change bytes or line ends.
const SnapshotMagic = "\x89TNRSNP\n"

// SnapshotFormat is the version of the sealed format this build writes
// and reads.
const SnapshotFormat = 1

const (
	maxSealedClusterID = 64
	sealChecksum       = sha256.Size
)

var (
	// ErrNotSealed: a restored file is not a sealed Tenure snapshot (it
	// does not start with SnapshotMagic): not a snapshot, or one saved
	// before snapshots were sealed. It is also ErrInvalid.
	ErrNotSealed = fmt.Errorf("%w: not a sealed Tenure snapshot", ErrInvalid)
	// ErrSnapshotDamaged: a sealed snapshot file is empty, cut short,
	// longer than its header says, or its checksum does not match its
	// content. Nothing was restored. It is also ErrInvalid.
	ErrSnapshotDamaged = fmt.Errorf("%w: damaged snapshot file", ErrInvalid)
)

// SealSnapshot returns the sealed file of state (an encoded
// fsmpb.Snapshot) of the cluster with id clusterID.
func SealSnapshot(clusterID, state []byte) ([]byte, error) {
	if len(clusterID) > maxSealedClusterID {
		return nil, fmt.Errorf("%w: a cluster id of %d bytes (at most %d)", ErrInvalid, len(clusterID), maxSealedClusterID)
	}
	out := make([]byte, 0, len(SnapshotMagic)+2+1+len(clusterID)+8+len(state)+sealChecksum)
	out = append(out, SnapshotMagic...)
	out = binary.BigEndian.AppendUint16(out, SnapshotFormat)
	out = append(out, byte(len(clusterID)))
	out = append(out, clusterID...)
	out = binary.BigEndian.AppendUint64(out, uint64(len(state)))
	out = append(out, state...)
	sum := sha256.Sum256(out)
	return append(out, sum[:]...), nil
}

// OpenSnapshot checks a sealed snapshot file and returns the id of the
// cluster that saved it and its state (sharing data's bytes). It fails
// with ErrNotSealed or ErrSnapshotDamaged, saying what is wrong in one
// line.
func OpenSnapshot(data []byte) (clusterID, state []byte, err error) {
	data = unframeEtcd(data) // a file etcd's clients saved (sealetcd.go)
	damaged := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrSnapshotDamaged, fmt.Sprintf(format, args...))
	}
	switch {
	case len(data) == 0:
		return nil, nil, damaged("the file is empty (0 bytes)")
	case len(data) < len(SnapshotMagic) && bytes.HasPrefix([]byte(SnapshotMagic), data):
		return nil, nil, damaged("truncated: the file is %d bytes, shorter than a header", len(data))
	case !bytes.HasPrefix(data, []byte(SnapshotMagic)):
		return nil, nil, fmt.Errorf("%w (it does not start with the snapshot header; files saved before snapshots were sealed cannot be restored by this version: restore them with the version that saved them and save them again)", ErrNotSealed)
	}
	rest := data[len(SnapshotMagic):]
	if len(rest) < 3 {
		return nil, nil, damaged("truncated: the file is %d bytes, shorter than a header", len(data))
	}
	if v := binary.BigEndian.Uint16(rest); v != SnapshotFormat {
		return nil, nil, damaged("the snapshot format is version %d; this version reads version %d (or the header is damaged)", v, SnapshotFormat)
	}
	idLen := int(rest[2])
	rest = rest[3:]
	if idLen > maxSealedClusterID {
		return nil, nil, damaged("the header's cluster id length %d is over %d", idLen, maxSealedClusterID)
	}
	if len(rest) < idLen+8 {
		return nil, nil, damaged("truncated: the file is %d bytes, shorter than its header", len(data))
	}
	clusterID, rest = rest[:idLen], rest[idLen:]
	n := binary.BigEndian.Uint64(rest)
	rest = rest[8:]
	head := uint64(len(data) - len(rest))
	switch have := uint64(len(rest)); {
	case have < sealChecksum || n > have-sealChecksum:
		return nil, nil, damaged("truncated: the file is %d bytes, its header says %d", len(data), satAdd(head, n, sealChecksum))
	case n < have-sealChecksum:
		return nil, nil, damaged("the file is %d bytes, its header says %d: bytes were added or the header is damaged", len(data), head+n+sealChecksum)
	}
	body := data[:len(data)-sealChecksum]
	sum := sha256.Sum256(body)
	if !bytes.Equal(sum[:], data[len(body):]) {
		return nil, nil, damaged("its SHA-256 checksum does not match its content (bytes were changed)")
	}
	return clusterID, rest[:n], nil
}

// ClusterIDString is how a cluster id is written for people and flags:
// hex, or "none" for a state without one.
func ClusterIDString(id []byte) string {
	if len(id) == 0 {
		return "none"
	}
	return hex.EncodeToString(id)
}

// satAdd adds, saturating at the largest uint64 (a damaged length).
func satAdd(a ...uint64) uint64 {
	var sum uint64
	for _, x := range a {
		if sum+x < sum {
			return ^uint64(0)
		}
		sum += x
	}
	return sum
}
