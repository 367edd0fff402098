package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	pb "github.com/tenure-io/tenure/api/tenurepb"
)

// Leader describes an election's leader. Session 0 means there is none.
type Leader struct {
	Owner    string
	Session  uint64
	Token    uint64
	Value    []byte
	Revision uint64
}

// Election is leader election on a name: the leader is the holder of the
// name's lock, its token is the leader token (fencing), and it publishes a
// value. Leadership follows the same ownership states as a lock hold: its
// Context is cancelled the moment it becomes suspect.
type Election struct {
	m *Mutex
}

// Election returns a handle on the election called name.
func (s *Session) Election(name string) (*Election, error) {
	m, err := s.Mutex(name)
	if err != nil {
		return nil, err
	}
	return &Election{m: m}, nil
}

// Campaign waits (FIFO among candidates) until this session leads, then
// returns the leadership as a Hold whose Token is the leader token. Resign
// (or the hold's Unlock) gives it up.
func (e *Election) Campaign(ctx context.Context, value []byte, opts ...LockOption) (*Hold, error) {
	lc := lockCall{election: true, value: value}
	for _, o := range opts {
		o(&lc)
	}
	return e.m.acquire(ctx, true, lc)
}

// Resign gives up the leadership h holds; the next candidate in line leads
// with a larger token. Like Unlock, it answers ErrNotHeld when h no longer
// leads (its token is dead already) and is harmless to retry.
func (e *Election) Resign(ctx context.Context, h *Hold) error {
	if h == nil {
		return fmt.Errorf("%w: nil hold", ErrInvalid)
	}
	return h.Unlock(ctx)
}

// Proclaim replaces the leader's value without giving up leadership. It
// fails with ErrNotHeld if h no longer leads.
func (e *Election) Proclaim(ctx context.Context, h *Hold, value []byte) error {
	// Proclaiming the same value again is harmless, so call may resend it.
	o, err := e.m.s.do(ctx, &pb.SessionRequest{Op: &pb.SessionRequest_Proclaim{Proclaim: &pb.ProclaimValue{Name: e.m.name, Token: h.Token(), Value: value}}}, exchange{})
	if err != nil {
		return err
	}
	if pe := o.resp.GetError(); pe != nil {
		return fromProto(pe)
	}
	return nil
}

// Leader returns the current leader (linearizable read).
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	st, err := e.m.s.c.LockStatus(ctx, e.m.name)
	if err != nil {
		return Leader{}, err
	}
	h := st.GetHolder()
	return Leader{Owner: h.GetOwner(), Session: h.GetSession(), Token: h.GetToken(), Value: h.GetValue(), Revision: st.GetRevision()}, nil
}

// Observation is a stream of an election's leaders.
type Observation struct {
	// C receives the current leader first, then every change of leader or
	// value, in order. It is closed when the observation ends; Err then
	// says why (never nil after the close, unless ctx was cancelled).
	C   <-chan Leader
	err error
	end chan struct{}
}

// Err is the reason the observation ended: ctx.Err() when cancelled, or
// the error that ended it. Call it after C is closed.
func (o *Observation) Err() error {
	<-o.end
	return o.err
}

// observeGiveUp is how long an observation keeps trying to reach some
// endpoint before it ends with ErrUnavailable.
const observeGiveUp = 30 * time.Second

// Observe follows the election called name until ctx ends or an error
// occurs (reported by Err: the stream never ends silently). It returns
// once a node serves the observation; the current leader, its first
// answer, is the first value on C.
//
// When the node serving the observation dies or stops serving, the
// observation moves to the next endpoint and goes on. The new node answers
// with the current leader first; a leader that was already delivered is
// not delivered twice, but changes made while no node was observed are
// coalesced into that current leader (revisions still only grow). After
// 30 s without any endpoint serving it, it ends with ErrUnavailable.
func (c *Client) Observe(ctx context.Context, name string) (*Observation, error) {
	stream, first, err := c.openObserve(ctx, name)
	if err != nil {
		return nil, err
	}
	ch := make(chan Leader, 16)
	o := &Observation{C: ch, end: make(chan struct{})}
	go func() {
		defer close(o.end)
		defer close(ch)
		o.err = c.observe(ctx, name, stream, first, ch)
	}()
	return o, nil
}

// openObserve starts the observation of name on the leader or, if it
// cannot serve, another endpoint (Client.rotate), for at most
// observeGiveUp, and returns the stream and its first event.
func (c *Client) openObserve(ctx context.Context, name string) (pb.Tenure_ObserveClient, *pb.LeaderEvent, error) {
	gctx, cancel := context.WithTimeout(ctx, observeGiveUp)
	defer cancel()
	var stream pb.Tenure_ObserveClient
	var first *pb.LeaderEvent
	err := c.rotate(gctx, false, func(i uint32) error {
		st, err := c.all()[i].api.Observe(ctx, &pb.ObserveRequest{Name: name})
		if err == nil {
			first, err = st.Recv()
		}
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%w: the server ended the observation", ErrUnavailable)
		}
		stream = st
		return fromStatus(err)
	})
	if ctx.Err() != nil {
		return nil, nil, ctx.Err()
	}
	return stream, first, err
}

// observe delivers first and the events of stream (or of its successors
// on other endpoints) to ch and returns the error that ends the
// observation.
func (c *Client) observe(ctx context.Context, name string, stream pb.Tenure_ObserveClient, ev *pb.LeaderEvent, ch chan<- Leader) error {
	var last uint64 // revision of the last delivered change
	delivered := false
	for {
		if !delivered || ev.GetRevision() > last { // else delivered before a fail-over
			last, delivered = ev.GetRevision(), true
			select {
			case ch <- Leader{Owner: ev.GetOwner(), Session: ev.GetSession(), Token: ev.GetToken(), Value: ev.GetValue(), Revision: ev.GetRevision()}:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		var err error
		if ev, err = stream.Recv(); err == nil {
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, io.EOF) {
			err = fmt.Errorf("%w: the server ended the observation", ErrUnavailable)
		}
		if !unavailable(err) {
			return fromStatus(err)
		}
		if stream, ev, err = c.openObserve(ctx, name); err != nil {
			return err
		}
	}
}
