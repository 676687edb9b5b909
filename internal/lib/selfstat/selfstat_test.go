package selfstat

import (
	"runtime"
	"testing"
)

func TestSelf(t *testing.T) {
	t.Parallel()
	before := CPU()
	x := 0
	for i := range 50_000_000 {
		x += i
	}
	_ = x
	if CPU() <= before {
		t.Error("CPU time did not grow while computing")
	}
	if runtime.GOOS == "linux" && RSSMiB() <= 0 {
		t.Error("no resident memory read on Linux")
	}
}
