package server_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

func lock(t *testing.T, ctx context.Context, s *client.Session, name string, opts ...client.MutexOption) *client.Hold {
	t.Helper()
	m, err := s.Mutex(name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	h, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestFencedPutUnissuedToken: a token above the service's revision is
// refused with INVALID_ARGUMENT (client.ErrInvalid, an
// *UnissuedTokenError carrying the token and the revision) and stores
// nothing, so the honest holder is not stale afterwards.
func TestFencedPutUnissuedToken(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	h := lock(t, ctx, testutil.Session(t, ctx, c), "job")
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, write := range []func() (client.PutResult, error){
		func() (client.PutResult, error) { return c.FencedPut(ctx, "K", []byte("evil"), 999999999, "") },
		func() (client.PutResult, error) {
			return c.FencedPut(ctx, "K", []byte("evil"), 999999999, "op", client.WithLock("job"))
		},
		func() (client.PutResult, error) { return c.FencedDelete(ctx, "K", 999999999, "") },
	} {
		_, err := write()
		var ue *client.UnissuedTokenError
		if !errors.Is(err, client.ErrInvalid) || !errors.As(err, &ue) {
			t.Fatalf("write with token 999999999: %v, want an UnissuedTokenError", err)
		}
		if ue.Token != 999999999 || ue.Revision != st.GetRevision() || !strings.Contains(err.Error(), "token 999999999 was never issued") {
			t.Fatalf("refusal %+v (%q), want token 999999999 at revision %d", ue, err, st.GetRevision())
		}
	}
	if reg, err := c.FencedGet(ctx, "K"); err != nil || reg.Found {
		t.Fatalf("register after the refused writes: %+v %v", reg, err)
	}
	if st2, _ := c.Status(ctx); st2.GetRevision() != st.GetRevision() {
		t.Fatalf("refused writes moved the revision from %d to %d", st.GetRevision(), st2.GetRevision())
	}
	r, err := c.FencedPut(ctx, "K", []byte("honest"), h.Token(), "op")
	if err != nil || !r.Accepted || r.Token != h.Token() {
		t.Fatalf("honest write after the refused ones: %+v %v", r, err)
	}
}

// TestFencedPutWithLock: naming the lock makes a write stale once its
// grant has ended, before any newer holder writes; any current holder of a
// semaphore passes.
func TestFencedPutWithLock(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	a, b := testutil.Session(t, ctx, c), testutil.Session(t, ctx, c)

	if _, err := c.FencedPut(ctx, "K", nil, 1, "", client.WithLock("")); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("WithLock(\"\"): %v, want ErrInvalid", err)
	}
	ha := lock(t, ctx, a, "job")
	if r, err := c.FencedPut(ctx, "K", []byte("a"), ha.Token(), "", client.WithLock("job")); err != nil || !r.Accepted {
		t.Fatalf("holder's write naming the lock: %+v %v", r, err)
	}
	if err := ha.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := c.FencedPut(ctx, "K", []byte("late"), ha.Token(), "", client.WithLock("job"))
	if !errors.Is(err, client.ErrStale) || r.Accepted || r.Token != ha.Token() || !strings.Contains(err.Error(), `not a current grant of lock "job"`) {
		t.Fatalf("write of an ended grant naming the lock: %+v %v, want ErrStale", r, err)
	}
	if reg, _ := c.FencedGet(ctx, "K"); string(reg.Value) != "a" {
		t.Fatalf("register %q after the late write", reg.Value)
	}
	// The register is bound to job by the first write that named it: the
	// same write naming no lock is checked against job too, although
	// nobody newer has written.
	if r, err := c.FencedPut(ctx, "K", []byte("late"), ha.Token(), ""); !errors.Is(err, client.ErrStale) || r.Accepted {
		t.Fatalf("the same write without the lock: %+v %v, want ErrStale", r, err)
	}

	h1 := lock(t, ctx, a, "sem", client.WithPermits(2))
	h2 := lock(t, ctx, b, "sem", client.WithPermits(2))
	for i, h := range []*client.Hold{h1, h2} {
		if r, err := c.FencedPut(ctx, "S"+string(rune('1'+i)), []byte("x"), h.Token(), "", client.WithLock("sem")); err != nil || !r.Accepted {
			t.Fatalf("semaphore holder %d naming the lock: %+v %v", i+1, r, err)
		}
	}
}

// TestFencedDelete: a delete removes the register; a write with an older
// token cannot bring it back, also after a restart.
func TestFencedDelete(t *testing.T) {
	dir := t.TempDir()
	srv := testutil.Start(t, dir, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr())
	s := testutil.Session(t, ctx, c)
	h1 := lock(t, ctx, s, "job")
	if _, err := c.FencedPut(ctx, "K", []byte("v1"), h1.Token(), ""); err != nil {
		t.Fatal(err)
	}
	if err := h1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	h2 := lock(t, ctx, s, "job")

	if r, err := c.FencedDelete(ctx, "K", h1.Token(), "", client.WithLock("job")); !errors.Is(err, client.ErrStale) || r.Accepted {
		t.Fatalf("delete of an ended grant naming the lock: %+v %v", r, err)
	}
	r, err := c.FencedDelete(ctx, "K", h2.Token(), "del-1", client.WithLock("job"))
	if err != nil || !r.Accepted || r.Token != h2.Token() {
		t.Fatalf("delete: %+v %v", r, err)
	}
	if reg, err := c.FencedGet(ctx, "K"); err != nil || reg.Found {
		t.Fatalf("deleted register: %+v %v", reg, err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}

	srv.Stop(t)
	srv = testutil.Start(t, dir, nil)
	c = testutil.Dial(t, srv.Addr())
	r, err = c.FencedPut(ctx, "K", []byte("late"), h1.Token(), "")
	if !errors.Is(err, client.ErrStale) || r.Token != h2.Token() {
		t.Fatalf("older token after the delete and a restart: %+v %v, want ErrStale with token %d", r, err, h2.Token())
	}
	if reg, _ := c.FencedGet(ctx, "K"); reg.Found {
		t.Fatal("a stale write re-created the deleted register")
	}
	// The delete named job, and the key stays bound to it across the
	// restart: h2's grant has ended (its session closed), so h2's token
	// is stale even without naming the lock; job's next holder writes.
	if r, err := c.FencedPut(ctx, "K", []byte("v2"), h2.Token(), ""); !errors.Is(err, client.ErrStale) || r.Accepted {
		t.Fatalf("the deleting token after its grant ended: %+v %v, want ErrStale", r, err)
	}
	h3 := lock(t, ctx, testutil.Session(t, ctx, c), "job")
	if r, err := c.FencedPut(ctx, "K", []byte("v2"), h3.Token(), ""); err != nil || !r.Accepted {
		t.Fatalf("job's next holder: %+v %v", r, err)
	}
}
