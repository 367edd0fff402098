package httpguard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/fenceproof"
)

// Hold is the part of *client.Hold that Transport uses. A Hold that also
// has a Proof() string method (as *client.Hold does) has its fence proof
// sent as well (HeaderProof).
type Hold interface {
	Token() uint64
	State() client.State
	Context() context.Context
}

// errHoldEnded is the cancellation cause of a request whose hold stopped
// being Held while it was in flight.
var errHoldEnded = errors.New("httpguard: hold stopped being held; request cancelled")

// Transport is an http.RoundTripper that sends every request fenced with a
// hold's token for one resource key. It is safe for concurrent use.
//
// Before sending, RoundTrip checks that the hold is Held; otherwise it
// sends nothing and returns an error matching client.ErrNotHeld, so an
// owner that is suspect or lost does not even try. A request in flight
// when the hold stops being Held is cancelled. Neither closes the race
// with a pause between the check and the send: the receiving side's check
// of the token (Guard) is the protection, this only saves work.
//
// An operation id already set on the request (HeaderOperation, see
// WithOperationID) is kept.
type Transport struct {
	base http.RoundTripper
	hold Hold
	key  string
}

// NewTransport returns a Transport sending through base (nil means
// http.DefaultTransport) with hold's token for resource key.
func NewTransport(base http.RoundTripper, hold Hold, key string) (*Transport, error) {
	if hold == nil {
		return nil, errors.New("httpguard: nil hold")
	}
	if key == "" || len(key) > MaxKeyLen || !printable(key) {
		return nil, fmt.Errorf("httpguard: resource key must be 1..%d printable bytes", MaxKeyLen)
	}
	if t := hold.Token(); t == 0 || t > MaxToken {
		return nil, fmt.Errorf("httpguard: token %d outside 1..%d", t, uint64(MaxToken))
	}
	if base == nil {
		base = http.DefaultTransport
	}
	return &Transport{base: base, hold: hold, key: key}, nil
}

// WithOperationID sets the operation id header on req.
func WithOperationID(req *http.Request, id string) {
	req.Header.Set(HeaderOperation, id)
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	hctx := t.hold.Context()
	if st := t.hold.State(); st != client.Held || hctx.Err() != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, fmt.Errorf("httpguard: %w: hold is %v; request to %s not sent", client.ErrNotHeld, st, req.URL.Redacted())
	}
	ctx, cancel := context.WithCancelCause(req.Context())
	stop := context.AfterFunc(hctx, func() { cancel(errHoldEnded) })
	done := func() {
		stop()
		cancel(nil)
	}
	out := req.Clone(ctx)
	if out.Header == nil {
		out.Header = make(http.Header)
	}
	out.Header.Set(HeaderToken, strconv.FormatUint(t.hold.Token(), 10))
	out.Header.Set(HeaderKey, t.key)
	if p, ok := t.hold.(interface{ Proof() string }); ok && p.Proof() != "" {
		out.Header.Set(HeaderProof, p.Proof())
	}
	resp, err := t.base.RoundTrip(out)
	if err != nil {
		done()
		if context.Cause(ctx) == errHoldEnded {
			err = fmt.Errorf("%w: %w", errHoldEnded, err)
		}
		return nil, err
	}
	resp.Body = &releasingBody{ReadCloser: resp.Body, release: done}
	return resp, nil
}

// releasingBody releases the request's context when the body is closed.
type releasingBody struct {
	io.ReadCloser
	once    sync.Once
	release func()
}

func (b *releasingBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.release)
	return err
}

// StaleError is returned by CheckResponse for a request the receiving side
// rejected as stale. It matches client.ErrStale.
type StaleError struct {
	Key string
	// Token is the request's token.
	Token uint64
	// AcceptedToken is the resource's accepted token (0 if not reported).
	AcceptedToken uint64
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("httpguard: stale fence token %d for %q: the resource accepted %d", e.Token, e.Key, e.AcceptedToken)
}

// Unwrap makes errors.Is(err, client.ErrStale) true.
func (e *StaleError) Unwrap() error { return client.ErrStale }

// ForgedError is returned by CheckResponse for a request the receiving
// side rejected because its fence proof did not verify. It matches
// fenceproof.ErrForged.
type ForgedError struct {
	Key, Lock string
	Token     uint64
	Reason    string
}

func (e *ForgedError) Error() string {
	return fmt.Sprintf("httpguard: forged fence token %d for %q (lock %q): %s", e.Token, e.Key, e.Lock, e.Reason)
}

// Unwrap makes errors.Is(err, fenceproof.ErrForged) true.
func (e *ForgedError) Unwrap() error { return fenceproof.ErrForged }

// CheckResponse returns a *StaleError if resp is a Guard's stale answer
// (409 with Tenure-Fence-Result: stale), a *ForgedError if it is a forged
// answer (403 with Tenure-Fence-Result: forged), and nil otherwise. It
// reads and closes the body only in those cases. On a stale answer, stop
// the work: a newer owner exists.
func CheckResponse(resp *http.Response) error {
	if resp.StatusCode == http.StatusForbidden && resp.Header.Get(HeaderResult) == "forged" {
		defer resp.Body.Close()
		var b ForgedBody
		_ = json.NewDecoder(io.LimitReader(resp.Body, 4<<10)).Decode(&b)
		return &ForgedError{Key: b.Key, Lock: b.Lock, Token: b.Token, Reason: b.Reason}
	}
	if resp.StatusCode != http.StatusConflict || resp.Header.Get(HeaderResult) != "stale" {
		return nil
	}
	defer resp.Body.Close()
	var b StaleBody
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<10)).Decode(&b); err != nil {
		return &StaleError{}
	}
	return &StaleError{Key: b.Key, Token: b.Token, AcceptedToken: b.AcceptedToken}
}
