package computetest_test

import (
	"testing"

	"github.com/better-compute/compute/computetest"
)

func TestCount(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	if n := computetest.Count(t, env.DB.Pool, "SELECT count(*) FROM generate_series(1, $1::int)", 7); n != 7 {
		t.Fatalf("Count = %d, want 7", n)
	}
}
