//go:build unix

package initramfstest

import (
	"os"
	"syscall"
)

// lock takes an exclusive lock on the file at path (made if missing), waiting for another
// process that holds it, and returns how to let it go. The kernel lets it go if the process dies.
func lock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}
