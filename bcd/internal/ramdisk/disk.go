package ramdisk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// wipeSpan is how much Wipe zeroes at each end of a disk: the MBR, the primary GPT and the
// filesystem, RAID and LVM signatures near the start; the backup GPT and end-of-device
// metadata (md 1.0, ZFS labels) near the end.
const wipeSpan = 1 << 20

// Wipe erases what makes a disk bootable or recognisable: on a block device it first discards
// the whole device where the device supports it (BLKDISCARD), then it zeroes the first and the
// last MiB (or the whole of a smaller disk), syncs, and asks the kernel to re-read the
// partition table (BLKRRPART). disk is a block device ("/dev/vda"), opened exclusively so that
// a disk in use (a partition mounted) is refused, or a regular file standing in for one, whose
// size is kept. Wipe is not a secure erase: data between the two ends may remain readable on
// a device that does not discard.
func Wipe(ctx context.Context, disk string) error {
	d, err := openDisk(disk, true)
	if err != nil {
		return err
	}
	defer d.f.Close()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("ramdisk: wipe %s: %w", disk, err)
	}
	if d.block {
		// Best effort: a device that cannot discard is still wiped by the zeroes below.
		_ = discard(d.f, 0, d.size)
	}
	if err := d.wipe(0); err != nil {
		return err
	}
	return d.f.Close()
}

// target is a disk opened to be written: a block device or a regular file.
type target struct {
	f     *os.File
	path  string
	block bool  // a block device, rather than a regular file
	size  int64 // bytes: the device's size, or the file's when it was opened
}

// openDisk opens a block device or a regular file, to write (exclusively, for a block
// device) or to read.
func openDisk(path string, write bool) (*target, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("ramdisk: disk %s: %w", path, err)
	}
	block := st.Mode()&fs.ModeDevice != 0 && st.Mode()&fs.ModeCharDevice == 0
	if !block && !st.Mode().IsRegular() {
		return nil, fmt.Errorf("ramdisk: disk %s is neither a block device nor a regular file (%s)", path, st.Mode().Type())
	}
	flag := os.O_RDONLY
	if write {
		flag = os.O_RDWR
		if block {
			flag |= os.O_EXCL // refused with EBUSY while a partition is mounted or held
		}
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		if errors.Is(err, fs.ErrExist) || isBusy(err) {
			return nil, fmt.Errorf("ramdisk: disk %s is in use (a partition mounted or held): %w", path, err)
		}
		return nil, fmt.Errorf("ramdisk: open disk %s: %w", path, err)
	}
	size := st.Size()
	if block {
		if size, err = f.Seek(0, io.SeekEnd); err != nil {
			f.Close()
			return nil, fmt.Errorf("ramdisk: size of disk %s: %w", path, err)
		}
	}
	return &target{f: f, path: path, block: block, size: size}, nil
}

// wipe zeroes the first and last wipeSpan of the disk and, when written is more than that,
// the last wipeSpan before written (the end of a partial image, where its own backup GPT
// would be); then it syncs and has the kernel re-read the partition table.
func (d *target) wipe(written int64) error {
	size := d.size
	if !d.block {
		// A regular file may have grown since it was opened.
		if st, err := d.f.Stat(); err == nil {
			size = st.Size()
		}
	}
	spans := [][2]int64{{0, min(wipeSpan, size)}, {max(size-wipeSpan, 0), size}}
	if written > wipeSpan && written < size {
		spans = append(spans, [2]int64{written - wipeSpan, written})
	}
	zeros := make([]byte, wipeSpan)
	for _, s := range spans {
		if s[1] <= s[0] {
			continue
		}
		if _, err := d.f.WriteAt(zeros[:s[1]-s[0]], s[0]); err != nil {
			return fmt.Errorf("ramdisk: wipe %s: zeroing bytes %d to %d: %w", d.path, s[0], s[1], err)
		}
	}
	if err := d.f.Sync(); err != nil {
		return fmt.Errorf("ramdisk: wipe %s: sync: %w", d.path, err)
	}
	if d.block {
		if err := rereadPartitions(d.f); err != nil {
			return fmt.Errorf("ramdisk: wipe %s: the kernel keeps the old partition table: %w", d.path, err)
		}
	}
	return nil
}
