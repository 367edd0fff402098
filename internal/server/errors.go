package server

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/node"
)

// errCancelled: a queued acquire was abandoned by its client.
var errCancelled = errors.New("tenure: acquire cancelled")

// classify is the one place where internal errors become wire errors.
func classify(err error) (codes.Code, pb.ErrorReason) {
	switch {
	case errors.Is(err, ErrCompacted):
		return codes.OutOfRange, pb.ErrorReason_ERROR_REASON_COMPACTED
	case errors.Is(err, ErrLimit):
		return codes.ResourceExhausted, pb.ErrorReason_ERROR_REASON_LIMIT
	case errors.Is(err, node.ErrStorageFull):
		return codes.ResourceExhausted, pb.ErrorReason_ERROR_REASON_UNSPECIFIED
	case errors.Is(err, fsm.ErrInvalid), errors.Is(err, node.ErrSnapshotBehind):
		return codes.InvalidArgument, pb.ErrorReason_ERROR_REASON_INVALID
	case errors.Is(err, fsm.ErrPermissionDenied):
		return codes.PermissionDenied, pb.ErrorReason_ERROR_REASON_PERMISSION_DENIED
	case errors.Is(err, fsm.ErrSessionNotFound):
		return codes.NotFound, pb.ErrorReason_ERROR_REASON_SESSION_EXPIRED
	case errors.Is(err, fsm.ErrBusy):
		return codes.FailedPrecondition, pb.ErrorReason_ERROR_REASON_BUSY
	case errors.Is(err, fsm.ErrNotHeld):
		return codes.FailedPrecondition, pb.ErrorReason_ERROR_REASON_NOT_HELD
	case errors.Is(err, fsm.ErrAlreadyHeld):
		return codes.AlreadyExists, pb.ErrorReason_ERROR_REASON_ALREADY_HELD
	case errors.Is(err, node.ErrNotLeader), errors.Is(err, node.ErrClosed):
		return codes.Unavailable, pb.ErrorReason_ERROR_REASON_NOT_LEADER
	case errors.Is(err, node.ErrUnknownOutcome):
		return codes.Unknown, pb.ErrorReason_ERROR_REASON_UNKNOWN_OUTCOME
	case errors.Is(err, errCancelled), errors.Is(err, context.Canceled):
		return codes.Canceled, pb.ErrorReason_ERROR_REASON_CANCELLED
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded, pb.ErrorReason_ERROR_REASON_UNSPECIFIED
	}
	return codes.Internal, pb.ErrorReason_ERROR_REASON_UNSPECIFIED
}

// toStatus converts err for a unary response.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	code, reason := classify(err)
	st := status.New(code, err.Error())
	// The reason, typed, as on a session stream, on every answer the
	// service gives (with no reason when it has none): a client tells
	// "this node is not the leader" from "this node cannot be reached",
	// and the service's answers from gRPC's own (a message over gRPC's
	// size limit is also RESOURCE_EXHAUSTED), without reading messages.
	if d, derr := st.WithDetails(&pb.Error{Reason: reason, Code: uint32(code)}); derr == nil {
		st = d
	}
	var ce *CompactedError
	if errors.As(err, &ce) { // the numbers a client needs to resume, typed
		if d, derr := st.WithDetails(&pb.KVCompacted{CompactRevision: ce.CompactRevision, CurrentRevision: ce.CurrentRevision}); derr == nil {
			st = d
		}
	}
	var ue *fsm.UnissuedTokenError
	if errors.As(err, &ue) {
		if d, derr := st.WithDetails(&pb.UnissuedToken{Token: ue.Token, Revision: ue.Revision}); derr == nil {
			st = d
		}
	}
	var wl *fsm.WrongLockError
	if errors.As(err, &wl) {
		if d, derr := st.WithDetails(&pb.WrongLock{Key: wl.Key, Bound: wl.Bound, Lock: wl.Lock, Token: wl.Token, Revision: wl.Revision}); derr == nil {
			st = d
		}
	}
	var fe *ForgedProofError
	if errors.As(err, &fe) {
		if d, derr := st.WithDetails(&pb.ForgedProof{Token: fe.Token, Lock: fe.Lock, Reason: fe.Reason}); derr == nil {
			st = d
		}
	}
	return st.Err()
}

// toProto converts err for a session stream response.
func toProto(err error) *pb.Error {
	code, reason := classify(err)
	return &pb.Error{Reason: reason, Code: uint32(code), Message: err.Error()}
}
