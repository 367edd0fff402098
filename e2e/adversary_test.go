package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/internal/testutil"
)

// The tests in this file try, against real `tenure serve` processes and
// with nothing but the public API and the CLI, what an adversary (or a
// badly buggy client) can do to the other clients, one test per kind of
// attack. Each must fail with its code and change nothing for the others.

// rawConn is a plain gRPC connection to addr, closed when the test ends.
func rawConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// openSession sends OpenSession on a new session stream and returns the
// stream and the error of its first answer.
func openSession(ctx context.Context, api pb.TenureClient, open *pb.OpenSession) (*testutil.RawSession, error) {
	st, err := testutil.OpenRawSession(ctx, api)
	if err != nil {
		return nil, err
	}
	if err := st.Send(&pb.SessionRequest{Id: 1, Op: &pb.SessionRequest_Open{Open: open}}); err != nil {
		return st, err
	}
	resp, err := st.Recv()
	if err == nil && resp.GetOpened() == nil {
		err = fmt.Errorf("unexpected answer %v", resp)
	}
	return st, err
}

func lockStatus(t *testing.T, addr, name string) statusOut {
	t.Helper()
	var st statusOut
	tenureJSON(t, addr, 0, &st, "lock", "status", name)
	return st
}

// TestAdversaryCannotActAsAnotherSession: the victim's `tenure lock` holds
// L while its command runs. Another client resumes the victim's session by
// its id (listed by lock status) to release L or close the session: the
// resume is PERMISSION_DENIED, the victim keeps L with its token and its
// command runs alone to the end. A crashed holder's session cannot be kept
// alive by someone else: its lock goes to the next waiter.
func TestAdversaryCannotActAsAnotherSession(t *testing.T) {
	addr := freeAddr(t)
	startServer(t, addr, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	api := pb.NewTenureClient(rawConn(t, addr))

	done := filepath.Join(t.TempDir(), "done")
	victim := start(t, "victim", addr, "lock", "L", "--ttl", "2s", "--", "sh", "-c", `sleep 3; echo ok > "$0"`, done)
	var st statusOut
	testutil.WaitFor(t, "the victim's grant", 10*time.Second, func() bool {
		st = lockStatus(t, addr, "L")
		return st.Holder != nil
	})
	for _, secret := range [][]byte{nil, []byte("0123456789abcdef")} {
		stream, err := openSession(ctx, api, &pb.OpenSession{SessionId: st.Holder.Session, TtlMs: 2000, Secret: secret})
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("resume of the victim's session with secret %q: %v, want PERMISSION_DENIED", secret, err)
		}
		if stream != nil { // the stream is over: these reach nothing
			_ = stream.Send(&pb.SessionRequest{Id: 2, Op: &pb.SessionRequest_Release{Release: &pb.ReleaseLock{Name: "L", Token: st.Holder.Token}}})
			_ = stream.Send(&pb.SessionRequest{Id: 3, Op: &pb.SessionRequest_Close{Close: &pb.CloseSession{}}})
		}
	}
	if now := lockStatus(t, addr, "L"); now.Holder == nil || now.Holder.Token != st.Holder.Token {
		t.Fatalf("after the attempts the lock is %+v, want still the victim's (token %d)", now.Holder, st.Holder.Token)
	}
	if code := victim.wait(20 * time.Second); code != 0 {
		t.Fatalf("victim's tenure lock exited %d: %s", code, victim.stderr())
	}
	if got := readFile(t, done, time.Second); got != "ok" {
		t.Fatalf("the victim's command did not finish: %q", got)
	}

	// A holder crashes (kill -9 of tenure lock, its command too). An
	// attacker keeps resuming its session: refused every time, and the
	// next waiter gets the lock.
	crashed := start(t, "crashed", addr, "lock", "M", "--ttl", "2s", "--", "sleep", "60")
	testutil.WaitFor(t, "the crashing holder's grant", 10*time.Second, func() bool {
		st = lockStatus(t, addr, "M")
		return st.Holder != nil
	})
	crashed.signal(syscall.SIGKILL)
	crashed.wait(5 * time.Second)
	var refused atomic.Int64
	actx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	wg.Go(func() {
		for actx.Err() == nil {
			if _, err := openSession(actx, api, &pb.OpenSession{SessionId: st.Holder.Session, TtlMs: 2000}); status.Code(err) == codes.PermissionDenied {
				refused.Add(1)
			}
			time.Sleep(50 * time.Millisecond) // an attacker's pace, not synchronisation
		}
	})
	r := tenure(t, addr, "lock", "M", "--timeout", "15s", "--", "true")
	stop()
	wg.Wait()
	if r.code != 0 || refused.Load() == 0 {
		t.Fatalf("waiter after the crash: exit %d (%s), %d resumes refused", r.code, r.stderr, refused.Load())
	}
}

// TestAdversaryTokensAndRestores: a fenced write with a token nobody was
// issued is refused (exit 1, "invalid") and honest holders keep writing;
// a forced restore of an older snapshot continues above every token
// issued before it, and tokens from before it are stale.
func TestAdversaryTokensAndRestores(t *testing.T) {
	addr := freeAddr(t)
	startServer(t, addr, t.TempDir())
	snap := filepath.Join(t.TempDir(), "old.snap")
	if r := tenure(t, addr, "snapshot", "save", snap); r.code != 0 {
		t.Fatalf("snapshot save: %s", r.stderr)
	}
	var tokens []uint64
	for i := range 5 {
		r := tenure(t, addr, "lock", "ledger-lock", "--", "sh", "-c", fmt.Sprintf(`tenure fence put ledger v%d --token "$TENURE_FENCE_TOKEN" >/dev/null && echo "$TENURE_FENCE_TOKEN"`, i))
		if r.code != 0 {
			t.Fatalf("honest write %d: %s", i, r.stderr)
		}
		var tok uint64
		fmt.Sscan(r.stdout, &tok)
		tokens = append(tokens, tok)
	}
	last := tokens[len(tokens)-1]

	var out struct {
		Result string `json:"result"`
	}
	r := tenure(t, addr, "fence", "put", "ledger", "forged", "--token", "999999999", "-o", "json")
	if r.code != 1 || json.Unmarshal([]byte(r.stdout), &out) != nil || out.Result != "invalid" {
		t.Fatalf("unissued token: exit %d, stdout %q, stderr %q; want exit 1 and result invalid", r.code, r.stdout, r.stderr)
	}
	if r := tenure(t, addr, "lock", "ledger-lock", "--", "sh", "-c", `tenure fence put ledger honest --token "$TENURE_FENCE_TOKEN"`); r.code != 0 {
		t.Fatalf("an honest holder after the forged write: exit %d %s", r.code, r.stderr)
	}

	if r := tenure(t, addr, "snapshot", "restore", snap); r.code != 1 {
		t.Fatalf("restore of an older snapshot without --force: exit %d, want 1 (%s)", r.code, r.stderr)
	}
	if r := tenure(t, addr, "snapshot", "restore", "--force", snap); r.code != 0 {
		t.Fatalf("forced restore: exit %d %s", r.code, r.stderr)
	}
	r = tenure(t, addr, "lock", "ledger-lock", "--", "sh", "-c", `echo "$TENURE_FENCE_TOKEN"`)
	var next uint64
	fmt.Sscan(r.stdout, &next)
	if r.code != 0 || next <= last {
		t.Fatalf("token after the restore %d (exit %d %s), want above %d issued before", next, r.code, r.stderr, last)
	}
	if r := tenure(t, addr, "fence", "put", "ledger", "late", "--token", fmt.Sprint(last)); r.code != 3 {
		t.Fatalf("a write with a token from before the restore: exit %d, want 3 (stale)", r.code)
	}
}

// TestAdversaryCannotRacePastLimits: a burst of session creations and
// waiters far past the limits admits exactly the limits, the refusals are
// RESOURCE_EXHAUSTED naming the limit, and session list still works.
func TestAdversaryCannotRacePastLimits(t *testing.T) {
	addr := freeAddr(t)
	p := start(t, "server", addr, "serve", "--http-listen", "127.0.0.1:0", "--listen", addr, "--data-dir", t.TempDir(), "--max-sessions", "30", "--max-waiters", "5")
	testutil.WaitFor(t, "the server's ready line", 30*time.Second, func() bool { return strings.HasPrefix(p.stdout(), "tenure: serving on") })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	api := pb.NewTenureClient(rawConn(t, addr))
	var ok, limited atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var opened []*testutil.RawSession
	for range 200 {
		wg.Go(func() {
			st, err := openSession(ctx, api, &pb.OpenSession{TtlMs: 60_000})
			switch {
			case err == nil:
				ok.Add(1)
				mu.Lock()
				opened = append(opened, st)
				mu.Unlock()
			case status.Code(err) == codes.ResourceExhausted && strings.Contains(err.Error(), "--max-sessions"):
				limited.Add(1)
			default:
				t.Errorf("session burst: %v", err)
			}
		})
	}
	wg.Wait()
	if ok.Load() != 30 || limited.Load() != 170 {
		t.Fatalf("%d sessions opened, %d refused; want 30 and 170", ok.Load(), limited.Load())
	}
	var list struct {
		Sessions []json.RawMessage `json:"sessions"`
	}
	tenureJSON(t, addr, 0, &list, "session", "list")
	if len(list.Sessions) != 30 {
		t.Fatalf("session list shows %d sessions, want 30", len(list.Sessions))
	}
	// Every opened session asks to wait for one lock at once.
	if err := opened[0].Send(&pb.SessionRequest{Id: 2, Op: &pb.SessionRequest_Acquire{Acquire: &pb.AcquireLock{Name: "hot"}}}); err != nil {
		t.Fatal(err)
	}
	if resp, err := opened[0].Recv(); err != nil || resp.GetGranted() == nil {
		t.Fatalf("holder: %v %v", resp, err)
	}
	var queued, refused atomic.Int64
	for _, st := range opened[1:] {
		wg.Go(func() {
			if err := st.Send(&pb.SessionRequest{Id: 2, Op: &pb.SessionRequest_Acquire{Acquire: &pb.AcquireLock{Name: "hot", Wait: true}}}); err != nil {
				t.Error(err)
				return
			}
			resp, err := st.Recv()
			switch {
			case err != nil:
				t.Error(err)
			case resp.GetQueued() != nil:
				queued.Add(1)
			case resp.GetError().GetReason() == pb.ErrorReason_ERROR_REASON_LIMIT:
				refused.Add(1)
			default:
				t.Errorf("waiter: %v", resp)
			}
		})
	}
	wg.Wait()
	if queued.Load() != 5 || refused.Load() != 24 {
		t.Fatalf("%d waiters queued, %d refused; want 5 and 24", queued.Load(), refused.Load())
	}
}

// TestAdversaryStateShrinks: a name used once as a 9,999-permit semaphore
// can later be a mutex, and queues created and drained do not fill the
// queue limit, also after a restart.
func TestAdversaryStateShrinks(t *testing.T) {
	addr, dir := freeAddr(t), t.TempDir()
	serve := func() *proc {
		p := start(t, "server", addr, "serve", "--http-listen", "127.0.0.1:0", "--listen", addr, "--data-dir", dir, "--max-queues", "3")
		testutil.WaitFor(t, "the server's ready line", 30*time.Second, func() bool { return strings.HasPrefix(p.stdout(), "tenure: serving on") })
		return p
	}
	p := serve()
	if r := tenure(t, addr, "sem", "shard-7", "--limit", "9999", "--", "true"); r.code != 0 {
		t.Fatalf("semaphore: %s", r.stderr)
	}
	if r := tenure(t, addr, "lock", "shard-7", "--", "true"); r.code != 0 {
		t.Fatalf("shard-7 as a mutex after its semaphore was released: exit %d %s", r.code, r.stderr)
	}
	drain := func(q string) {
		if r := tenure(t, addr, "queue", "push", q, "x"); r.code != 0 {
			t.Fatalf("push to %s: %s", q, r.stderr)
		}
		var pop queuePopOut
		tenureJSON(t, addr, 0, &pop, "queue", "pop", q)
		args := settleArgs("ack", pop)
		args[2] = q
		if r := tenure(t, addr, args...); r.code != 0 {
			t.Fatalf("ack on %s: %s", q, r.stderr)
		}
	}
	for i := range 6 {
		drain(fmt.Sprint("q", i))
	}
	p.signal(syscall.SIGTERM)
	p.wait(10 * time.Second)
	serve()
	drain("after-restart")
}

// TestAdversaryBadBytes: a malformed message and a name that is not valid
// UTF-8 are INVALID_ARGUMENT with a message a person understands, and the
// server serves on.
func TestAdversaryBadBytes(t *testing.T) {
	addr := freeAddr(t)
	startServer(t, addr, t.TempDir())
	conn := rawConn(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	badName := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte{0xff, 0xfe, 'x'})
	for name, msg := range map[string][]byte{"malformed": {0xff, 0xff, 0xff, 0xff}, "invalid UTF-8": badName} {
		var out []byte
		err := conn.Invoke(ctx, "/tenure.v1.Tenure/LockStatus", msg, &out, grpc.ForceCodec(rawCodec{}))
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "LockStatusRequest") {
			t.Errorf("%s LockStatus: %v, want INVALID_ARGUMENT naming the message", name, err)
		}
	}
	c := dial(t, ctx, addr)
	if _, err := c.LockStatus(ctx, "fine"); err != nil {
		t.Fatalf("a good request after the bad ones: %v", err)
	}
}

// rawCodec sends and receives messages as the bytes they are.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return v.([]byte), nil }

func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

var _ encoding.Codec = rawCodec{}
