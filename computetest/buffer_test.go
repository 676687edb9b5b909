package computetest_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/better-compute/compute/computetest"
)

// TestBufferConcurrentWrites: writers and a reader at once lose nothing (run with -race).
func TestBufferConcurrentWrites(t *testing.T) {
	t.Parallel()
	var b computetest.Buffer
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 100 {
				fmt.Fprintf(&b, "<%d.%d>", i, j)
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	for i := range 8 {
		for j := range 100 {
			if s := fmt.Sprintf("<%d.%d>", i, j); !b.Contains(s) {
				t.Fatalf("lost %s", s)
			}
		}
	}
}
