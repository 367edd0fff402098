package etcdapi

import (
	"context"
	"errors"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/server"
)

// toGRPC is the one place where Tenure's errors become etcd's wire errors
// (rpctypes), which etcd's clients recognise by their messages.
func toGRPC(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err // already an etcd error (or a forwarded answer)
	}
	switch {
	case errors.Is(err, fsm.ErrSessionNotFound):
		return rpctypes.ErrGRPCLeaseNotFound // every session the etcd API names is a lease
	case errors.Is(err, fsm.ErrKeyNotFound):
		return rpctypes.ErrGRPCKeyNotFound
	case errors.Is(err, fsm.ErrFutureRevision):
		return rpctypes.ErrGRPCFutureRev
	case errors.Is(err, fsm.ErrCompactedRevision):
		return rpctypes.ErrGRPCCompacted
	case errors.Is(err, server.ErrStorageFull):
		return rpctypes.ErrGRPCNoSpace
	case errors.Is(err, fsm.ErrVersion):
		// A feature of a newer cluster version (a nested transaction, a
		// key that is not UTF-8) before every member speaks it.
		return status.Error(codes.FailedPrecondition, "etcdserver: "+err.Error())
	case errors.Is(err, fsm.ErrLimit):
		return status.Error(codes.ResourceExhausted, "etcdserver: "+err.Error())
	case errors.Is(err, fsm.ErrPermissionDenied):
		return rpctypes.ErrGRPCPermissionDenied
	case errors.Is(err, fsm.ErrInvalid):
		return status.Error(codes.InvalidArgument, "etcdserver: "+err.Error())
	case errors.Is(err, server.ErrNotLeader):
		return rpctypes.ErrGRPCNoLeader
	case errors.Is(err, server.ErrUnknownOutcome):
		// The command may have been committed: etcd's clients do not
		// retry a write after this answer.
		return rpctypes.ErrGRPCTimeout
	case errors.Is(err, server.ErrClosed):
		return rpctypes.ErrGRPCStopped
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	return status.Error(codes.Unknown, err.Error())
}

// errUnsupported answers a request for something docs/etcd.md lists as
// not supported.
func errUnsupported(what string) error {
	return status.Errorf(codes.Unimplemented, "etcdserver: %s is not supported by Tenure's etcd API (see docs/etcd.md)", what)
}
