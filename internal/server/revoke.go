package server

// Revocation reaches open streams.
//
// A stream (a kv watch, an Observe, a session stream, a waiting dequeue)
// is authorized when it opens; its caller's credential (the auth token in
// its metadata, or its verified client certificate) stays in its context.
// Its rights are checked again against this node's current ACLs
//
//   - before every event it delivers: the node publishes the ACLs of an
//     applied batch of log entries before it hands that batch's events to
//     the hub (fsm.FSM.ApplyBatch), so a stream that delivers an event of
//     revision R checks ACLs that hold every change committed before R,
//     and no event written after a revocation reaches the revoked caller;
//   - whenever the ACLs change (aclFeed), so that an idle stream ends too.
//
// A stream whose caller no longer has its rights ends with
// PERMISSION_DENIED, on a follower as on the leader: a follower's copy of
// the ACLs only moves forward, so once it denies what it allowed when the
// stream opened, a later change took the right away.

import (
	"context"
	"fmt"
	"sync/atomic"

	"google.golang.org/grpc/codes"

	"github.com/tenure-io/tenure/internal/fsm"
)

// aclFeed tells open streams that the node's ACLs (fsm.Security) changed.
// The hub feeds it every applied batch and restore; it compares the
// Security the node publishes with the last one seen (one pointer
// compare per batch) and, when it changed, closes the channel streams
// wait on and puts a new one in its place. Safe for concurrent use.
type aclFeed struct {
	// source returns the node's current ACLs; nil until a server is
	// made for the hub (nothing is fed before).
	source atomic.Pointer[func() *fsm.Security]
	// last is the Security last seen (written on the apply goroutine).
	last atomic.Pointer[fsm.Security]
	// ch is closed when the ACLs change.
	ch atomic.Pointer[chan struct{}]
	// onChange, if set, is called with the new ACLs on the apply
	// goroutine; it must not block.
	onChange atomic.Pointer[func(*fsm.Security)]
}

func newACLFeed() *aclFeed {
	f := &aclFeed{}
	ch := make(chan struct{})
	f.ch.Store(&ch)
	return f
}

// changed returns a channel closed at the next change of the ACLs. Take it
// before reading the ACLs: a change after that read closes it.
func (f *aclFeed) changed() <-chan struct{} { return *f.ch.Load() }

// feed looks for a change of the ACLs, after an applied batch or a
// restore; it never blocks.
func (f *aclFeed) feed() {
	src := f.source.Load()
	if src == nil {
		return
	}
	sec := (*src)()
	if sec == f.last.Load() {
		return
	}
	f.last.Store(sec)
	ch := make(chan struct{})
	close(*f.ch.Swap(&ch))
	if fn := f.onChange.Load(); fn != nil {
		(*fn)(sec)
	}
}

// ACLChanged returns a channel closed at the next change of this node's
// ACLs (tokens, policies, bindings, their enforcement, signing keys), for
// the streams of the other APIs a node serves: take it, then check the
// stream's rights against the node's ACLs, and check again once it is
// closed. Safe for concurrent use.
func (s *Server) ACLChanged() <-chan struct{} { return s.hub.acl.changed() }

// streamRights re-checks the rights an open stream needs (see the top of
// this file). It is not safe for concurrent use: each stream has its own.
type streamRights struct {
	s   *Server
	ctx context.Context // the stream's: it holds the caller's credential
	// method names the stream in a denial.
	method string
	rights []right
	// sec and err: the ACLs last checked against, and the answer then.
	sec *fsm.Security
	err error
}

// streamRights returns the re-check of rights for a stream opened with
// ctx.
func (s *Server) streamRights(ctx context.Context, method string, rights ...right) *streamRights {
	return &streamRights{s: s, ctx: ctx, method: method, rights: rights}
}

// check returns nil while the stream's caller holds every right under
// this node's current ACLs (or nothing is enforced), else the
// PERMISSION_DENIED that ends the stream. It resolves the caller again
// only when the ACLs changed.
func (r *streamRights) check() error {
	sec := r.s.acls()
	if sec == r.sec {
		return r.err
	}
	r.sec = sec
	r.err = nil
	if r.s.enforcedBy(sec) {
		r.err = r.s.revoked(callerOf(r.ctx, sec), sec, r.method, r.rights...)
	}
	return r.err
}

// revoked returns the PERMISSION_DENIED of an open stream whose caller c
// lacks one of rights under sec, and logs it; nil if c has them all.
// Unlike deny, a follower answers it too (see the top of this file).
func (s *Server) revoked(c caller, sec *fsm.Security, method string, rights ...right) error {
	for _, r := range rights {
		if !allowed(c, sec, r) {
			err := fmt.Errorf("%w: %s: %s is no longer granted to %s; the stream ends", fsm.ErrPermissionDenied, method, r, c)
			s.refused(method, codes.PermissionDenied, err.Error())
			return err
		}
	}
	return nil
}

// aclChanged serves a change of the node's ACLs (on the apply goroutine):
// a leader started with --auth makes sure the cluster still enforces
// them, for a restore may have brought back a state from before they
// were enforced.
func (s *Server) aclChanged(sec *fsm.Security) {
	if s.auth && !sec.Enforced && s.node.IsLeader() {
		s.workers.Go(leafWork, func() {
			ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
			defer cancel()
			s.ensureEnforced(ctx)
		})
	}
}
