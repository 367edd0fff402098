package clienttest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

func dial(t *testing.T, addr string, opts ...client.Option) *client.Client {
	return testutil.Dial(t, addr, opts...)
}

func TestLockHandOffAndFencing(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := dial(t, srv.Addr())
	a, err := c.NewSession(ctx, client.WithOwner("A"), client.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.NewSession(ctx, client.WithOwner("B"), client.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ma, _ := a.Mutex("res")
	mb, _ := b.Mutex("res")
	ha, err := ma.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ha.State() != client.Held {
		t.Fatalf("state %v", ha.State())
	}
	if _, err := mb.TryLock(ctx); !errors.Is(err, client.ErrLocked) {
		t.Fatalf("TryLock on held lock: %v, want ErrLocked", err)
	}
	queued := make(chan int, 1)
	got := make(chan *client.Hold, 1)
	go func() {
		h, err := mb.Lock(ctx, client.OnQueued(func(p int) { queued <- p }))
		if err != nil {
			t.Error(err)
		}
		got <- h
	}()
	if p := <-queued; p != 1 {
		t.Fatalf("queue position %d, want 1", p)
	}
	if _, err := c.FencedPut(ctx, "reg", []byte("v1"), ha.Token(), "op-a"); err != nil {
		t.Fatal(err)
	}
	if err := ha.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if ha.State() != client.Released {
		t.Fatalf("state after unlock %v", ha.State())
	}
	hb := <-got
	if hb.Token() <= ha.Token() {
		t.Fatalf("token %d not above %d", hb.Token(), ha.Token())
	}
	if _, err := c.FencedPut(ctx, "reg", []byte("v2"), hb.Token(), "op-b"); err != nil {
		t.Fatal(err)
	}
	r, err := c.FencedPut(ctx, "reg", []byte("late"), ha.Token(), "op-a2")
	if !errors.Is(err, client.ErrStale) || r.Token != hb.Token() {
		t.Fatalf("late write: %+v %v, want ErrStale with token %d", r, err, hb.Token())
	}
	reg, err := c.FencedGet(ctx, "reg")
	if err != nil || string(reg.Value) != "v2" || reg.Token != hb.Token() {
		t.Fatalf("register %+v %v", reg, err)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if hb.State() != client.Released {
		t.Fatalf("hold after session close: %v", hb.State())
	}
}

func TestSemaphoreThroughClient(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := dial(t, srv.Addr())
	var holds []*client.Hold
	var sems []*client.Mutex
	for i := 0; i < 3; i++ {
		s, err := c.NewSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m, err := s.Semaphore("pool", 2)
		if err != nil {
			t.Fatal(err)
		}
		sems = append(sems, m)
	}
	for _, m := range sems[:2] {
		h, err := m.TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		holds = append(holds, h)
	}
	if _, err := sems[2].TryLock(ctx); !errors.Is(err, client.ErrLocked) {
		t.Fatalf("third permit: %v, want ErrLocked", err)
	}
	st, err := c.LockStatus(ctx, "pool")
	if err != nil || st.GetPermits() != 2 || len(st.GetHolders()) != 2 {
		t.Fatalf("status %v %v", st, err)
	}
	if err := holds[0].Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	h3, err := sems[2].Lock(ctx)
	if err != nil || h3.Token() <= holds[1].Token() {
		t.Fatalf("third after a release: %v %v", h3, err)
	}
	s, err := c.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Semaphore("x", 0); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("zero permits: %v, want ErrInvalid", err)
	}
}

func TestRWMutexThroughClient(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := dial(t, srv.Addr())
	var ms []*client.Mutex
	for i := 0; i < 3; i++ {
		s, err := c.NewSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m, _ := s.Mutex("rw")
		ms = append(ms, m)
	}
	r1, err := ms[0].RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := ms[1].TryRLock(ctx)
	if err != nil {
		t.Fatalf("second reader: %v", err)
	}
	if _, err := ms[2].TryLock(ctx); !errors.Is(err, client.ErrLocked) {
		t.Fatalf("writer while readers hold: %v, want ErrLocked", err)
	}
	got := make(chan *client.Hold, 1)
	go func() {
		h, err := ms[2].Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- h
	}()
	r1.Unlock(ctx)
	r2.Unlock(ctx)
	w := <-got
	if w.Token() <= r2.Token() {
		t.Fatalf("writer token %d not above %d", w.Token(), r2.Token())
	}
	st, err := c.LockStatus(ctx, "rw")
	if err != nil || len(st.GetHolders()) != 1 || st.GetHolders()[0].GetShared() {
		t.Fatalf("status %v %v", st, err)
	}
}
