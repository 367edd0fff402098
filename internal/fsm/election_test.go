package fsm_test

import (
	"testing"

	"github.com/tenure-io/tenure/internal/fsm"
	"github.com/tenure-io/tenure/internal/fsm/fsmpb"
)

func cmdCampaign(sess uint64, name, value string) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_Acquire{Acquire: &fsmpb.Acquire{Session: sess, Name: name, Wait: true, Election: true, Value: []byte(value)}}}
}

func cmdProclaim(sess uint64, name string, token uint64, value string) *fsmpb.Command {
	return &fsmpb.Command{Op: &fsmpb.Command_Proclaim{Proclaim: &fsmpb.Proclaim{Session: sess, Name: name, Token: token, Value: []byte(value)}}}
}

func leaderEvents(evs []fsm.Event) []fsm.Event {
	var out []fsm.Event
	for _, e := range evs {
		if e.Kind == fsm.EventHolderChanged {
			out = append(out, e)
		}
	}
	return out
}

// TestElectionLeaderChangesAreReported: every change of leader or value
// is an event, in order, with increasing revisions; only the leader's
// current grant may proclaim.
func TestElectionLeaderChangesAreReported(t *testing.T) {
	m := newMachine(t)
	a, b := m.session("a"), m.session("b")
	ra, evs := m.ok(cmdCampaign(a, "e", "va"))
	if l := leaderEvents(evs); len(l) != 1 || l[0].Session != a || string(l[0].Value) != "va" || l[0].Token != ra.Token {
		t.Fatalf("campaign events %+v", evs)
	}
	if r, _ := m.ok(cmdCampaign(b, "e", "vb")); !r.Queued {
		t.Fatalf("second candidate: %+v", r)
	}
	_, evs = m.ok(cmdProclaim(a, "e", ra.Token, "va2"))
	if l := leaderEvents(evs); len(l) != 1 || string(l[0].Value) != "va2" || l[0].Token != ra.Token {
		t.Fatalf("proclaim events %+v", evs)
	}
	m.failsWith(cmdProclaim(b, "e", ra.Token, "x"), fsm.ErrNotHeld)
	_, evs = m.ok(cmdExpire(a))
	l := leaderEvents(evs)
	if len(l) != 2 || l[0].Session != 0 || l[1].Session != b || string(l[1].Value) != "vb" || l[1].Token <= ra.Token || l[1].Revision <= l[0].Revision {
		t.Fatalf("fail-over events %+v", l)
	}
	// Plain locks report nothing.
	_, evs = m.ok(cmdAcquire(b, "plain", true, 0))
	if len(leaderEvents(evs)) != 0 {
		t.Fatalf("plain lock reported %+v", evs)
	}
}
