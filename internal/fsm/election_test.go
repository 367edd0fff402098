package fsm_test

import (
	"testing"

	"pgregory.net/rapid"

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

// TestElectionProperties: under random campaigns, resignations, session
// ends and proclamations, an election has at most one leader; each new
// leader's token is larger than every earlier leader's; the reported
// changes come in revision order and the last one always describes the
// current leader and value (none when Session is 0).
func TestElectionProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := fsm.NewState()
		var candidates []uint64 // live sessions that campaigned
		var lastLeaderToken, lastEventRev uint64
		var last *fsm.Event
		for step := 0; step < 60; step++ {
			var evs []fsm.Event
			emit := func(e fsm.Event) {
				if e.Kind == fsm.EventHolderChanged && e.Name == "e" {
					evs = append(evs, e)
				}
			}
			leader := s.Lock("e").Holder
			switch rapid.IntRange(0, 4).Draw(t, "op") {
			case 0: // a new candidate
				sess := s.Apply(cmdCreate("c", 5000), nil).Session
				value := rapid.SampledFrom([]string{"x", "y", "z"}).Draw(t, "value")
				if r := s.Apply(cmdCampaign(sess, "e", value), emit); r.Err != nil {
					t.Fatalf("campaign: %v", r.Err)
				}
				candidates = append(candidates, sess)
			case 1: // the leader resigns
				if leader == nil {
					continue
				}
				if r := s.Apply(cmdRelease(leader.Session, "e", leader.Token), emit); r.Err != nil {
					t.Fatalf("resign: %v", r.Err)
				}
			case 2, 3: // a candidate's session expires or closes
				if len(candidates) == 0 {
					continue
				}
				i := rapid.IntRange(0, len(candidates)-1).Draw(t, "candidate")
				cmd := cmdClose(candidates[i])
				if rapid.Bool().Draw(t, "expire") {
					cmd = cmdExpire(candidates[i])
				}
				if r := s.Apply(cmd, emit); r.Err != nil {
					t.Fatalf("end session: %v", r.Err)
				}
				candidates = append(candidates[:i], candidates[i+1:]...)
			case 4: // the leader proclaims
				if leader == nil {
					continue
				}
				value := rapid.SampledFrom([]string{"p", "q"}).Draw(t, "proclaimed")
				if r := s.Apply(cmdProclaim(leader.Session, "e", leader.Token, value), emit); r.Err != nil {
					t.Fatalf("proclaim: %v", r.Err)
				}
			}
			v := s.Lock("e")
			if len(v.Holders) > 1 {
				t.Fatalf("%d leaders at once", len(v.Holders))
			}
			for _, e := range evs {
				if e.Revision <= lastEventRev {
					t.Fatalf("change at revision %d after one at %d", e.Revision, lastEventRev)
				}
				lastEventRev = e.Revision
				if e.Session != 0 && (last == nil || e.Session != last.Session || e.Token != last.Token) {
					if e.Token <= lastLeaderToken {
						t.Fatalf("new leader's token %d not above %d", e.Token, lastLeaderToken)
					}
					lastLeaderToken = e.Token
				}
				last = &e
			}
			cur := v.Holder
			switch {
			case last == nil && cur != nil:
				t.Fatalf("leader %d never reported", cur.Session)
			case last != nil && cur == nil && last.Session != 0:
				t.Fatalf("no leader, last report says %d", last.Session)
			case last != nil && cur != nil && (last.Session != cur.Session || last.Token != cur.Token || string(last.Value) != string(cur.Value)):
				t.Fatalf("leader %d/%d %q, last report %d/%d %q", cur.Session, cur.Token, cur.Value, last.Session, last.Token, last.Value)
			}
		}
	})
}
