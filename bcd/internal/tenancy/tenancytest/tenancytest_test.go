package tenancytest

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestLockHostUsersHoldsUntilTheTestEnds: while a test holds the lock, another descriptor (in
// this process, as in another) cannot take it; once the test has ended, it can.
func TestLockHostUsersHoldsUntilTheTestEnds(t *testing.T) {
	try := func() error {
		f, err := os.OpenFile(filepath.Join(os.TempDir(), "better-compute-host-users.lock"), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	}
	t.Run("held", func(t *testing.T) {
		LockHostUsers(t)
		if err := try(); !errors.Is(err, syscall.EWOULDBLOCK) {
			t.Fatalf("another took the lock while a test held it: %v", err)
		}
	})
	if err := try(); err != nil {
		t.Fatalf("the lock is still held after the test ended: %v", err)
	}
}
