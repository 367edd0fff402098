//go:build tenurefault

package server_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestHoldsSurviveASilentLeader: the leader of a 3-node cluster goes
// silent for 5 s (TTL 5 s): its client connections are held open but
// carry nothing (a blackholing proxy), and its peers hear nothing either,
// so they elect another leader. Every session notices that its renewals
// go unconfirmed, moves to another endpoint and resumes there: every hold
// is suspect for a moment, then held again with the same token, and none
// is lost, before or after the old leader comes back.
func TestHoldsSurviveASilentLeader(t *testing.T) {
	lc := startLinkedMembers(t, 3, nil)
	var eps []string
	pxs := make([]*testutil.Proxy, len(lc.ms))
	for i, m := range lc.ms {
		pxs[i] = testutil.StartProxy(t, m.d.Addr())
		eps = append(eps, pxs[i].Addr())
	}
	c := testutil.Dial(t, strings.Join(eps, ","))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	const holds = 20
	type held struct {
		h      *client.Hold
		states []client.State
	}
	var mu sync.Mutex
	hs := make([]*held, holds)
	var wg sync.WaitGroup
	for i := range hs {
		s := testutil.Session(t, ctx, c, client.WithTTL(5*time.Second), client.WithOwner(fmt.Sprint("h", i)))
		m, err := s.Mutex(fmt.Sprint("res-", i))
		if err != nil {
			t.Fatal(err)
		}
		h, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		hs[i] = &held{h: h}
		ch := h.Changes()
		wg.Go(func() {
			for st := range ch {
				mu.Lock()
				hs[i].states = append(hs[i].states, st)
				mu.Unlock()
			}
		})
	}
	li := lc.leader(t)
	old := lc.ms[li].id
	began := time.Now()
	pxs[li].Pause(true, true)
	lc.cut(li, false)
	time.Sleep(5 * time.Second) // the length of the fault
	pxs[li].Resume()
	lc.cut(li, true)
	t.Logf("leader %s silent for %v", old, time.Since(began))

	testutil.WaitFor(t, "every hold held again", 20*time.Second, func() bool {
		for _, x := range hs {
			if x.h.State() != client.Held {
				return false
			}
		}
		return true
	})
	time.Sleep(3 * time.Second) // and still held a while after the old leader is back
	for i, x := range hs {
		st, err := c.LockStatus(ctx, fmt.Sprint("res-", i))
		if err != nil {
			t.Fatal(err)
		}
		if x.h.State() != client.Held || len(st.GetHolders()) != 1 || st.GetHolders()[0].GetToken() != x.h.Token() || st.GetHolders()[0].GetSession() != x.h.SessionID() {
			t.Fatalf("hold %d: %v with token %d; the lock: %v", i, x.h.State(), x.h.Token(), st)
		}
	}
	if now := lc.ms[lc.leader(t)].id; now == old {
		t.Logf("the old leader %s leads again", old)
	}
	mu.Lock()
	for i, x := range hs {
		for _, st := range x.states {
			if st == client.Lost || st == client.Released {
				t.Errorf("hold %d went through %v", i, x.states)
			}
		}
	}
	mu.Unlock()
	for _, x := range hs {
		if err := x.h.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
}
