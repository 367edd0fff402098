package server

import (
	"context"
	"fmt"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/fsm"
)

// ErrLimit: a request would take the service past one of its limits. The
// message names the limit, its value and how to raise it. The replicated
// limits are enforced by the state machine (fsm.ErrLimit is this error);
// the per-node ones here, before a command is proposed.
var ErrLimit = fsm.ErrLimit

// Limits are the admission limits of one node, checked before a command
// is proposed: the sizes of single requests, which no concurrent request
// can race past. The limits on how much the state holds (sessions,
// waiters, locks, registers, queues, keys and their bytes) are replicated
// settings enforced where commands are applied (fsm.Limits). Zero means
// the default.
type Limits struct {
	// MaxNameBytes bounds lock, semaphore, election and fenced register
	// names (--max-name-len; at most fsm.MaxNameLen).
	MaxNameBytes int
	// MaxRegisterValueBytes bounds a fenced register's value
	// (--max-register-value-len; at most fsm.MaxValueLen).
	MaxRegisterValueBytes int

	// Key-value store and watch (kv.go, watch.go).
	KV KVLimits
	// MaxQueuePayload bounds a queue item's payload in bytes
	// (--max-queue-payload; at most fsm.MaxQueuePayload).
	MaxQueuePayload int
	// Restore bounds the snapshot restore streams (cluster.go).
	Restore RestoreLimits
	// MaxResponseBytes bounds one answer (--max-response-bytes): a
	// request whose answer would take more is refused with ErrLimit
	// (RESOURCE_EXHAUSTED) naming the limit, before the answer is built
	// where its size can be known first (a transaction's ranges, a lock's
	// history), and before it is sent otherwise. Listings page well
	// below it. At least MinResponseBytes, at most MaxMessageSize.
	// Answers carrying queue items are bounded by the payload limits
	// instead (boundedByPayloads).
	MaxResponseBytes int
}

// DefaultMaxResponseBytes is the default Limits.MaxResponseBytes: room
// for a page (maxPageBytes) and more, and well under the 4 MiB a gRPC
// client receives by default.
const DefaultMaxResponseBytes = 3 << 20

// MinResponseBytes is the least Limits.MaxResponseBytes: a page of a
// listing (maxPageBytes) and room for the rest of its answer.
const MinResponseBytes = maxPageBytes + 64<<10

// errResponseTooLarge is the refusal of an answer past MaxResponseBytes.
func errResponseTooLarge(limit int) error {
	return fmt.Errorf("%w: the response would exceed --max-response-bytes (%d bytes)", ErrLimit, limit)
}

// DefaultLimits are the limits `tenure serve` runs with.
func DefaultLimits() Limits {
	return Limits{MaxNameBytes: fsm.MaxNameLen, MaxRegisterValueBytes: fsm.MaxValueLen, KV: DefaultKVLimits(), MaxResponseBytes: DefaultMaxResponseBytes}
}

// Validate reports a limit set beyond what the state machine accepts.
func (l Limits) Validate() error {
	if l.MaxNameBytes > fsm.MaxNameLen {
		return fmt.Errorf("%w: --max-name-len %d is above the largest name the service stores, %d", fsm.ErrInvalid, l.MaxNameBytes, fsm.MaxNameLen)
	}
	if l.MaxRegisterValueBytes > fsm.MaxValueLen {
		return fmt.Errorf("%w: --max-register-value-len %d is above the largest value the service stores, %d", fsm.ErrInvalid, l.MaxRegisterValueBytes, fsm.MaxValueLen)
	}
	if l.MaxResponseBytes > MaxMessageSize {
		return fmt.Errorf("%w: --max-response-bytes %d is above the largest message the service exchanges, %d", fsm.ErrInvalid, l.MaxResponseBytes, MaxMessageSize)
	}
	if l.MaxResponseBytes != 0 && l.MaxResponseBytes < MinResponseBytes {
		return fmt.Errorf("%w: --max-response-bytes %d is below a page of a listing and the rest of its answer, %d", fsm.ErrInvalid, l.MaxResponseBytes, MinResponseBytes)
	}
	if err := l.KV.Validate(); err != nil {
		return err
	}
	return l.validateQueue()
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.MaxNameBytes <= 0 {
		l.MaxNameBytes = d.MaxNameBytes
	}
	if l.MaxRegisterValueBytes <= 0 {
		l.MaxRegisterValueBytes = d.MaxRegisterValueBytes
	}
	if l.MaxResponseBytes <= 0 {
		l.MaxResponseBytes = d.MaxResponseBytes
	}
	l.KV = l.KV.withDefaults()
	l.Restore = l.Restore.withDefaults()
	return l.withQueueDefaults()
}

// checkName validates a lock, semaphore, election or register name and
// applies --max-name-len.
func (s *Server) checkName(kind, name string) error {
	if err := fsm.ValidateName(kind, name); err != nil {
		return err
	}
	if len(name) > s.limits.MaxNameBytes {
		return fmt.Errorf("%w: %s is %d bytes, the limit is %d (--max-name-len)", fsm.ErrInvalid, kind, len(name), s.limits.MaxNameBytes)
	}
	return nil
}

// GetLimits implements pb.TenureServer.
func (s *Server) GetLimits(ctx context.Context, _ *pb.GetLimitsRequest) (*pb.LimitsResponse, error) {
	out := &pb.LimitsResponse{Limits: &pb.ClusterLimits{}}
	err := s.read(ctx, false, func(st *fsm.State) {
		fsm.LimitsToMessage(st.Limits(), out.Limits)
		out.Revision = st.Revision()
	})
	return out, err
}

// SetLimits implements pb.TenureServer.
func (s *Server) SetLimits(ctx context.Context, req *pb.SetLimitsRequest) (*pb.LimitsResponse, error) {
	change := fsm.LimitsFromMessage(req.GetLimits())
	if change.IsZero() {
		return nil, toStatus(fmt.Errorf("%w: no limit given to set", fsm.ErrInvalid))
	}
	limits, err := s.node.SetLimits(ctx, change)
	if err != nil {
		return nil, toStatus(err)
	}
	out := &pb.LimitsResponse{Limits: &pb.ClusterLimits{}}
	fsm.LimitsToMessage(limits, out.Limits)
	s.node.Read(func(st *fsm.State) { out.Revision = st.Revision() })
	return out, nil
}
