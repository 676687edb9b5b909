package ramdisk

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine outlives them: Run's progress poster,
// an HTTP connection left open.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
