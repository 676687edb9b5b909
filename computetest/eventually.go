package computetest

import (
	"testing"
	"time"
)

// Eventually waits until cond holds, looking again every 20 ms, and fails the test naming what
// it waited for once within has passed. It is for conditions a test cannot be told of (another
// process's state, a loop that is not the test's); where there is an event to wait on, wait on it.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			if cond() {
				return
			}
			t.Fatalf("not within %s: %s", within, what)
		case <-tick.C:
		}
	}
}
