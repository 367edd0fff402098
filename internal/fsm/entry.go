package fsm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"google.golang.org/protobuf/proto"

	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

// Log entry format
//
// Every command entry this version writes is framed:
//
//	byte 0     entryMagic (0x07)
//	bytes 1-4  CRC-32C (Castagnoli) of the payload, little endian
//	bytes 5-   the payload: the fsmpb.Command, protobuf-encoded
//
// Entries written before the frame existed are the bare protobuf encoding,
// and they are still read. The two cannot be confused: a protobuf message
// starts with a field tag, whose low three bits are the wire type (0 to 5)
// and whose field number is at least 1, so no encoding of a Command starts
// with 0x07 (field 0, wire type 7). Neither does one that differs from
// 0x07 in a single bit: each of those has field number 0 or wire type 7
// too, so a damaged marker does not turn a framed entry into a bare one
// that decodes.

// entryMagic is the first byte of a framed entry.
const entryMagic = 0x07

// entryHeaderLen is the frame's length before the payload.
const entryHeaderLen = 5

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

// EncodeEntry returns the framed encoding of cmd, the bytes a proposer
// hands to raft. sizeHint, if it is the command's encoded size or more,
// saves a reallocation.
func EncodeEntry(cmd *fsmpb.Command, sizeHint int) ([]byte, error) {
	buf := make([]byte, entryHeaderLen, entryHeaderLen+sizeHint)
	buf, err := proto.MarshalOptions{}.MarshalAppend(buf, cmd)
	if err != nil {
		return nil, err
	}
	buf[0] = entryMagic
	binary.LittleEndian.PutUint32(buf[1:entryHeaderLen], crc32.Checksum(buf[entryHeaderLen:], castagnoli))
	return buf, nil
}

// Framed reports whether data is in the framed format (whether or not its
// checksum holds).
func Framed(data []byte) bool { return len(data) > 0 && data[0] == entryMagic }

// CheckEntry verifies a framed entry's checksum without decoding it. A
// bare (older) entry cannot be checked without decoding: CheckEntry
// accepts it.
func CheckEntry(data []byte) error {
	if !Framed(data) {
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
// error says what is wrong (for a CorruptEntryError's Reason).
func DecodeEntry(data []byte, cmd *fsmpb.Command) error {
	if err := CheckEntry(data); err != nil {
		return err
	}
	payload := data
	if Framed(data) {
		payload = data[entryHeaderLen:]
	}
	if err := proto.Unmarshal(payload, cmd); err != nil {
		return fmt.Errorf("does not decode (%v)", err)
	}
	return nil
}
