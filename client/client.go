// Package client is Tenure's Go client: sessions, fenced locks with an
// explicit ownership state machine, and fenced registers.
//
// # Ownership
//
// A lock is a lease, not a mutex: a paused process can wake up still
// believing it holds a lock that the server has already given to someone
// else. A Hold therefore moves through explicit states (acquiring, held,
// suspect, lost, released). Suspect means "I can no longer prove I hold
// it": Hold.Context is cancelled at once and the work must stop. Lost is
// terminal; its token must never be used again. Whatever the state, protect
// every effect with the hold's fencing token checked by the resource itself
// (FencedPut, or a guard for your database).
//
// The client counts its lease on the monotonic clock from the moment each
// keepalive was sent: a hold is safe until sent + TTL − drift margin, and the
// session renews every TTL/3.
//
// This package imports no server code.
package client

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/clock"
)

// DefaultEndpoint is where `tenure serve` listens by default.
const DefaultEndpoint = "127.0.0.1:7070"

// Client is a connection to a Tenure server. It is safe for concurrent use.
type Client struct {
	conn *grpc.ClientConn
	api  pb.TenureClient
	clk  clock.Clock
}

// Option configures Dial.
type Option func(*dialOptions) error

type dialOptions struct {
	grpcOpts []grpc.DialOption
	clk      clock.Clock
}

// WithGRPCOptions adds gRPC dial options (for example a custom dialer).
func WithGRPCOptions(opts ...grpc.DialOption) Option {
	return func(o *dialOptions) error {
		o.grpcOpts = append(o.grpcOpts, opts...)
		return nil
	}
}

// WithClock replaces the monotonic clock (tests drive time with it).
func WithClock(c clock.Clock) Option {
	return func(o *dialOptions) error {
		if c == nil {
			return fmt.Errorf("%w: nil clock", ErrInvalid)
		}
		o.clk = c
		return nil
	}
}

// Dial connects to the server at endpoint (host:port). It does not block:
// the connection is made on first use.
func Dial(ctx context.Context, endpoint string, opts ...Option) (*Client, error) {
	o := dialOptions{clk: clock.Real}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	endpoint = strings.TrimSpace(endpoint)
	if endpoint == "" {
		return nil, fmt.Errorf("%w: empty endpoint", ErrInvalid)
	}
	gopts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, o.grpcOpts...)
	conn, err := grpc.NewClient(endpoint, gopts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return &Client{conn: conn, api: pb.NewTenureClient(conn), clk: o.clk}, nil
}

// Close closes the connection. Sessions on it stop renewing.
func (c *Client) Close() error { return c.conn.Close() }

// PutResult is the answer of a fenced register write.
type PutResult struct {
	// Accepted is true when the write was applied (now or, for a
	// Duplicate, the first time this operation id was seen).
	Accepted bool
	// Duplicate is true when the operation id had been seen before:
	// nothing was applied by this call.
	Duplicate bool
	// Token is the register's accepted token after the call.
	Token uint64
	// Revision is the service's revision after the call.
	Revision uint64
}

// FencedPut writes value to the register key iff token is at least the
// highest token the register has accepted. A lower token returns the result
// and an error matching ErrStale; the register is unchanged. Replaying an
// operationID returns the first result and applies nothing.
func (c *Client) FencedPut(ctx context.Context, key string, value []byte, token uint64, operationID string) (PutResult, error) {
	resp, err := c.api.FencedPut(ctx, &pb.FencedPutRequest{Key: key, Value: value, Token: token, OperationId: operationID})
	if err != nil {
		return PutResult{}, fromStatus(err)
	}
	r := PutResult{Accepted: resp.GetResult() == pb.PutResult_PUT_RESULT_ACCEPTED, Duplicate: resp.GetDuplicate(), Token: resp.GetToken(), Revision: resp.GetRevision()}
	if !r.Accepted && !r.Duplicate {
		return r, fmt.Errorf("%w: token %d is below the accepted token %d", ErrStale, token, r.Token)
	}
	return r, nil
}

// Register is a fenced register's content.
type Register struct {
	Key         string
	Value       []byte
	Token       uint64
	Found       bool
	ModRevision uint64
}

// FencedGet reads a register (linearizable).
func (c *Client) FencedGet(ctx context.Context, key string) (Register, error) {
	resp, err := c.api.FencedGet(ctx, &pb.FencedGetRequest{Key: key})
	if err != nil {
		return Register{}, fromStatus(err)
	}
	return Register{Key: resp.GetKey(), Value: resp.GetValue(), Token: resp.GetToken(), Found: resp.GetFound(), ModRevision: resp.GetModRevision()}, nil
}

// LockStatus describes a lock: holder, waiters in grant order.
func (c *Client) LockStatus(ctx context.Context, name string) (*pb.LockStatusResponse, error) {
	resp, err := c.api.LockStatus(ctx, &pb.LockStatusRequest{Name: name})
	return resp, fromStatus(err)
}

// LockHistory returns a lock's recent grants, oldest first.
func (c *Client) LockHistory(ctx context.Context, name string) (*pb.LockHistoryResponse, error) {
	resp, err := c.api.LockHistory(ctx, &pb.LockHistoryRequest{Name: name})
	return resp, fromStatus(err)
}

// Sessions lists the live sessions.
func (c *Client) Sessions(ctx context.Context) (*pb.ListSessionsResponse, error) {
	resp, err := c.api.ListSessions(ctx, &pb.ListSessionsRequest{})
	return resp, fromStatus(err)
}

// Status reports the node's view: id, leader, term, revision.
func (c *Client) Status(ctx context.Context) (*pb.StatusResponse, error) {
	resp, err := c.api.Status(ctx, &pb.StatusRequest{})
	return resp, fromStatus(err)
}

// sessionTimeout bounds a keepalive round trip when nothing else does.
const sessionTimeout = 5 * time.Second
