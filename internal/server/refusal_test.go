package server

import (
	"testing"
	"time"
)

// TestRefusalBudget: at most maxRefusalLogs refusals a second are logged;
// the first one logged after them says how many were left out.
func TestRefusalBudget(t *testing.T) {
	var b refusalBudget
	t0 := time.Unix(100, 0)
	logged := 0
	for i := range 50 {
		ok, dropped := b.admit(t0.Add(time.Duration(i) * time.Millisecond))
		if ok {
			logged++
		}
		if dropped != 0 {
			t.Fatalf("refusal %d: %d reported dropped within the second", i, dropped)
		}
	}
	if logged != maxRefusalLogs {
		t.Fatalf("%d of 50 refusals logged in a second, want %d", logged, maxRefusalLogs)
	}
	if ok, dropped := b.admit(t0.Add(time.Second)); !ok || dropped != 50-maxRefusalLogs {
		t.Fatalf("the next second: logged %v, dropped %d, want true, %d", ok, dropped, 50-maxRefusalLogs)
	}
}
