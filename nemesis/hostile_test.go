//go:build linux || darwin

package nemesis

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

// The hostile client runs beside the workload while the nemesis runs, with
// nothing but the public API, and tries what an adversary who can reach
// the service would: resume the sessions of the lock holders (their ids
// are public: session list, lock status), which would let it release
// their locks, close their sessions or keep a crashed holder's session
// alive; release a holder's grant from its own session with the holder's
// token; write the workload's registers with tokens nobody was issued; and
// restore an old snapshot, which would move the revision, and so the
// tokens, backwards. Every attempt must fail. The queue workload has a
// hostile client of its own (foreign acks, queue_test.go).
const checkHostile = "hostile-client"

// hostile attempt kinds.
const (
	hostileResume  = "resume another session"
	hostileRelease = "release another's grant"
	hostileToken   = "write with an unissued token"
	hostileRestore = "restore an older snapshot"
)

var hostileKinds = []string{hostileResume, hostileRelease, hostileToken, hostileRestore}

// hostileClient records, per kind, how its attempts ended.
type hostileClient struct {
	eps  string
	keys []string // the workload's registers
	lock string   // a lock the workload uses

	// mu guards the fields below.
	mu       sync.Mutex
	refused  map[string]int      // failed as they must (the expected code)
	failed   map[string]int      // failed otherwise (a fault: unavailable, timeout)
	accepted map[string][]string // succeeded: each one an anomaly
}

func newHostileClient(eps string, keys []string, lock string) *hostileClient {
	return &hostileClient{eps: eps, keys: keys, lock: lock, refused: make(map[string]int), failed: make(map[string]int), accepted: make(map[string][]string)}
}

func (h *hostileClient) note(kind string, refused bool, err error, what string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case err == nil:
		h.accepted[kind] = append(h.accepted[kind], what)
	case refused:
		h.refused[kind]++
	default:
		h.failed[kind]++
	}
}

// run attacks until ctx ends.
func (h *hostileClient) run(ctx context.Context, rnd *rand.Rand) {
	c, err := dialClient(ctx, h.eps)
	if err != nil {
		return
	}
	defer c.Close()
	var apis []pb.TenureClient
	for _, ep := range strings.Split(h.eps, ",") {
		conn, err := grpc.NewClient(ep, grpcCredentials()...)
		if err != nil {
			return
		}
		defer conn.Close()
		apis = append(apis, pb.NewTenureClient(conn))
	}
	// An old snapshot, saved before the workload has gone far.
	var old bytes.Buffer
	for ctx.Err() == nil && old.Len() == 0 {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if _, err := c.SaveSnapshot(sctx, &old); err != nil {
			old.Reset()
		}
		cancel()
		pace(ctx, 200*time.Millisecond)
	}
	var own *client.Session
	defer func() {
		if own != nil {
			cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = own.Close(cctx)
			cancel()
		}
	}()
	for i := 0; ctx.Err() == nil; i++ {
		api := apis[rnd.IntN(len(apis))]
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		switch kind := hostileKinds[i%len(hostileKinds)]; kind {
		case hostileResume:
			h.resume(cctx, c, api, rnd)
		case hostileRelease:
			if own != nil {
				select {
				case <-own.Done(): // expired (a fault outlasted its TTL): open another
					own = nil
				default:
				}
			}
			if own == nil {
				if s, err := c.NewSession(cctx, client.WithOwner("hostile"), client.WithTTL(2*time.Second)); err == nil {
					own = s
				}
			}
			h.release(cctx, c, api, own)
		case hostileToken:
			key := h.keys[rnd.IntN(len(h.keys))]
			st, err := c.Status(cctx)
			if err != nil {
				h.note(kind, false, err, "")
				break
			}
			token := st.GetRevision() + 1_000_000_000 + rnd.Uint64N(1_000_000)
			_, err = api.FencedPut(cctx, &pb.FencedPutRequest{Key: key, Value: []byte("hostile"), Token: token})
			h.note(kind, status.Code(err) == codes.InvalidArgument, err, fmt.Sprintf("put %s with token %d", key, token))
		case hostileRestore:
			_, err := c.RestoreSnapshot(cctx, bytes.NewReader(old.Bytes()), false)
			h.note(kind, errors.Is(err, client.ErrInvalid), err, "restore without --force")
		}
		cancel()
		pace(ctx, time.Duration(20+rnd.IntN(40))*time.Millisecond)
	}
}

// resume opens a session stream naming a live session of the workload
// with no secret or a made-up one.
func (h *hostileClient) resume(ctx context.Context, c *client.Client, api pb.TenureClient, rnd *rand.Rand) {
	st, err := c.LockStatus(ctx, h.lock)
	if err != nil || st.GetHolder() == nil {
		return // nobody to attack now; not an attempt
	}
	victim := st.GetHolder().GetSession()
	var secret []byte
	if rnd.IntN(2) == 0 {
		secret = make([]byte, 16)
		for i := range secret {
			secret[i] = byte(rnd.UintN(256))
		}
	}
	stream, err := testutil.OpenRawSession(ctx, api)
	if err == nil {
		err = stream.Send(&pb.SessionRequest{Id: 1, Op: &pb.SessionRequest_Open{Open: &pb.OpenSession{SessionId: victim, TtlMs: 2000, Secret: secret}}})
	}
	if err == nil {
		var resp *pb.SessionResponse
		if resp, err = stream.Recv(); err == nil && resp.GetOpened() == nil {
			err = fmt.Errorf("unexpected answer %v", resp)
		}
	}
	h.note(hostileResume, status.Code(err) == codes.PermissionDenied, err, fmt.Sprintf("resumed session %d with secret %x", victim, secret))
}

// release asks, on the hostile client's own session, to release the
// current holder's grant of the workload's lock with the holder's token.
func (h *hostileClient) release(ctx context.Context, c *client.Client, api pb.TenureClient, own *client.Session) {
	if own == nil {
		return
	}
	st, err := c.LockStatus(ctx, h.lock)
	if err != nil || st.GetHolder() == nil {
		return
	}
	holder := st.GetHolder()
	stream, err := testutil.OpenRawSession(ctx, api)
	if err == nil {
		err = stream.Send(&pb.SessionRequest{Id: 1, Op: &pb.SessionRequest_Open{Open: &pb.OpenSession{SessionId: own.ID(), TtlMs: 2000, Secret: own.Secret()}}})
	}
	var resp *pb.SessionResponse
	if err == nil {
		resp, err = stream.Recv()
	}
	if err != nil || resp.GetOpened() == nil {
		h.note(hostileRelease, false, fmt.Errorf("opening its own session: %v %v", resp, err), "")
		return
	}
	if err = stream.Send(&pb.SessionRequest{Id: 2, Op: &pb.SessionRequest_Release{Release: &pb.ReleaseLock{Name: h.lock, Token: holder.GetToken()}}}); err == nil {
		if resp, err = stream.Recv(); err == nil {
			if e := resp.GetError(); e != nil {
				err = status.Error(codes.Code(e.GetCode()), e.GetMessage())
			}
		}
	}
	h.note(hostileRelease, status.Code(err) == codes.FailedPrecondition, err, fmt.Sprintf("released %s token %d of session %d", h.lock, holder.GetToken(), holder.GetSession()))
}

// check reports each accepted attempt, and a kind never refused (the
// hostile client then did not test anything).
func (h *hostileClient) check(r *report) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var parts []string
	for _, kind := range hostileKinds {
		for _, a := range h.accepted[kind] {
			r.anomaly(checkHostile, "%s: accepted: %s", kind, a)
		}
		if h.refused[kind] == 0 {
			r.anomaly(checkHostile, "%s: never refused (%d failed otherwise): the attempt never reached the service", kind, h.failed[kind])
		}
		parts = append(parts, fmt.Sprintf("%s: %d refused, %d accepted, %d failed otherwise", kind, h.refused[kind], len(h.accepted[kind]), h.failed[kind]))
	}
	r.line("hostile client: %s", strings.Join(parts, "; "))
}

// TestHostileChecker: the hostile client's check reports an accepted
// attempt and an attack that never reached the service, and nothing for a
// run where every attempt was refused.
func TestHostileChecker(t *testing.T) {
	clean := func() *hostileClient {
		h := newHostileClient("", nil, "")
		for _, k := range hostileKinds {
			h.refused[k] = 3
		}
		return h
	}
	var r report
	clean().check(&r)
	if len(r.anomalies) != 0 {
		t.Fatalf("clean run: %v", r.anomalies)
	}
	h := clean()
	h.accepted[hostileResume] = []string{"resumed session 7"}
	h.refused[hostileToken] = 0
	r = report{}
	h.check(&r)
	if len(r.anomalies) != 2 {
		t.Fatalf("anomalies %v, want the accepted resume and the token attack that never ran", r.anomalies)
	}
}
