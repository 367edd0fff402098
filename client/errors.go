package client

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tenure-io/tenure/api/tenurepb"
)

// Sentinel errors. Match them with errors.Is.
var (
	// ErrStale: a fenced write carried a token lower than the one the
	// resource has already accepted. The write was not applied. Stop the
	// work: a newer owner exists.
	ErrStale = errors.New("tenure: stale fence token")
	// ErrNotHeld: the handle is not the lock's current holder (it was
	// released, or its session expired). Nothing was changed.
	ErrNotHeld = errors.New("tenure: lock not held")
	// ErrSessionExpired: the session is gone on the server (expired or
	// closed). Every hold it had is lost for good.
	ErrSessionExpired = errors.New("tenure: session expired")
	// ErrLocked: TryLock found the lock held by someone else.
	ErrLocked = errors.New("tenure: lock is held by another session")
	// ErrAlreadyHeld: this session already holds or waits for the lock.
	ErrAlreadyHeld = errors.New("tenure: session already holds or waits for this lock")
	// ErrInvalid: the server rejected the arguments; the message says why.
	ErrInvalid = errors.New("tenure: invalid argument")
	// ErrUnknownOutcome: the request may or may not have taken effect.
	ErrUnknownOutcome = errors.New("tenure: outcome unknown")
	// ErrUnavailable: no server could be reached (or it is not the leader).
	ErrUnavailable = errors.New("tenure: service unavailable")
	// ErrNoLeader: the servers answered, but none was the leader before
	// the context ended (an election that did not finish, a cluster
	// without a majority). It matches ErrUnavailable too.
	ErrNoLeader = fmt.Errorf("%w: no leader", ErrUnavailable)
	// ErrProgressDeadline: the progress watchdog let the session go because
	// the work did not report progress in time.
	ErrProgressDeadline = errors.New("tenure: no progress reported within the progress deadline")
	// ErrLimit: the request would take the service past one of its limits
	// (sessions, waiters per lock, ...); the message names it. Requests
	// within the limits are still served.
	ErrLimit = errors.New("tenure: limit reached")
	// ErrPermissionDenied: the request acted on a session or a delivery
	// without the capability the server issued for it (the session's
	// secret, the delivery's receipt), or with a wrong one. Nothing was
	// changed.
	ErrPermissionDenied = errors.New("tenure: permission denied")
	// ErrClosed: the session or client was closed by its user.
	ErrClosed = errors.New("tenure: closed")
)

// errDisconnected is internal: the stream carrying a request broke.
var errDisconnected = errors.New("tenure: connection lost")

type wireError struct {
	sentinel error
	msg      string
	reason   pb.ErrorReason // the server's reason, when it gave one
	// leaderAddr: with NOT_LEADER, the leader's client address when the
	// member knew it (Client.follow).
	leaderAddr string
}

// withLeader records the leader's address a NOT_LEADER answer named.
func withLeader(err error, addr string) error {
	if we, ok := err.(*wireError); ok && addr != "" {
		we.leaderAddr = addr
	}
	return err
}

func (e *wireError) Error() string { return e.msg }
func (e *wireError) Unwrap() error { return e.sentinel }

func fromReason(r pb.ErrorReason, code codes.Code, msg string) error {
	var s error
	switch r {
	case pb.ErrorReason_ERROR_REASON_STALE:
		s = ErrStale
	case pb.ErrorReason_ERROR_REASON_NOT_HELD:
		s = ErrNotHeld
	case pb.ErrorReason_ERROR_REASON_SESSION_EXPIRED:
		s = ErrSessionExpired
	case pb.ErrorReason_ERROR_REASON_BUSY:
		s = ErrLocked
	case pb.ErrorReason_ERROR_REASON_INVALID:
		s = ErrInvalid
	case pb.ErrorReason_ERROR_REASON_LIMIT:
		s = ErrLimit
	case pb.ErrorReason_ERROR_REASON_NOT_LEADER:
		s = ErrUnavailable
	case pb.ErrorReason_ERROR_REASON_UNKNOWN_OUTCOME:
		s = ErrUnknownOutcome
	case pb.ErrorReason_ERROR_REASON_ALREADY_HELD:
		s = ErrAlreadyHeld
	case pb.ErrorReason_ERROR_REASON_CANCELLED:
		s = ErrUnknownOutcome
	case pb.ErrorReason_ERROR_REASON_COMPACTED:
		s = ErrCompacted
	case pb.ErrorReason_ERROR_REASON_PERMISSION_DENIED:
		s = ErrPermissionDenied
	default:
		return fromCode(code, msg)
	}
	return &wireError{sentinel: s, msg: msg, reason: r}
}

// notLeader reports whether err is a node's answer that it is not the
// leader (or knows none): the node is up, and a leader may come.
func notLeader(err error) bool {
	var we *wireError
	return errors.As(err, &we) && we.reason == pb.ErrorReason_ERROR_REASON_NOT_LEADER
}

// fromCode maps a unary call's gRPC status back to a sentinel.
func fromCode(code codes.Code, msg string) error {
	var s error
	switch code {
	case codes.InvalidArgument:
		s = ErrInvalid
	case codes.ResourceExhausted:
		s = ErrLimit
	case codes.OutOfRange:
		s = ErrCompacted
	case codes.NotFound:
		s = ErrSessionExpired
	case codes.AlreadyExists:
		s = ErrAlreadyHeld
	case codes.PermissionDenied:
		s = ErrPermissionDenied
	case codes.Unavailable:
		s = ErrUnavailable
	case codes.Unknown:
		s = ErrUnknownOutcome
	case codes.DeadlineExceeded:
		s = context.DeadlineExceeded
	case codes.Canceled:
		s = context.Canceled
	default:
		return errors.New(msg)
	}
	return &wireError{sentinel: s, msg: msg}
}

// fromStatus maps a unary call's gRPC status back to a sentinel, by its
// code and details only, never its message. The service puts a pb.Error
// detail on every status it answers with (its reason, when it has one);
// a status without one comes from gRPC itself.
func fromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, d := range st.Details() {
		if e, ok := d.(*pb.Error); ok {
			return withLeader(fromReason(e.GetReason(), st.Code(), st.Message()), e.GetLeaderAddr())
		}
	}
	if st.Code() == codes.ResourceExhausted {
		// Not the service's limits (they carry a detail): gRPC's own
		// message size limit, hit on one side or the other before the
		// service could name the limit of the value or payload in it.
		return &wireError{sentinel: ErrInvalid, msg: "tenure: invalid argument: a message is larger than gRPC accepts (" + st.Message() + "); values, payloads and answers are limited (docs/limits.md: --max-value-len, --max-register-value-len, --max-queue-payload)"}
	}
	return fromCode(st.Code(), st.Message())
}

func fromProto(e *pb.Error) error {
	return withLeader(fromReason(e.GetReason(), codes.Code(e.GetCode()), e.GetMessage()), e.GetLeaderAddr())
}
