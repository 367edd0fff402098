package clienttest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

func TestElectionCampaignProclaimObserve(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := dial(t, srv.Addr())
	sa := testutil.Session(t, ctx, c, client.WithOwner("a"))
	sb := testutil.Session(t, ctx, c, client.WithOwner("b"))
	ea, _ := sa.Election("leader")
	eb, _ := sb.Election("leader")

	octx, ocancel := context.WithCancel(ctx)
	obs, err := c.Observe(octx, "leader")
	if err != nil {
		t.Fatal(err)
	}
	next := func() client.Leader {
		t.Helper()
		select {
		case l, ok := <-obs.C:
			if !ok {
				t.Fatalf("observation ended: %v", obs.Err())
			}
			return l
		case <-ctx.Done():
			t.Fatal("no change observed")
		}
		return client.Leader{}
	}
	if l := next(); l.Session != 0 {
		t.Fatalf("first observation %+v, want no leader", l)
	}
	ha, err := ea.Campaign(ctx, []byte("va"))
	if err != nil {
		t.Fatal(err)
	}
	if l := next(); l.Owner != "a" || string(l.Value) != "va" || l.Token != ha.Token() {
		t.Fatalf("leader %+v", l)
	}
	won := make(chan *client.Hold, 1)
	go func() {
		h, err := eb.Campaign(ctx, []byte("vb"))
		if err != nil {
			t.Error(err)
		}
		won <- h
	}()
	if err := ea.Proclaim(ctx, ha, []byte("va2")); err != nil {
		t.Fatal(err)
	}
	if l := next(); string(l.Value) != "va2" || l.Token != ha.Token() {
		t.Fatalf("after proclaim %+v", l)
	}
	if cur, err := eb.Leader(ctx); err != nil || cur.Owner != "a" || string(cur.Value) != "va2" {
		t.Fatalf("Leader() = %+v %v", cur, err)
	}
	if err := ea.Resign(ctx, ha); err != nil {
		t.Fatal(err)
	}
	if l := next(); l.Session != 0 {
		t.Fatalf("after resign %+v, want none", l)
	}
	hb := <-won
	if l := next(); l.Owner != "b" || string(l.Value) != "vb" || l.Token != hb.Token() || l.Token <= ha.Token() {
		t.Fatalf("new leader %+v (old token %d)", l, ha.Token())
	}
	if err := ea.Proclaim(ctx, ha, []byte("late")); !errors.Is(err, client.ErrNotHeld) {
		t.Fatalf("proclaim by the old leader: %v, want ErrNotHeld", err)
	}
	if err := ea.Resign(ctx, ha); err != nil && !errors.Is(err, client.ErrNotHeld) {
		t.Fatalf("second resign of the old leadership: %v", err)
	}
	if cur, err := eb.Leader(ctx); err != nil || cur.Owner != "b" || cur.Token != hb.Token() {
		t.Fatalf("a repeated resign by the old leader moved the leadership: %+v %v", cur, err)
	}
	ocancel()
	for range obs.C {
	}
	if !errors.Is(obs.Err(), context.Canceled) {
		t.Fatalf("observation ended with %v, want context.Canceled", obs.Err())
	}
}
