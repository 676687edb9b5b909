//go:build linux

package ramdisk

import (
	"errors"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// discard tells the device the range holds nothing (BLKDISCARD): SSDs and thin devices drop
// it. An error means the device cannot.
func discard(f *os.File, off, n int64) error {
	r := [2]uint64{uint64(off), uint64(n)}
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKDISCARD, uintptr(unsafe.Pointer(&r[0])))
	if errno != 0 {
		return errno
	}
	return nil
}

// rereadPartitions asks the kernel to read the partition table again (BLKRRPART). A device
// that has no partitions to read (ENOTTY: not a disk; EINVAL: a loop device without
// partition scanning) is not an error; a partition in use (EBUSY) is.
func rereadPartitions(f *os.File) error {
	err := unix.IoctlSetInt(int(f.Fd()), unix.BLKRRPART, 0)
	if errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EINVAL) {
		return nil
	}
	return err
}

// dropCache drops the page cache of a synced range, so that reading it back reads the
// device, not memory.
func dropCache(f *os.File, off, n int64) error {
	return unix.Fadvise(int(f.Fd()), off, n, unix.FADV_DONTNEED)
}

func isBusy(err error) bool { return errors.Is(err, unix.EBUSY) }
