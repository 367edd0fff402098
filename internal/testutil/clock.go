package testutil

import (
	"testing"
	"time"

	"github.com/tenure-io/tenure/internal/clock"
	"github.com/tenure-io/tenure/internal/lessor"
)

// Elapse lets d pass on clk, the clock of an in-process server, as it
// passes for a server that runs: in steps shorter than lessor.StallGap,
// each once the server's timer loop has seen the one before. (One Advance
// longer than StallGap is, to the server, a stall of its process, and it
// charges no session, lock-delay or queue lease for it.)
func Elapse(t testing.TB, clk *clock.Fake, d time.Duration) {
	t.Helper()
	const step = lessor.StallGap * 4 / 5
	for d > 0 {
		inc := min(d, step)
		armed := clk.TimerCreated()
		if clk.Advance(inc) > 0 {
			select {
			case <-armed:
			case <-time.After(10 * time.Second):
				t.Fatal("the server's timer loop did not run")
			}
		}
		d -= inc
	}
}
