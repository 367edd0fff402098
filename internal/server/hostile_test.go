package server_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

// openRaw opens a session stream with open and returns the stream and the
// first answer's error (nil when it was opened).
func openRaw(ctx context.Context, api pb.TenureClient, open *pb.OpenSession) (*testutil.RawSession, *pb.SessionOpened, error) {
	st, err := testutil.OpenRawSession(ctx, api)
	if err != nil {
		return nil, nil, err
	}
	if err := st.Send(&pb.SessionRequest{Id: 1, Op: &pb.SessionRequest_Open{Open: open}}); err != nil {
		return st, nil, err
	}
	resp, err := st.Recv()
	if err != nil {
		return st, nil, err
	}
	return st, resp.GetOpened(), nil
}

// TestSessionNeedsItsSecret: knowing a session's id (ids are public: they
// show in status and history) is not enough to act as it. Resuming it
// without its secret, or with a wrong one, is PERMISSION_DENIED before
// anything happens: no release, no close, no keepalive; ephemeral keys
// and dequeues bound to it are refused the same way.
func TestSessionNeedsItsSecret(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	victim := testutil.Session(t, ctx, c, client.WithOwner("victim"), client.WithTTL(2*time.Second))
	m, _ := victim.Mutex("L")
	h, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(victim.Secret()) < 16 {
		t.Fatalf("session secret of %d bytes, want at least 16 (128 bits)", len(victim.Secret()))
	}

	api := testutil.API(t, srv.Addr())
	wrong := append([]byte(nil), victim.Secret()...)
	wrong[0] ^= 1
	for name, secret := range map[string][]byte{"no secret": nil, "wrong secret": wrong} {
		st, opened, err := openRaw(ctx, api, &pb.OpenSession{SessionId: victim.ID(), TtlMs: 2000, Secret: secret})
		if status.Code(err) != codes.PermissionDenied || opened != nil {
			t.Fatalf("resume with %s: %v %v, want PERMISSION_DENIED", name, opened, err)
		}
		// The stream is over: a release or close sent on it does nothing.
		if st == nil {
			continue
		}
		_ = st.Send(&pb.SessionRequest{Id: 2, Op: &pb.SessionRequest_Release{Release: &pb.ReleaseLock{Name: "L", Token: h.Token()}}})
		_ = st.Send(&pb.SessionRequest{Id: 3, Op: &pb.SessionRequest_Close{Close: &pb.CloseSession{}}})
	}
	if _, err := api.KVPut(ctx, &pb.KVPutRequest{Key: "k", Value: []byte("v"), Session: victim.ID()}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("put bound to the victim's session without its secret: %v", err)
	}
	if _, err := api.KVTxn(ctx, &pb.KVTxnRequest{Success: []*pb.KVRequestOp{{Op: &pb.KVRequestOp_Put{Put: &pb.KVPutRequest{Key: "k", Session: victim.ID(), SessionSecret: wrong}}}}}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("txn put bound to the victim's session with a wrong secret: %v", err)
	}
	if _, err := api.QueueDequeue(ctx, &pb.QueueDequeueRequest{Queue: "q", Session: victim.ID()}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("dequeue tied to the victim's session without its secret: %v", err)
	}

	// The victim is untouched: it still holds L with its token, and its
	// own uses of the session work.
	st, err := c.LockStatus(ctx, "L")
	if err != nil || st.GetHolder().GetSession() != victim.ID() || st.GetHolder().GetToken() != h.Token() {
		t.Fatalf("lock status after the attempts: %v %v", st, err)
	}
	if h.State() != client.Held {
		t.Fatalf("victim's hold is %v", h.State())
	}
	if _, err := c.Put(ctx, "mine", []byte("v"), client.WithSession(victim)); err != nil {
		t.Fatalf("the victim's own ephemeral put: %v", err)
	}
	if _, err := c.Put(ctx, "theirs", []byte("v"), client.WithSessionCredentials(victim.ID(), victim.Secret())); err != nil {
		t.Fatalf("a put with the victim's credentials passed on: %v", err)
	}
	if err := h.Unlock(ctx); err != nil {
		t.Fatalf("victim's unlock: %v", err)
	}
}

// TestCrashedClientsSessionCannotBeKeptAlive: nobody else can renew the
// session of a client that crashed, so its lock goes to the next waiter
// one TTL after the crash.
func TestCrashedClientsSessionCannotBeKeptAlive(t *testing.T) {
	testutil.Slow(t)
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	api := testutil.API(t, srv.Addr())
	cctx, crash := context.WithCancel(ctx)
	st, opened, err := openRaw(cctx, api, &pb.OpenSession{Owner: "crashes", TtlMs: 1000})
	if err != nil || len(opened.GetSecret()) < 16 {
		t.Fatalf("open: %v %v", opened, err)
	}
	if err := st.Send(&pb.SessionRequest{Id: 2, Op: &pb.SessionRequest_Acquire{Acquire: &pb.AcquireLock{Name: "L"}}}); err != nil {
		t.Fatal(err)
	}
	if r, err := st.Recv(); err != nil || r.GetGranted() == nil {
		t.Fatalf("acquire: %v %v", r, err)
	}
	crash()

	c := testutil.Dial(t, srv.Addr())
	waiter := testutil.Session(t, ctx, c)
	m, _ := waiter.Mutex("L")
	got := make(chan error, 1)
	go func() {
		_, err := m.Lock(ctx)
		got <- err
	}()
	// An attacker keeps trying to resume the crashed session to renew it.
	stop := make(chan struct{})
	denied := make(chan int, 1)
	go func() {
		n := 0
		defer func() { denied <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _, err := openRaw(ctx, api, &pb.OpenSession{SessionId: opened.GetSessionId(), TtlMs: 1000})
			if status.Code(err) == codes.PermissionDenied {
				n++
			}
			time.Sleep(50 * time.Millisecond) // a hostile client's pace; not synchronisation
		}
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the crashed client's lock was kept alive")
	}
	close(stop)
	if n := <-denied; n == 0 {
		t.Fatal("no resume attempt was made")
	}
	if h, err := c.LockHistory(ctx, "L"); err != nil || len(h.GetGrants()) < 1 || h.GetGrants()[0].GetEnded() != "expired" {
		t.Fatalf("history %v %v, want the crashed client's grant expired", h, err)
	}
}
