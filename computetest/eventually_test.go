package computetest_test

import (
	"testing"
	"time"

	"github.com/better-compute/compute/computetest"
)

// fatalRecorder records a Fatalf instead of ending the test.
type fatalRecorder struct {
	testing.TB
	failed string
}

func (r *fatalRecorder) Helper() {}
func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.failed = format
	panic(r)
}

// TestEventuallyWaitsThenFails: a condition that comes true ends the wait; one that never does
// fails the test after the time given, saying what was awaited.
func TestEventuallyWaitsThenFails(t *testing.T) {
	t.Parallel()
	n := 0
	computetest.Eventually(t, 5*time.Second, "the third look", func() bool { n++; return n >= 3 })
	if n != 3 {
		t.Fatalf("looked %d times, want 3", n)
	}
	r := &fatalRecorder{TB: t}
	func() {
		defer func() {
			if p := recover(); p != r {
				panic(p)
			}
		}()
		computetest.Eventually(r, 50*time.Millisecond, "never", func() bool { return false })
	}()
	if r.failed == "" {
		t.Fatal("a condition that never held did not fail the test")
	}
}
