package httpguard

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Header names of the wire contract.
const (
	// HeaderToken carries the fencing token, decimal.
	HeaderToken = "Tenure-Fence-Token"
	// HeaderKey carries the resource key the token is for.
	HeaderKey = "Tenure-Resource-Key"
	// HeaderOperation carries the optional operation id.
	HeaderOperation = "Tenure-Operation-Id"
	// HeaderResult is set to "stale" on a 409 written by this package, so
	// that a client can tell a fence rejection from other conflicts.
	HeaderResult = "Tenure-Fence-Result"
	// HeaderAcceptedToken is set on a 409 to the resource's accepted token
	// when it is known.
	HeaderAcceptedToken = "Tenure-Accepted-Token"
	// HeaderProof carries the grant's fence proof (client.Hold.Proof),
	// which a Guard with a Verifier requires.
	HeaderProof = "Tenure-Fence-Proof"
)

// Limits on header values.
const (
	MaxKeyLen         = 256
	MaxOperationIDLen = 256
	// MaxProofLen bounds the proof header (a proof is 119 bytes).
	MaxProofLen = 512
	// MaxToken is the largest token accepted: tokens are stored as signed
	// 64-bit integers by the PostgreSQL store.
	MaxToken = math.MaxInt64
)

// Fence is what a fenced request claims: the resource, the sender's token
// for it, and optionally the business operation.
type Fence struct {
	// Key is the fenced resource (Tenure-Resource-Key).
	Key string
	// Token is the sender's fencing token (Tenure-Fence-Token).
	Token uint64
	// OperationID is the business operation (Tenure-Operation-Id), or "".
	OperationID string
	// Proof is the grant's fence proof (Tenure-Fence-Proof), or "".
	Proof string
}

// HeaderError says which header of a request is missing or invalid.
type HeaderError struct {
	Header string
	Reason string
}

func (e *HeaderError) Error() string {
	return fmt.Sprintf("httpguard: %s header %s", e.Header, e.Reason)
}

// ParseHeaders reads and validates a Fence from request headers. The error,
// if any, is a *HeaderError.
func ParseHeaders(h http.Header) (Fence, error) {
	var f Fence
	for _, name := range []string{HeaderToken, HeaderKey, HeaderOperation, HeaderProof} {
		if len(h.Values(name)) > 1 {
			return f, &HeaderError{name, "is repeated"}
		}
	}
	tok, ok := single(h, HeaderToken)
	switch {
	case !ok:
		return f, &HeaderError{HeaderToken, "is missing"}
	case tok == "":
		return f, &HeaderError{HeaderToken, "is empty"}
	}
	n, err := strconv.ParseUint(tok, 10, 64)
	if err != nil || n == 0 || n > MaxToken {
		return f, &HeaderError{HeaderToken, fmt.Sprintf("is %q: want a decimal integer in 1..%d", truncate(tok), uint64(MaxToken))}
	}
	f.Token = n
	key, ok := single(h, HeaderKey)
	switch {
	case !ok:
		return f, &HeaderError{HeaderKey, "is missing"}
	case key == "":
		return f, &HeaderError{HeaderKey, "is empty"}
	case len(key) > MaxKeyLen:
		return f, &HeaderError{HeaderKey, fmt.Sprintf("is %d bytes, the limit is %d", len(key), MaxKeyLen)}
	case !printable(key):
		return f, &HeaderError{HeaderKey, "must be printable UTF-8 without control characters"}
	}
	f.Key = key
	if op, ok := single(h, HeaderOperation); ok {
		switch {
		case op == "":
			return f, &HeaderError{HeaderOperation, "is empty (omit the header instead)"}
		case len(op) > MaxOperationIDLen:
			return f, &HeaderError{HeaderOperation, fmt.Sprintf("is %d bytes, the limit is %d", len(op), MaxOperationIDLen)}
		case !printable(op):
			return f, &HeaderError{HeaderOperation, "must be printable UTF-8 without control characters"}
		}
		f.OperationID = op
	}
	if p, ok := single(h, HeaderProof); ok {
		if len(p) > MaxProofLen || !printable(p) {
			return f, &HeaderError{HeaderProof, fmt.Sprintf("must be at most %d printable bytes", MaxProofLen)}
		}
		f.Proof = p
	}
	return f, nil
}

// single returns the header's value (the caller has ruled out repeats).
func single(h http.Header, name string) (string, bool) {
	vs := h.Values(name)
	if len(vs) == 0 {
		return "", false
	}
	return strings.TrimSpace(vs[0]), true
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

func truncate(s string) string {
	if len(s) > 32 {
		return s[:32] + "..."
	}
	return s
}

// SetHeaders writes f into h (replacing earlier values). An empty
// OperationID or Proof removes its header.
func (f Fence) SetHeaders(h http.Header) {
	h.Set(HeaderToken, strconv.FormatUint(f.Token, 10))
	h.Set(HeaderKey, f.Key)
	if f.OperationID != "" {
		h.Set(HeaderOperation, f.OperationID)
	} else {
		h.Del(HeaderOperation)
	}
	if f.Proof != "" {
		h.Set(HeaderProof, f.Proof)
	} else {
		h.Del(HeaderProof)
	}
}

type fenceKey struct{}

// NewContext returns ctx carrying f.
func NewContext(ctx context.Context, f Fence) context.Context {
	return context.WithValue(ctx, fenceKey{}, f)
}

// FromContext returns the Fence the middleware parsed for this request.
// It is present in every request the middleware passes to the handler.
func FromContext(ctx context.Context) (Fence, bool) {
	f, ok := ctx.Value(fenceKey{}).(Fence)
	return f, ok
}
