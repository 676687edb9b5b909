// Package tenancytest serialises the tests that write the host's users and groups.
//
// Those are one per machine, and so are the names tenancy gives devices' groups (bc-dev-nvidia0):
// two test binaries that confine holders at once (go test -count=3 ./... run twice side by side)
// would add and delete each other's groups. bcd itself never meets this: one runs per host.
package tenancytest

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// LockHostUsers holds, until t ends, the machine-wide lock of tests that make holders' users and
// devices' groups. It is an flock, so it serialises tests in one process as well as across them.
func LockHostUsers(t testing.TB) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "better-compute-host-users.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatalf("tenancytest: %v", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatalf("tenancytest: lock the host's users: %v", err)
	}
	t.Cleanup(func() { f.Close() }) // closing the last descriptor releases the lock
}
