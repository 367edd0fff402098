package httpguard

import (
	"context"
	"errors"
	"fmt"

	"github.com/tenure-io/tenure/client"
)

// Registers is the part of *client.Client that RegisterStore uses.
type Registers interface {
	FencedPut(ctx context.Context, key string, value []byte, token uint64, operationID string, opts ...client.FenceOption) (client.PutResult, error)
}

// DefaultRegisterPrefix is prepended to resource keys to name registers.
const DefaultRegisterPrefix = "httpguard/"

// maxRegisterKey is the server's limit on register keys, in bytes.
const maxRegisterKey = 512

// RegisterStore keeps each resource key's high-water mark in a Tenure
// fenced register named prefix+key. The register's own rule (a write is
// applied iff its token is at least the accepted one) is the atomic
// compare-and-advance, replicated and durable on the Tenure server.
//
// Every Advance is one replicated write on the Tenure server (the register
// must be written to move or confirm the mark atomically), so it suits
// services with modest request rates; for high rates prefer the
// transactional path or pgstore. Inspect a key's mark with
// `tenure fence get <prefix><key>`. It is safe for concurrent use.
type RegisterStore struct {
	regs   Registers
	prefix string
}

// NewRegisterStore returns a store writing registers through regs (usually
// a *client.Client). prefix "" means DefaultRegisterPrefix.
func NewRegisterStore(regs Registers, prefix string) (*RegisterStore, error) {
	if regs == nil {
		return nil, errors.New("httpguard: nil Registers")
	}
	if prefix == "" {
		prefix = DefaultRegisterPrefix
	}
	if len(prefix)+MaxKeyLen > maxRegisterKey {
		return nil, fmt.Errorf("httpguard: register prefix is %d bytes; with %d-byte keys it must be at most %d", len(prefix), MaxKeyLen, maxRegisterKey-MaxKeyLen)
	}
	return &RegisterStore{regs: regs, prefix: prefix}, nil
}

// Register is the name of the register that keeps key's mark.
func (s *RegisterStore) Register(key string) string { return s.prefix + key }

// Advance implements Store with client.FencedPut. A stale token is reported
// as accepted=false with the register's token; any other error (including
// client.ErrUnknownOutcome) is returned as is.
func (s *RegisterStore) Advance(ctx context.Context, key string, token uint64) (bool, uint64, error) {
	r, err := s.regs.FencedPut(ctx, s.Register(key), nil, token, "")
	switch {
	case errors.Is(err, client.ErrStale):
		return false, r.Token, nil
	case err != nil:
		return false, 0, fmt.Errorf("httpguard: advancing register %q: %w", s.Register(key), err)
	}
	return true, r.Token, nil
}
