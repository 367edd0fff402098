package client

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tenure-io/tenure/api/tenurepb"
)

// TestErrorsDecidedByCodesAndDetails: an answer's sentinel follows its
// gRPC code and the service's detail, whatever its message says.
func TestErrorsDecidedByCodesAndDetails(t *testing.T) {
	withDetail := func(code codes.Code, reason pb.ErrorReason, msg string) error {
		st, err := status.New(code, msg).WithDetails(&pb.Error{Reason: reason, Code: uint32(code)})
		if err != nil {
			t.Fatal(err)
		}
		return st.Err()
	}
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"the service's limit, worded like gRPC's size limit", withDetail(codes.ResourceExhausted, pb.ErrorReason_ERROR_REASON_LIMIT, "grpc: received message larger than max (5 vs. 4)"), ErrLimit},
		{"the service's full disk (no reason), worded like gRPC's size limit", withDetail(codes.ResourceExhausted, pb.ErrorReason_ERROR_REASON_UNSPECIFIED, "grpc: received message larger than max (5 vs. 4)"), ErrLimit},
		{"gRPC's own size limit, in gRPC's words", status.Error(codes.ResourceExhausted, "grpc: received message larger than max (5 vs. 4)"), ErrInvalid},
		{"gRPC's own size limit, worded otherwise", status.Error(codes.ResourceExhausted, "trying to send message larger than max"), ErrInvalid},
		{"gRPC's own size limit, no words", status.Error(codes.ResourceExhausted, ""), ErrInvalid},
		{"not the leader", withDetail(codes.Unavailable, pb.ErrorReason_ERROR_REASON_NOT_LEADER, "anything"), ErrUnavailable},
		{"stale, worded as a limit", withDetail(codes.FailedPrecondition, pb.ErrorReason_ERROR_REASON_STALE, "tenure: limit reached"), ErrStale},
		{"permission denied by code alone", status.Error(codes.PermissionDenied, "tenure: limit reached"), ErrPermissionDenied},
	} {
		if got := fromStatus(tc.err); !errors.Is(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if !notLeader(fromStatus(withDetail(codes.Unavailable, pb.ErrorReason_ERROR_REASON_NOT_LEADER, ""))) {
		t.Error("a NOT_LEADER detail is not taken for 'not the leader'")
	}
	if notLeader(fromStatus(status.Error(codes.Unavailable, "not the leader"))) {
		t.Error("a message saying 'not the leader' without the detail is taken for it")
	}
}

// TestGRPCSizeLimitIsInvalid: a request over the server's gRPC receive
// limit, refused by gRPC before the service sees it, is ErrInvalid (with
// the hint to the service's limits), not ErrLimit.
func TestGRPCSizeLimitIsInvalid(t *testing.T) {
	f := startFake(t, true, grpc.MaxRecvMsgSize(1024))
	c := dialFake(t, f)
	_, err := c.FencedPut(testCtx(t), "k", make([]byte, 4096), 1, "")
	if !errors.Is(err, ErrInvalid) || errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), "docs/limits.md") {
		t.Fatalf("FencedPut over gRPC's size limit: %v; want ErrInvalid naming docs/limits.md", err)
	}
}
