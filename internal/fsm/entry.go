package fsm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
	"github.com/tenure-io/tenure/internal/version"
)

// Log entry format
//
// Every command entry this version writes is framed, in one of two
// frames. While the cluster version (version.go) is 1, the frame every
// release has read:
//
//	byte 0     entryMagic (0x07)
//	bytes 1-4  CRC-32C (Castagnoli) of the payload, little endian
//	bytes 5-   the payload: the fsmpb.Command, protobuf-encoded
//
// From cluster version 2 on, the versioned frame:
//
//	byte 0     entryMagicVersioned (0x06)
//	byte 1     the entry's format version (2..255)
//	bytes 2-5  CRC-32C of byte 1 and the payload, little endian
//	bytes 6-   the payload
//
// A release that predates the versioned frame reads it as a bare entry
// that does not decode, and stops; it never applies it.
//
// Entries written before the frame existed are the bare protobuf encoding,
// and they are still read; they and the first frame are format version 1.
// The frames and a bare entry cannot be confused: a protobuf message
// starts with a field tag, whose low three bits are the wire type (0 to 5)
// and whose field number is at least 1, so no encoding of a Command starts
// with 0x07 (field 0, wire type 7) or 0x06 (field 0, wire type 6). Neither
// does one that differs from either in a single bit: each of those has
// field number 0 or wire type 6 or 7 too, so a damaged marker does not
// turn a framed entry into a bare one that decodes (and a marker damaged
// into the other frame's fails that frame's checksum).

// entryMagic is the first byte of a framed entry of format version 1.
const entryMagic = 0x07

// entryHeaderLen is the frame's length before the payload.
const entryHeaderLen = 5

// entryMagicVersioned is the first byte of a versioned frame.
const entryMagicVersioned = 0x06

// versionedHeaderLen is the versioned frame's length before the payload.
const versionedHeaderLen = 6

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrCorrupt: a log entry or snapshot failed its checksum or did not
// decode. It is never applied: the state machine stops (see FSM.Err).
var ErrCorrupt = errors.New("tenure: corrupt data")

// CorruptEntryError says which log entry is corrupt and why. It wraps
// ErrCorrupt.
type CorruptEntryError struct {
	Index  uint64
	Reason string
}

func (e *CorruptEntryError) Error() string {
	return fmt.Sprintf("log entry %d %s", e.Index, e.Reason)
}

// Unwrap returns ErrCorrupt.
func (e *CorruptEntryError) Unwrap() error { return ErrCorrupt }

// EncodeEntry returns the framed encoding of cmd in format version 1, the
// bytes a proposer hands to raft. sizeHint, if it is the command's encoded
// size or more, saves a reallocation.
func EncodeEntry(cmd *fsmpb.Command, sizeHint int) ([]byte, error) {
	return EncodeEntryVersion(cmd, 1, sizeHint)
}

// EncodeEntryVersion is EncodeEntry in format version v: the first frame
// for version 1, the versioned frame from 2 on. The proposer passes
// EntryVersion(cmd, the cluster version): never a version above the
// cluster version, except the SetClusterVersion that raises it.
func EncodeEntryVersion(cmd *fsmpb.Command, v uint32, sizeHint int) ([]byte, error) {
	if v < 1 || v > 255 {
		return nil, fmt.Errorf("fsm: no entry format version %d", v)
	}
	head := entryHeaderLen
	if v > 1 {
		head = versionedHeaderLen
	}
	buf := make([]byte, head, head+sizeHint)
	buf, err := proto.MarshalOptions{}.MarshalAppend(buf, PackKeys(cmd))
	if err != nil {
		return nil, err
	}
	if v == 1 {
		buf[0] = entryMagic
		binary.LittleEndian.PutUint32(buf[1:entryHeaderLen], crc32.Checksum(buf[entryHeaderLen:], castagnoli))
		return buf, nil
	}
	buf[0], buf[1] = entryMagicVersioned, byte(v)
	binary.LittleEndian.PutUint32(buf[2:versionedHeaderLen], versionedCRC(buf))
	return buf, nil
}

// versionedCRC is the checksum of a versioned frame: of its version byte
// and its payload.
func versionedCRC(data []byte) uint32 {
	return crc32.Update(crc32.Checksum(data[1:2], castagnoli), castagnoli, data[versionedHeaderLen:])
}

// Framed reports whether data is in either framed format (whether or not
// its checksum holds).
func Framed(data []byte) bool {
	return len(data) > 0 && (data[0] == entryMagic || data[0] == entryMagicVersioned)
}

// EntryVersion reports the format version of a log entry's data: 1 for a
// bare entry and the first frame, the recorded one for a versioned frame
// (0 for one cut short). It does not check the checksum.
func EntryVersion(data []byte) uint32 {
	if len(data) == 0 || data[0] != entryMagicVersioned {
		return 1
	}
	if len(data) < 2 {
		return 0
	}
	return uint32(data[1])
}

// CheckEntry verifies a framed entry's checksum without decoding it. A
// bare (older) entry cannot be checked without decoding: CheckEntry
// accepts it.
func CheckEntry(data []byte) error {
	switch {
	case !Framed(data):
		return nil
	case data[0] == entryMagicVersioned:
		if len(data) < versionedHeaderLen {
			return fmt.Errorf("is cut short (%d bytes)", len(data))
		}
		if want, got := binary.LittleEndian.Uint32(data[2:versionedHeaderLen]), versionedCRC(data); want != got {
			return fmt.Errorf("fails its checksum (crc32c %08x, recorded %08x)", got, want)
		}
		if data[1] < 2 {
			return fmt.Errorf("names format version %d in a versioned frame", data[1])
		}
		return nil
	}
	if len(data) < entryHeaderLen {
		return fmt.Errorf("is cut short (%d bytes)", len(data))
	}
	if want, got := binary.LittleEndian.Uint32(data[1:entryHeaderLen]), crc32.Checksum(data[entryHeaderLen:], castagnoli); want != got {
		return fmt.Errorf("fails its checksum (crc32c %08x, recorded %08x)", got, want)
	}
	return nil
}

// DecodeEntry decodes a log entry's data, framed or bare, into cmd. Its
// error says what is wrong (for a CorruptEntryError's Reason). An entry of
// a newer format version than this build speaks is not decoded: the error
// is a *FormatError.
func DecodeEntry(data []byte, cmd *fsmpb.Command) error {
	if err := CheckEntry(data); err != nil {
		return err
	}
	payload := data
	switch {
	case len(data) > 0 && data[0] == entryMagicVersioned:
		if v := EntryVersion(data); v > version.Protocol {
			return &FormatError{What: "log entry", Version: v}
		}
		payload = data[versionedHeaderLen:]
	case Framed(data):
		payload = data[entryHeaderLen:]
	}
	if err := proto.Unmarshal(payload, cmd); err != nil {
		return fmt.Errorf("does not decode (%v)", err)
	}
	return nil
}
