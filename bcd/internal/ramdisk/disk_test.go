package ramdisk

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// oldDisk makes a regular file of size bytes, every byte 0xAA: a disk holding something.
func oldDisk(t *testing.T, size int) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk")
	if err := os.WriteFile(p, bytes.Repeat([]byte{0xAA}, size), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// loopDevice attaches a loop device to a new file of size bytes, every byte 0xAA, and detaches
// it when the test ends. It skips the test unless it runs as root with losetup. Only this
// device, which the test made, is ever written. Its tests are not run in parallel with each
// other: two losetup --find at once may race for the same free device.
func loopDevice(t *testing.T, size int) (dev, file string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("loop devices need root")
	}
	losetup, err := exec.LookPath("losetup")
	if err != nil {
		t.Skip("losetup is not installed (Debian: mount)")
	}
	file = oldDisk(t, size)
	out, err := exec.Command(losetup, "--find", "--show", file).CombinedOutput()
	if err != nil {
		t.Skipf("cannot attach a loop device here: %v: %s", err, out)
	}
	dev = strings.TrimSpace(string(out))
	if !strings.HasPrefix(dev, "/dev/loop") {
		t.Fatalf("losetup answered %q, not a loop device", dev)
	}
	t.Cleanup(func() {
		if out, err := exec.Command(losetup, "--detach", dev).CombinedOutput(); err != nil {
			t.Errorf("detaching %s: %v: %s", dev, err, out)
		}
	})
	return dev, file
}

// readAll reads a disk (a file, or a loop device) whole.
func readAll(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkWiped fails the test unless the first and last MiB of b are zero.
func checkWiped(t *testing.T, b []byte) {
	t.Helper()
	n := min(len(b), wipeSpan)
	if i := bytes.IndexFunc(b[:n], func(r rune) bool { return r != 0 }); i >= 0 {
		t.Errorf("byte %d of the first MiB is not zero: the disk is not wiped", i)
	}
	if i := bytes.IndexFunc(b[len(b)-n:], func(r rune) bool { return r != 0 }); i >= 0 {
		t.Errorf("byte %d of the last MiB is not zero: the disk is not wiped", len(b)-n+i)
	}
}

func TestWipeZeroesBothEndsOfAFile(t *testing.T) {
	t.Parallel()
	const size = 4<<20 + 512
	disk := oldDisk(t, size)
	if err := Wipe(t.Context(), disk); err != nil {
		t.Fatal(err)
	}
	b := readAll(t, disk)
	if len(b) != size {
		t.Fatalf("the disk is now %d bytes, was %d: a wipe keeps its size", len(b), size)
	}
	checkWiped(t, b)
	if mid := b[wipeSpan : size-wipeSpan]; !bytes.Equal(mid, bytes.Repeat([]byte{0xAA}, len(mid))) {
		t.Errorf("the middle of a file was changed: only the ends are wiped")
	}
}

func TestWipeZeroesASmallFileWhole(t *testing.T) {
	t.Parallel()
	disk := oldDisk(t, 100<<10)
	if err := Wipe(t.Context(), disk); err != nil {
		t.Fatal(err)
	}
	if b := readAll(t, disk); !bytes.Equal(b, make([]byte, 100<<10)) {
		t.Error("a disk smaller than 2 MiB is not all zeros")
	}
}

func TestWipeRefuses(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	if err := Wipe(ctx, t.TempDir()); err == nil || !strings.Contains(err.Error(), "neither a block device nor a regular file") {
		t.Errorf("a directory: err = %v", err)
	}
	if err := Wipe(ctx, filepath.Join(t.TempDir(), "absent")); err == nil || !strings.Contains(err.Error(), "absent") {
		t.Errorf("a missing disk: err = %v", err)
	}
	if _, err := os.Stat("/dev/null"); err == nil {
		if err := Wipe(ctx, "/dev/null"); err == nil || !strings.Contains(err.Error(), "neither") {
			t.Errorf("a character device: err = %v", err)
		}
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	disk := oldDisk(t, 4<<20)
	if err := Wipe(cancelled, disk); err == nil {
		t.Error("a cancelled wipe succeeded")
	}
}

func TestWipeALoopDevice(t *testing.T) {
	dev, file := loopDevice(t, 8<<20)
	if err := Wipe(t.Context(), dev); err != nil {
		t.Fatal(err)
	}
	b := readAll(t, dev)
	if len(b) != 8<<20 {
		t.Fatalf("read %d bytes of the device, want %d", len(b), 8<<20)
	}
	checkWiped(t, b)
	checkWiped(t, readAll(t, file)) // and it reached the file behind the device
}
