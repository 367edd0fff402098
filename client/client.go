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
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/clock"
)

// DefaultEndpoint is where `tenure serve` listens by default.
const DefaultEndpoint = "127.0.0.1:7070"

// Client is a connection to a Tenure service: one server or the members of
// a cluster. Writes and linearizable reads must reach the leader; a node
// that is not the leader answers "unavailable" and the client moves on to
// the next endpoint by itself. It is safe for concurrent use.
type Client struct {
	eps          []*endpoint
	cur          atomic.Uint32 // index of the endpoint in use
	clk          clock.Clock
	serializable bool
}

type endpoint struct {
	addr string
	conn *grpc.ClientConn
	api  pb.TenureClient
	// mux carries the sessions' streams; nil with WithStreamPerSession.
	mux *sessionMux
}

// sessionConn starts a session stream that lasts until ctx ends.
func (ep *endpoint) sessionConn(ctx context.Context) (sessionConn, error) {
	if ep.mux == nil {
		return ep.api.Session(ctx)
	}
	return ep.mux.open(ctx)
}

// Option configures Dial.
type Option func(*dialOptions) error

type dialOptions struct {
	grpcOpts      []grpc.DialOption
	clk           clock.Clock
	serializable  bool
	streamPerSess bool
}

// WithStreamPerSession gives every session a Session RPC of its own
// instead of sharing one Sessions RPC per endpoint among all sessions (the
// default, which sends requests that are ready together in one message).
// For servers without the Sessions RPC, and for comparing the two.
func WithStreamPerSession() Option {
	return func(o *dialOptions) error {
		o.streamPerSess = true
		return nil
	}
}

// WithSerializableReads makes FencedGet, LockStatus, LockHistory and
// Sessions answer from the node the client is connected to, without a
// round trip to the leader: faster, available during an election, and
// possibly stale. Never base an ownership decision on such a read.
func WithSerializableReads() Option {
	return func(o *dialOptions) error {
		o.serializable = true
		return nil
	}
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

// Dial connects to the service at endpoints: one host:port, or a
// comma-separated list of cluster members. It does not block: connections
// are made on first use.
func Dial(ctx context.Context, endpoints string, opts ...Option) (*Client, error) {
	o := dialOptions{clk: clock.Real}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	c := &Client{clk: o.clk, serializable: o.serializable}
	gopts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// Fixed flow-control windows: no ping probes to size them (the
		// server does the same, see its options).
		grpc.WithInitialWindowSize(1 << 20), grpc.WithInitialConnWindowSize(1 << 24),
	}, o.grpcOpts...)
	for _, addr := range strings.Split(endpoints, ",") {
		addr = strings.TrimSpace(addr)
		if addr == "" {
			continue
		}
		conn, err := grpc.NewClient(addr, gopts...)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("%w: endpoint %q: %v", ErrInvalid, addr, err)
		}
		ep := &endpoint{addr: addr, conn: conn, api: pb.NewTenureClient(conn)}
		if !o.streamPerSess {
			ep.mux = &sessionMux{api: ep.api}
		}
		c.eps = append(c.eps, ep)
	}
	if len(c.eps) == 0 {
		return nil, fmt.Errorf("%w: no endpoint given", ErrInvalid)
	}
	return c, nil
}

// Close closes the connections. Sessions on them stop renewing.
func (c *Client) Close() error {
	var first error
	for _, ep := range c.eps {
		if ep.mux != nil {
			ep.mux.close()
		}
		if err := ep.conn.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Endpoint is the address currently in use.
func (c *Client) Endpoint() string { return c.eps[c.cur.Load()%uint32(len(c.eps))].addr }

// pick returns the endpoint in use and its index.
func (c *Client) pick() (uint32, pb.TenureClient) {
	i := c.cur.Load() % uint32(len(c.eps))
	return i, c.eps[i].api
}

// next moves on from endpoint i (unless another caller already did).
func (c *Client) next(i uint32) {
	c.cur.CompareAndSwap(i, (i+1)%uint32(len(c.eps)))
}

// unavailable reports whether err means "try another node": the node
// could not be reached, or it is not the leader.
func unavailable(err error) bool {
	return status.Code(err) == codes.Unavailable || errors.Is(err, ErrUnavailable)
}

// unary runs a request against the endpoint in use, moving through the
// others while they answer "unavailable" (an election in progress, a dead
// node). With a single endpoint it tries once.
func (c *Client) unary(ctx context.Context, fn func(pb.TenureClient) error) error {
	backoff := 20 * time.Millisecond
	for {
		var err error
		for range c.eps {
			i, api := c.pick()
			if err = fn(api); !unavailable(err) {
				return fromStatus(err)
			}
			c.next(i)
		}
		if len(c.eps) == 1 {
			return fromStatus(err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fromStatus(err)
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

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
//
// With several endpoints, a write whose node stops answering is retried on
// the next one, so it may be applied twice; with an operationID the retry
// is recognised (Duplicate). Always pass one when that matters.
func (c *Client) FencedPut(ctx context.Context, key string, value []byte, token uint64, operationID string) (PutResult, error) {
	var resp *pb.FencedPutResponse
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.FencedPut(ctx, &pb.FencedPutRequest{Key: key, Value: value, Token: token, OperationId: operationID})
		return err
	})
	if err != nil {
		return PutResult{}, err
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

// FencedGet reads a register (linearizable unless WithSerializableReads).
func (c *Client) FencedGet(ctx context.Context, key string) (Register, error) {
	var resp *pb.FencedGetResponse
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.FencedGet(ctx, &pb.FencedGetRequest{Key: key, Serializable: c.serializable})
		return err
	})
	if err != nil {
		return Register{}, err
	}
	return Register{Key: resp.GetKey(), Value: resp.GetValue(), Token: resp.GetToken(), Found: resp.GetFound(), ModRevision: resp.GetModRevision()}, nil
}

// LockStatus describes a lock: holder, waiters in grant order.
func (c *Client) LockStatus(ctx context.Context, name string) (*pb.LockStatusResponse, error) {
	var resp *pb.LockStatusResponse
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.LockStatus(ctx, &pb.LockStatusRequest{Name: name, Serializable: c.serializable})
		return err
	})
	return resp, err
}

// LockHistory returns a lock's recent grants, oldest first.
func (c *Client) LockHistory(ctx context.Context, name string) (*pb.LockHistoryResponse, error) {
	var resp *pb.LockHistoryResponse
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.LockHistory(ctx, &pb.LockHistoryRequest{Name: name, Serializable: c.serializable})
		return err
	})
	return resp, err
}

// Sessions lists the live sessions.
func (c *Client) Sessions(ctx context.Context) (*pb.ListSessionsResponse, error) {
	var resp *pb.ListSessionsResponse
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.ListSessions(ctx, &pb.ListSessionsRequest{Serializable: c.serializable})
		return err
	})
	return resp, err
}

// Status reports the view of the first node that answers: its id, the
// leader's id, term, revision and voters.
func (c *Client) Status(ctx context.Context) (*pb.StatusResponse, error) {
	var resp *pb.StatusResponse
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.Status(ctx, &pb.StatusRequest{})
		return err
	})
	return resp, err
}

// Members lists the cluster's members.
func (c *Client) Members(ctx context.Context) (*pb.MemberListResponse, error) {
	var resp *pb.MemberListResponse
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.MemberList(ctx, &pb.MemberListRequest{})
		return err
	})
	return resp, err
}

// AddMember adds a voter (sent to the leader). force allows an even
// number of voters.
func (c *Client) AddMember(ctx context.Context, id, peerAddr string, force bool) (*pb.MemberListResponse, error) {
	var resp *pb.MemberListResponse
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.MemberAdd(ctx, &pb.MemberAddRequest{Id: id, PeerAddr: peerAddr, Force: force})
		return err
	})
	return resp, err
}

// RemoveMember removes a member (sent to the leader). force allows an
// even number of voters.
func (c *Client) RemoveMember(ctx context.Context, id string, force bool) (*pb.MemberListResponse, error) {
	var resp *pb.MemberListResponse
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.MemberRemove(ctx, &pb.MemberRemoveRequest{Id: id, Force: force})
		return err
	})
	return resp, err
}

// sessionTimeout bounds a keepalive round trip when nothing else does.
const sessionTimeout = 5 * time.Second

// SaveSnapshot writes a consistent copy of the whole service state to w
// (for backups) and returns its size.
func (c *Client) SaveSnapshot(ctx context.Context, w io.Writer) (int64, error) {
	var n int64
	err := c.unary(ctx, func(api pb.TenureClient) error {
		n = 0
		stream, err := api.SnapshotSave(ctx, &pb.SnapshotSaveRequest{})
		if err != nil {
			return err
		}
		for {
			chunk, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				if n > 0 { // part of it was written: do not retry elsewhere
					return fmt.Errorf("%w: snapshot interrupted after %d bytes: %v", ErrUnknownOutcome, n, err)
				}
				return err
			}
			k, err := w.Write(chunk.GetData())
			n += int64(k)
			if err != nil {
				return fmt.Errorf("writing snapshot: %w", err)
			}
		}
	})
	return n, err
}

// RestoreSnapshot replaces the state with a snapshot read from r (disaster
// recovery). The revision never goes back: the restored state continues
// above the cluster's, and tokens issued before the restore stay stale.
// A snapshot older than the cluster's state is refused unless force.
func (c *Client) RestoreSnapshot(ctx context.Context, r io.Reader, force bool) (*pb.SnapshotRestoreResponse, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("reading snapshot: %w", err)
	}
	var resp *pb.SnapshotRestoreResponse
	err = c.unary(ctx, func(api pb.TenureClient) error {
		stream, err := api.SnapshotRestore(ctx)
		if err != nil {
			return err
		}
		const chunk = 1 << 20
		first := true
		for rest := data; first || len(rest) > 0; first = false {
			n := min(len(rest), chunk)
			if err := stream.Send(&pb.SnapshotChunk{Data: rest[:n], Force: first && force}); err != nil {
				break // the error comes with CloseAndRecv
			}
			rest = rest[n:]
		}
		resp, err = stream.CloseAndRecv()
		return err
	})
	return resp, err
}
