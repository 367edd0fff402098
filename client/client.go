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
// session renews every TTL/3. A renewal not confirmed within TTL/3 makes
// the holds suspect and, with several endpoints, moves the session to the
// next one, where it resumes.
//
// # Listings
//
// Listings (Sessions, Locks, LockStatus, Range, Queue.DeadLetters) come
// from the server in pages, so that no answer outgrows a receive limit;
// the client follows them. Each page is a read of its own: a listing of
// more than one page is not one snapshot. An item that exists from the
// start of the call to its end is listed exactly once; one created or
// removed meanwhile may or may not be. The revision reported is the first
// page's.
//
// This package imports no server code.
package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"

	pb "github.com/tenure-io/tenure/api/tenurepb"
)

// DefaultEndpoint is where `tenure serve` listens by default.
const DefaultEndpoint = "127.0.0.1:7070"

// gRPC keepalive of the client's connections (see Dial). 10 s is the
// shortest interval gRPC allows a client; the server permits pings every
// 5 s.
const (
	keepaliveTime    = 10 * time.Second
	keepaliveTimeout = 5 * time.Second
)

// Client is a connection to a Tenure service: one server or the members of
// a cluster. Writes and linearizable reads must reach the leader; a node
// that is not the leader forwards them there, or answers "unavailable" and
// the client moves on to the next endpoint by itself. A client on a
// follower that forwards for it moves to the leader once it checked that
// it can reach it, and stays on the follower when it cannot. It is safe
// for concurrent use.
type Client struct {
	// eps are the endpoints, those given to Dial first, then those
	// learned (WithDiscovery); the slice only grows (an index names one
	// endpoint for good) and is replaced whole, under mu.
	eps          atomic.Pointer[[]*endpoint]
	cur          atomic.Uint32 // index of the endpoint in use
	clk          Clock
	serializable bool
	proofs       bool // WithFenceProofs
	discover     bool // WithDiscovery
	gopts        []grpc.DialOption
	learned      atomic.Bool  // the first successful call asked for the members
	learnedAt    atomic.Int64 // when a failed round last asked (unix ns)

	// bg runs the client's own goroutines (prefer.go); bgCtx ends at
	// Close, which waits for them.
	bg       sync.WaitGroup
	bgCtx    context.Context
	bgCancel context.CancelFunc

	// mu guards the fields below and the replacement of eps.
	mu       sync.Mutex
	closed   bool
	sessions map[*Session]struct{} // the sessions not yet over
	pref     preferState           // prefer.go
}

// maxEndpoints bounds the endpoints a client connects to, given and
// learned together: a member list cannot make it open more.
const maxEndpoints = 64

// all returns the endpoints (never empty once Dial returned).
func (c *Client) all() []*endpoint {
	if eps := c.eps.Load(); eps != nil {
		return *eps
	}
	return nil
}

type endpoint struct {
	addr     string
	conn     *grpc.ClientConn
	api      pb.TenureClient
	sessions *transport // carries the sessions' streams
}

// Option configures Dial.
type Option func(*dialOptions) error

type dialOptions struct {
	grpcOpts     []grpc.DialOption
	clk          Clock
	serializable bool
	tls          *tls.Config // security.go
	authToken    string
	proofs       bool
	discover     bool
}

// WithDiscovery makes the client learn the cluster's members from the
// cluster, so that one endpoint suffices: after its first successful
// call, and again when no known endpoint can serve, it asks for the
// member list and adds every member's client address (as the members
// publish it, `tenure serve --advertise`) to its endpoints; and a member
// that answers "not the leader" naming the leader's address sends it
// there at once, known or not; so does a follower that forwards the
// client's requests and names the leader, once the leader's endpoint
// answered a check (prefer.go; without WithDiscovery both go only to an
// endpoint given to Dial). At most 64 endpoints are kept. A
// single-member list adds nothing. Leave it off when the endpoints given
// are the only way to the members (proxies, tunnels): the addresses the
// members publish bypass them.
func WithDiscovery() Option {
	return func(o *dialOptions) error {
		o.discover = true
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

// Clock is the monotonic clock a client counts time on (WithClock): its
// sessions' safe deadlines and renewals, the progress watchdog and the
// timeouts of withdrawing an acquire. Only differences between two Now
// readings matter. Implementations must be safe for concurrent use, and
// must never run fast: a clock that runs slow against real time makes a
// hold trust its lease longer than the server keeps it (the drift margin,
// WithDriftMargin, covers only small rate differences).
type Clock interface {
	// Now returns the current instant.
	Now() time.Time
	// NewTimer returns a timer that fires once, d after Now.
	NewTimer(d time.Duration) Timer
}

// Timer is a one-shot timer of a Clock, like time.Timer.
type Timer interface {
	// C receives the instant the timer fired.
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it did.
	Stop() bool
}

// systemClock is the default Clock: the system's monotonic clock.
type systemClock struct{}

func (systemClock) Now() time.Time                 { return time.Now() }
func (systemClock) NewTimer(d time.Duration) Timer { return systemTimer{time.NewTimer(d)} }

type systemTimer struct{ t *time.Timer }

func (t systemTimer) C() <-chan time.Time { return t.t.C }
func (t systemTimer) Stop() bool          { return t.t.Stop() }

// WithClock makes the client count time on clk instead of the system's
// monotonic clock (see Clock): for tests that drive time. A nil clock is
// an error.
func WithClock(clk Clock) Option {
	return func(o *dialOptions) error {
		if clk == nil {
			return fmt.Errorf("%w: nil clock", ErrInvalid)
		}
		o.clk = clk
		return nil
	}
}

// Dial connects to the service at endpoints: one host:port, or a
// comma-separated list of cluster members. It does not wait for the
// connections (they are made on first use), but it honours ctx: when ctx
// has ended, Dial returns ctx's error and no client.
func Dial(ctx context.Context, endpoints string, opts ...Option) (*Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	o := dialOptions{clk: systemClock{}}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	c := &Client{clk: o.clk, serializable: o.serializable, proofs: o.proofs, discover: o.discover, sessions: make(map[*Session]struct{})}
	c.bgCtx, c.bgCancel = context.WithCancel(context.Background())
	creds := insecure.NewCredentials()
	if o.tls != nil {
		creds = credentials.NewTLS(o.tls)
	}
	gopts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		// Fixed flow-control windows: no ping probes to size them (the
		// server does the same, see its options).
		grpc.WithInitialWindowSize(1 << 20), grpc.WithInitialConnWindowSize(1 << 24),
		// A connection that receives nothing for keepaliveTime while a
		// call is open is pinged, and closed if the ping is not answered
		// within keepaliveTimeout: calls on a node that went silent fail
		// (UNAVAILABLE) and move to the next endpoint. Sessions notice
		// sooner by themselves (no renewal confirmed within TTL/3).
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: keepaliveTime, Timeout: keepaliveTimeout}),
	}, o.grpcOpts...)
	if o.authToken != "" {
		gopts = append(gopts, grpc.WithPerRPCCredentials(tokenCreds(o.authToken)))
	}
	c.gopts = gopts
	for _, addr := range strings.Split(endpoints, ",") {
		addr = strings.TrimSpace(addr)
		if addr == "" {
			continue
		}
		if _, err := c.addEndpoint(addr); err != nil {
			c.Close()
			return nil, err
		}
	}
	if len(c.all()) == 0 {
		return nil, fmt.Errorf("%w: no endpoint given", ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Close closes the connections, and returns once every goroutine of the
// client's sessions has ended. Its sessions stop renewing: those not
// closed before are over, with ErrClosed, and their holds Lost (on the
// server they live until their TTL runs out; Session.Close first ends
// them at once). Calling it again does nothing and returns nil.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	sessions := make([]*Session, 0, len(c.sessions))
	for s := range c.sessions {
		sessions = append(sessions, s)
	}
	c.mu.Unlock()
	c.bgCancel()
	c.bg.Wait()
	for _, s := range sessions {
		s.abandon(fmt.Errorf("%w: the client was closed", ErrClosed))
	}
	var first error
	for _, ep := range c.all() {
		ep.sessions.close()
		if err := ep.conn.Close(); err != nil && first == nil {
			first = err
		}
	}
	for _, s := range sessions {
		s.wg.Wait()
	}
	return first
}

// track records s as one of the client's sessions and starts its keeper,
// unless the client is closed (ErrClosed). Both happen under mu, so that
// Close either finds s and waits for its keeper, or track fails.
func (c *Client) track(s *Session) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	c.sessions[s] = struct{}{}
	s.goBG(s.keeper)
	return nil
}

// untrack forgets s, once it is over.
func (c *Client) untrack(s *Session) {
	c.mu.Lock()
	delete(c.sessions, s)
	c.mu.Unlock()
}

// addEndpoint connects to addr (without waiting) and returns its index,
// or the index it already has. It fails when the client is closed or
// already has maxEndpoints.
func (c *Client) addEndpoint(addr string) (uint32, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	eps := c.all()
	for i, ep := range eps {
		if ep.addr == addr {
			return uint32(i), nil
		}
	}
	switch {
	case c.closed:
		return 0, ErrClosed
	case len(eps) >= maxEndpoints:
		return 0, fmt.Errorf("%w: more than %d endpoints", ErrLimit, maxEndpoints)
	}
	i := uint32(len(eps))
	gopts := append(append(make([]grpc.DialOption, 0, len(c.gopts)+1), c.gopts...), grpc.WithChainUnaryInterceptor(c.hintInterceptor(i)))
	conn, err := grpc.NewClient(addr, gopts...)
	if err != nil {
		return 0, fmt.Errorf("%w: endpoint %q: %v", ErrInvalid, addr, err)
	}
	api := pb.NewTenureClient(conn)
	next := append(append(make([]*endpoint, 0, len(eps)+1), eps...), &endpoint{addr: addr, conn: conn, api: api, sessions: &transport{api: api, hint: func(md metadata.MD) { c.hinted(i, md) }}})
	c.eps.Store(&next)
	return uint32(len(eps)), nil
}

// learn asks endpoint i for the members and adds their client addresses
// (WithDiscovery); a list of one member adds nothing. Errors are ignored:
// the endpoints known so far serve on.
func (c *Client) learn(ctx context.Context, i uint32) {
	ctx, cancel := context.WithTimeout(ctx, learnTimeout)
	defer cancel()
	resp, err := c.all()[i].api.MemberList(ctx, &pb.MemberListRequest{})
	if err != nil || len(resp.GetMembers()) < 2 {
		return
	}
	for _, m := range resp.GetMembers() {
		if a := m.GetClientAddr(); a != "" {
			if _, err := c.addEndpoint(a); err != nil {
				return
			}
		}
	}
}

// learnTimeout bounds one member list asked for by learn.
const learnTimeout = 2 * time.Second

// follow moves the client to the leader that err names (a member's "not
// the leader" answer with the leader's address): an endpoint it has, or,
// WithDiscovery, a new one. It reports whether it moved.
func (c *Client) follow(err error, from uint32) bool {
	var we *wireError
	if !errors.As(err, &we) || we.leaderAddr == "" {
		return false
	}
	j, known := uint32(0), false
	for k, ep := range c.all() {
		if ep.addr == we.leaderAddr {
			j, known = uint32(k), true
			break
		}
	}
	if !known {
		if !c.discover {
			return false
		}
		var aerr error
		if j, aerr = c.addEndpoint(we.leaderAddr); aerr != nil {
			return false
		}
	}
	return j != from && c.cur.CompareAndSwap(from, j)
}

// Endpoint is the address currently in use.
func (c *Client) Endpoint() string {
	eps := c.all()
	return eps[c.cur.Load()%uint32(len(eps))].addr
}

// next moves on from endpoint i (unless another caller already did).
func (c *Client) next(i uint32) {
	c.cur.CompareAndSwap(i, (i+1)%uint32(len(c.all())))
}

// unavailable reports whether err means "try another node": the node
// could not be reached, or it is not the leader.
func unavailable(err error) bool {
	return status.Code(err) == codes.Unavailable || errors.Is(err, ErrUnavailable)
}

// rotate is the one place the client moves between endpoints. It runs try
// against the endpoint in use and, while an endpoint cannot serve (it
// cannot be reached, or it answers that it is not the leader or knows
// none), moves on through the others, in rounds with a growing pause,
// until one answers otherwise or ctx ends. A node that answered "not the
// leader" is asked again in the next round (a leader may be elected
// meanwhile), also when it is the only endpoint; a single endpoint that
// cannot be reached fails at once, unless persist (a watch that outlives
// a restart of its node). When ctx ends first, the error says that no
// leader answered and names the endpoints.
func (c *Client) rotate(ctx context.Context, persist bool, try func(ep uint32) error) error {
	backoff := 20 * time.Millisecond
	everAnswered := false // some node answered "not the leader"
	for {
		var err error
		answered := false
		n := len(c.all())
		for range n {
			i := c.cur.Load() % uint32(len(c.all()))
			if err = try(i); !unavailable(err) {
				if err == nil && c.discover && c.learned.CompareAndSwap(false, true) {
					c.learn(ctx, i)
				}
				return err
			}
			answered = answered || notLeader(err)
			if !c.follow(err, i) { // a leader named: go there next
				c.next(i)
			}
		}
		everAnswered = everAnswered || answered
		if n == 1 && len(c.all()) == 1 && !answered && !persist {
			return err
		}
		if now := time.Now().UnixNano(); c.discover && now-c.learnedAt.Load() >= int64(time.Second) {
			// No endpoint known could serve: ask them for members that
			// may (at most once a second).
			c.learnedAt.Store(now)
			for i := range c.all() {
				if c.learn(ctx, uint32(i)); len(c.all()) > n {
					break
				}
			}
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			if !everAnswered {
				return err
			}
			return fmt.Errorf("%w at %s within the time given (%v; last answer: %v)", ErrNoLeader, c.endpoints(), ctx.Err(), err)
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// endpoints lists the client's endpoints, comma-separated.
func (c *Client) endpoints() string {
	eps := c.all()
	addrs := make([]string, len(eps))
	for i, ep := range eps {
		addrs[i] = ep.addr
	}
	return strings.Join(addrs, ",")
}

// unary runs a request with rotate: on the leader, waiting for one within
// ctx.
func (c *Client) unary(ctx context.Context, fn func(pb.TenureClient) error) error {
	return c.rotate(ctx, false, func(i uint32) error { return fromStatus(fn(c.all()[i].api)) })
}

// PutResult is the answer of a fenced register write or delete.
type PutResult struct {
	// Accepted is true when the write was applied (now or, for a
	// Duplicate, the first time this operation id was seen).
	Accepted bool
	// Duplicate is true when the operation id had been seen before:
	// nothing was applied by this call.
	Duplicate bool
	// Token is the register's accepted token after the call; after a
	// FencedDelete, or for a register that does not exist, the token a
	// write to the key must reach.
	Token uint64
	// Revision is the service's revision after the call.
	Revision uint64
}

// FenceOption configures one fenced write (FencedPut, FencedDelete).
type FenceOption func(*fenceOptions) error

type fenceOptions struct{ lock, proof string }

// WithLock names the lock whose grant carried the token. The write is then
// accepted only while the token is a current grant of that lock (any of
// its holders, for a semaphore or a read-write lock), in addition to the
// register's own check: a holder whose grant has ended is stale even if no
// newer holder has written yet. An empty name is an error.
func WithLock(name string) FenceOption {
	return func(o *fenceOptions) error {
		if name == "" {
			return fmt.Errorf("%w: WithLock: the lock name is empty", ErrInvalid)
		}
		o.lock = name
		return nil
	}
}

func applyFenceOptions(opts []FenceOption) (fenceOptions, error) {
	var o fenceOptions
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return o, err
		}
	}
	return o, nil
}

// UnissuedTokenError is the ErrInvalid of a fenced write whose token the
// service never issued: tokens are the service's revisions at their
// grants, and this one is above its revision. Nothing was stored.
type UnissuedTokenError struct {
	// Token is the refused token.
	Token uint64
	// Revision is the service's revision when it refused the write.
	Revision uint64
	msg      string
}

func (e *UnissuedTokenError) Error() string { return e.msg }

// Unwrap makes errors.Is(err, ErrInvalid) hold.
func (e *UnissuedTokenError) Unwrap() error { return ErrInvalid }

// WrongLockError is the ErrInvalid of a fenced write that named a lock
// other than the one its register is bound to: a register is bound to the
// lock named by its first accepted write that named one, and takes tokens
// of that lock only. Nothing was stored.
type WrongLockError struct {
	// Key is the register's key.
	Key string
	// Bound is the lock the register is bound to.
	Bound string
	// Lock is the lock the write named.
	Lock string
	// Token is the refused token.
	Token uint64
	// Revision is the service's revision when it refused the write.
	Revision uint64
	msg      string
}

func (e *WrongLockError) Error() string { return e.msg }

// Unwrap makes errors.Is(err, ErrInvalid) hold.
func (e *WrongLockError) Unwrap() error { return ErrInvalid }

// fencedCall runs a fenced write's RPC: it returns the call's error as
// unary does, as an *UnissuedTokenError when the service says the token
// was never issued, and as a *WrongLockError when the write named another
// lock than its register's.
func (c *Client) fencedCall(ctx context.Context, call func(api pb.TenureClient) error) error {
	var raw error
	err := c.unary(ctx, func(api pb.TenureClient) error {
		raw = call(api)
		return raw
	})
	if st, ok := status.FromError(raw); ok && errors.Is(err, ErrInvalid) {
		for _, d := range st.Details() {
			switch d := d.(type) {
			case *pb.UnissuedToken:
				return &UnissuedTokenError{Token: d.GetToken(), Revision: d.GetRevision(), msg: st.Message()}
			case *pb.WrongLock:
				return &WrongLockError{Key: d.GetKey(), Bound: d.GetBound(), Lock: d.GetLock(), Token: d.GetToken(), Revision: d.GetRevision(), msg: st.Message()}
			case *pb.ForgedProof:
				return &ForgedProofError{Token: d.GetToken(), Lock: d.GetLock(), Reason: d.GetReason(), msg: st.Message()}
			}
		}
	}
	return err
}

// fencedResult turns a fenced write's answer into a PutResult, and a stale
// one into an error matching ErrStale.
func fencedResult(result pb.PutResult, duplicate bool, accepted, revision, token uint64, lock string) (PutResult, error) {
	r := PutResult{Accepted: result == pb.PutResult_PUT_RESULT_ACCEPTED, Duplicate: duplicate, Token: accepted, Revision: revision}
	switch {
	case r.Accepted || r.Duplicate:
		return r, nil
	case token < accepted:
		return r, fmt.Errorf("%w: token %d is below the accepted token %d", ErrStale, token, accepted)
	case lock == "":
		return r, fmt.Errorf("%w: token %d is not a current grant of the lock the register is bound to", ErrStale, token)
	default:
		return r, fmt.Errorf("%w: token %d is not a current grant of lock %q", ErrStale, token, lock)
	}
}

// FencedPut writes value to the register key iff token is at least the
// highest token the register has accepted (after a FencedDelete of key:
// at least the delete's token). A lower token returns the result and an
// error matching ErrStale; the register is unchanged. Replaying an
// operationID returns the first result and applies nothing. A token the
// service never issued (above its revision) is refused with an
// *UnissuedTokenError (ErrInvalid), and nothing is stored. WithLock adds
// the lock's check, and binds the register to that lock if it is not bound
// yet: every later write is then checked against it, named or not, and one
// naming another lock is refused with a *WrongLockError (ErrInvalid).
//
// With several endpoints, a write whose node stops answering is retried on
// the next one, so it may be applied twice; with an operationID the retry
// is recognised (Duplicate). Always pass one when that matters.
func (c *Client) FencedPut(ctx context.Context, key string, value []byte, token uint64, operationID string, opts ...FenceOption) (PutResult, error) {
	o, err := applyFenceOptions(opts)
	if err != nil {
		return PutResult{}, err
	}
	var resp *pb.FencedPutResponse
	err = c.fencedCall(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.FencedPut(ctx, &pb.FencedPutRequest{Key: key, Value: value, Token: token, OperationId: operationID, Lock: o.lock, Proof: o.proof})
		return err
	})
	if err != nil {
		return PutResult{}, err
	}
	return fencedResult(resp.GetResult(), resp.GetDuplicate(), resp.GetToken(), resp.GetRevision(), token, o.lock)
}

// FencedDelete removes the register key, with the checks and answers of
// FencedPut (the token against the register's, WithLock, operationID, a
// token never issued). Token is the key's accepted token after the call:
// the service remembers it, so a later write to key needs at least this
// token (see docs/fencing.md for how long). The register's operation ids
// are removed with it. Deleting a register that does not exist is
// accepted, and raises the key's token all the same.
func (c *Client) FencedDelete(ctx context.Context, key string, token uint64, operationID string, opts ...FenceOption) (PutResult, error) {
	o, err := applyFenceOptions(opts)
	if err != nil {
		return PutResult{}, err
	}
	var resp *pb.FencedDeleteResponse
	err = c.fencedCall(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.FencedDelete(ctx, &pb.FencedDeleteRequest{Key: key, Token: token, OperationId: operationID, Lock: o.lock, Proof: o.proof})
		return err
	})
	if err != nil {
		return PutResult{}, err
	}
	return fencedResult(resp.GetResult(), resp.GetDuplicate(), resp.GetToken(), resp.GetRevision(), token, o.lock)
}

// Register is a fenced register's content.
type Register struct {
	Key         string
	Value       []byte
	Token       uint64
	Found       bool
	ModRevision uint64
	// Lock is the lock the register is bound to ("" none): every write
	// is checked against it (FencedPut).
	Lock string
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
	return Register{Key: resp.GetKey(), Value: resp.GetValue(), Token: resp.GetToken(), Found: resp.GetFound(), ModRevision: resp.GetModRevision(), Lock: resp.GetLock()}, nil
}

// errEmptyPage: the server said more follows but listed nothing.
var errEmptyPage = errors.New("tenure: the server answered a page with nothing in it but more to come")

// LockStatus describes a lock: its holders and its waiters, each in grant
// order (following the server's pages; the fields other than Holders and
// Waiters are the first page's).
func (c *Client) LockStatus(ctx context.Context, name string) (*pb.LockStatusResponse, error) {
	req := &pb.LockStatusRequest{Name: name, Serializable: c.serializable}
	var out *pb.LockStatusResponse
	for {
		var resp *pb.LockStatusResponse
		err := c.unary(ctx, func(api pb.TenureClient) (err error) {
			resp, err = api.LockStatus(ctx, req)
			return err
		})
		if err != nil {
			return nil, err
		}
		if out == nil {
			out = resp
		} else {
			out.Holders = append(out.Holders, resp.GetHolders()...)
			out.Waiters = append(out.Waiters, resp.GetWaiters()...)
		}
		hs, ws := resp.GetHolders(), resp.GetWaiters()
		switch {
		case !resp.GetMoreHolders() && !resp.GetMoreWaiters():
			out.MoreHolders, out.MoreWaiters = false, false
			return out, nil
		case len(hs)+len(ws) == 0:
			return nil, errEmptyPage
		}
		// Each list goes on after its last item listed; a list that is
		// over is skipped (2^64-1); one this page had no room for starts
		// again where it was.
		switch {
		case !resp.GetMoreHolders():
			req.HoldersAfter = math.MaxUint64
		case len(hs) > 0:
			req.HoldersAfter = hs[len(hs)-1].GetToken()
		}
		switch {
		case !resp.GetMoreWaiters():
			req.WaitersAfter = math.MaxUint64
		case len(ws) > 0:
			req.WaitersAfter = ws[len(ws)-1].GetQueuedRevision()
		}
	}
}

// Locks lists the locks (mutexes, semaphores, read-write locks and
// elections) whose names start with prefix ("" is every lock), by name,
// each with its kind, permits, first holders, how many hold it and wait
// for it, and the lock-delay that holds it back (following the server's
// pages).
func (c *Client) Locks(ctx context.Context, prefix string) (*pb.ListLocksResponse, error) {
	return c.LocksFrom(ctx, prefix, "", 0)
}

// LocksFrom is Locks for the names after after, at most limit of them (0:
// all); More says that names were left out (go on after the last one).
func (c *Client) LocksFrom(ctx context.Context, prefix, after string, limit int) (*pb.ListLocksResponse, error) {
	req := &pb.ListLocksRequest{Prefix: prefix, After: after, Serializable: c.serializable}
	out := &pb.ListLocksResponse{}
	for first := true; ; first = false {
		if limit > 0 {
			req.Limit = uint32(min(limit-len(out.Locks), math.MaxUint32))
		}
		var resp *pb.ListLocksResponse
		err := c.unary(ctx, func(api pb.TenureClient) (err error) {
			resp, err = api.ListLocks(ctx, req)
			return err
		})
		if err != nil {
			return nil, err
		}
		if first {
			out.Revision = resp.GetRevision()
		}
		out.Locks = append(out.Locks, resp.GetLocks()...)
		if !resp.GetMore() {
			return out, nil
		}
		if limit > 0 && len(out.Locks) >= limit {
			out.More = true
			return out, nil
		}
		if len(resp.GetLocks()) == 0 {
			return nil, errEmptyPage
		}
		req.After = resp.GetLocks()[len(resp.GetLocks())-1].GetName()
	}
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

// Sessions lists the live sessions by id (following the server's pages).
// A session names at most 1,000 of the locks it holds, and of those it
// waits for; HeldCount and WaitingCount count them all.
func (c *Client) Sessions(ctx context.Context) (*pb.ListSessionsResponse, error) {
	req := &pb.ListSessionsRequest{Serializable: c.serializable}
	out := &pb.ListSessionsResponse{}
	for first := true; ; first = false {
		var resp *pb.ListSessionsResponse
		err := c.unary(ctx, func(api pb.TenureClient) (err error) {
			resp, err = api.ListSessions(ctx, req)
			return err
		})
		if err != nil {
			return nil, err
		}
		if first {
			out.Revision = resp.GetRevision()
		}
		out.Sessions = append(out.Sessions, resp.GetSessions()...)
		if !resp.GetMore() {
			return out, nil
		}
		if len(resp.GetSessions()) == 0 {
			return nil, errEmptyPage
		}
		req.AfterId = resp.GetSessions()[len(resp.GetSessions())-1].GetId()
	}
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

// AddMember adds a voter (sent to the leader) once its peer at peerAddr
// answers: the leader waits for that up to ctx's deadline and changes
// nothing before. force allows an even number of voters.
func (c *Client) AddMember(ctx context.Context, id, peerAddr string, force bool) (*pb.MemberListResponse, error) {
	var resp *pb.MemberListResponse
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.MemberAdd(ctx, &pb.MemberAddRequest{Id: id, PeerAddr: peerAddr, Force: force})
		return err
	})
	return resp, err
}

// RebuildMember rebuilds member id, whose data was lost, from the others
// (sent to the leader): once its peer at peerAddr answers (the leader
// waits for that up to ctx's deadline, and changes nothing before), its
// old voter entry is removed and it is added back as AddMember adds. Run
// again after an interruption, it only adds the member. force allows an
// even number of voters when id was not a voter before.
func (c *Client) RebuildMember(ctx context.Context, id, peerAddr string, force bool) (*pb.MemberListResponse, error) {
	var resp *pb.MemberListResponse
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.MemberAdd(ctx, &pb.MemberAddRequest{Id: id, PeerAddr: peerAddr, Force: force, Rebuild: true})
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

// TransferLeadership asks the leader to hand leadership to the voter id
// ("": the most up to date one) and returns the member that leads then.
func (c *Client) TransferLeadership(ctx context.Context, id string) (string, error) {
	var resp *pb.MemberTransferLeadershipResponse
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.MemberTransferLeadership(ctx, &pb.MemberTransferLeadershipRequest{Id: id})
		return err
	})
	return resp.GetLeader(), err
}

// Limits reads the cluster's replicated admission limits.
func (c *Client) Limits(ctx context.Context) (*pb.LimitsResponse, error) {
	var resp *pb.LimitsResponse
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.GetLimits(ctx, &pb.GetLimitsRequest{})
		return err
	})
	return resp, err
}

// SetLimits changes the cluster's replicated admission limits: the fields
// of change that are not 0 (the others keep their values). It returns the
// limits in force afterwards.
func (c *Client) SetLimits(ctx context.Context, change *pb.ClusterLimits) (*pb.LimitsResponse, error) {
	var resp *pb.LimitsResponse
	err := c.unary(ctx, func(api pb.TenureClient) (err error) {
		resp, err = api.SetLimits(ctx, &pb.SetLimitsRequest{Limits: change})
		return err
	})
	return resp, err
}

// sessionTimeout bounds a keepalive round trip when nothing else does.
const sessionTimeout = 5 * time.Second

// SaveSnapshot writes a consistent copy of the whole service state to w
// (for backups), sealed with a checksum and the cluster's id, and returns
// its size. It holds the cluster's private signing keys: keep it like a
// private key (a file of mode 0600).
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

// RestoreOption changes how RestoreSnapshot may replace the state.
type RestoreOption func(*pb.SnapshotChunk)

// FromCluster allows restoring a snapshot saved by the cluster with id
// clusterID (hex, as `tenure cluster keys` prints it; "none" for a
// snapshot that names no cluster): without it a snapshot of another
// cluster is refused. The running cluster's ACLs and signing keys are
// still kept unless ReplaceKeys.
func FromCluster(clusterID string) RestoreOption {
	return func(c *pb.SnapshotChunk) { c.FromCluster = clusterID }
}

// ReplaceKeys takes the snapshot's ACLs, signing keys and cluster id
// instead of keeping the running cluster's: tokens and keys of the
// snapshot work again, and the running cluster's stop working.
func ReplaceKeys() RestoreOption {
	return func(c *pb.SnapshotChunk) { c.ReplaceKeys = true }
}

// AboveRevision makes the restored state continue above rev and keeps
// tokens up to it stale: the revision a lost data directory had reached.
func AboveRevision(rev uint64) RestoreOption {
	return func(c *pb.SnapshotChunk) { c.AboveRevision = rev }
}

// RestoreSnapshot replaces the state with a snapshot read from r (disaster
// recovery), a sealed file as SaveSnapshot writes it: an empty, cut,
// changed or unsealed file is refused (ErrInvalid), force or not, and so
// is a state whose tokens are not at or below its revision, and a
// snapshot of another cluster unless FromCluster names it. The running
// cluster's ACLs and signing keys are kept unless ReplaceKeys. The
// revision never goes back: the restored state continues above the
// cluster's, and tokens issued before the restore stay stale. A snapshot
// older than the cluster's state is refused unless force.
func (c *Client) RestoreSnapshot(ctx context.Context, r io.Reader, force bool, opts ...RestoreOption) (*pb.SnapshotRestoreResponse, error) {
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
			msg := &pb.SnapshotChunk{Data: rest[:n]}
			if first {
				msg.Force = force
				for _, o := range opts {
					o(msg)
				}
			}
			if err := stream.Send(msg); err != nil {
				break // the error comes with CloseAndRecv
			}
			rest = rest[n:]
		}
		resp, err = stream.CloseAndRecv()
		return err
	})
	return resp, err
}
