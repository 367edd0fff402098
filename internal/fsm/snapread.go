package fsm

import (
	"io"
	"slices"
)

// readChunk bounds what appendRead allocates ahead of the bytes it has
// read.
const readChunk = 1 << 20

// appendRead appends the next n bytes of r to b. It grows b as the bytes
// arrive, a chunk at a time, so that a length that corrupt or hostile
// bytes merely claim (a snapshot field of 16 GiB in an 11-byte file)
// allocates no more than what r really holds plus a chunk. A short read is
// io.ErrUnexpectedEOF (or r's error).
func appendRead(b []byte, r io.Reader, n uint64) ([]byte, error) {
	for n > 0 {
		c := int(min(n, readChunk))
		start := len(b)
		b = slices.Grow(b, c)[:start+c]
		if _, err := io.ReadFull(r, b[start:]); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return b[:start], err
		}
		n -= uint64(c)
	}
	return b, nil
}
