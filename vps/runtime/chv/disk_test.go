package chv

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/compute/vps/runtime"
)

// needQemuUtils skips a test that needs qemu-img and qemu-io (Debian: qemu-utils).
func needQemuUtils(t *testing.T) {
	t.Helper()
	for _, c := range []string{"qemu-img", "qemu-io"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("needs %s (apt-get install qemu-utils): %v", c, err)
		}
	}
}

// rawImage writes a 1 MiB raw image of byte b and returns its path.
func rawImage(t *testing.T, dir string, b byte) string {
	t.Helper()
	p := filepath.Join(dir, "image.raw")
	if err := os.WriteFile(p, bytes.Repeat([]byte{b}, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// qemuIO runs qemu-io commands on a qcow2 image: "write -P 0x11 0 64k", "read -P 0x11 0 64k"
// (which fails when the pattern differs).
func qemuIO(t *testing.T, image, cmd string) error {
	t.Helper()
	out, err := exec.Command("qemu-io", "-f", "qcow2", "-c", cmd, image).CombinedOutput()
	if err == nil && strings.Contains(string(out), "Pattern verification failed") {
		err = os.ErrInvalid
	}
	if err != nil {
		return &os.PathError{Op: "qemu-io " + cmd + ": " + strings.TrimSpace(string(out)), Path: image, Err: err}
	}
	return nil
}

// imageInfo is what qemu-img info says of an image.
type imageInfo struct {
	Format        string `json:"format"`
	BackingFile   string `json:"full-backing-filename"`
	BackingFormat string `json:"backing-filename-format"`
}

func qemuImgInfo(t *testing.T, path string) imageInfo {
	t.Helper()
	out, err := exec.Command("qemu-img", "info", "-U", "--output=json", path).Output()
	if err != nil {
		t.Fatalf("qemu-img info %s: %v", path, err)
	}
	var info imageInfo
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatal(err)
	}
	return info
}

func sum(t *testing.T, path string) [32]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(data)
}

// TestEachInstanceWritesItsOwnDisk: Instance.Disk is an image the host's cache shares between
// instances and keeps by its checksum; each instance boots from its own qcow2 overlay on it,
// in its directory, and the image never changes (the VM was given the image itself before).
func TestEachInstanceWritesItsOwnDisk(t *testing.T) {
	t.Parallel()
	needQemuUtils(t)
	h := newHarness(t)
	image := rawImage(t, h.base, 0xAA)
	before := sum(t, image)
	var disks []string
	for _, id := range []string{"a", "b"} {
		in := h.instance(id)
		in.Disk = image
		h.ensure(in, runtime.StateRunning)
		var cfg vmConfig
		if err := json.Unmarshal(h.requests(id, "vm.create")[0].Body, &cfg); err != nil {
			t.Fatal(err)
		}
		if len(cfg.Disks) != 1 {
			t.Fatalf("%s's disks: %+v", id, cfg.Disks)
		}
		d := cfg.Disks[0]
		if d.Path == image || filepath.Dir(d.Path) != h.r.files(id).dir || d.ImageType != "Qcow2" || !d.BackingFiles {
			t.Fatalf("%s boots from %+v; want its own qcow2 overlay in %s", id, d, h.r.files(id).dir)
		}
		if info := qemuImgInfo(t, d.Path); info.Format != "qcow2" || info.BackingFile != image || info.BackingFormat != "raw" {
			t.Fatalf("%s's disk: %+v; want a qcow2 overlay on the raw %s", id, info, image)
		}
		if err := qemuIO(t, d.Path, "read -P 0xaa 0 64k"); err != nil {
			t.Fatalf("%s's disk does not read as its image: %v", id, err)
		}
		disks = append(disks, d.Path)
	}
	if disks[0] == disks[1] {
		t.Fatalf("two instances share the disk %s", disks[0])
	}
	// What one instance writes, the other does not see, and the image does not change.
	if err := qemuIO(t, disks[0], "write -P 0x11 0 64k"); err != nil {
		t.Fatal(err)
	}
	if err := qemuIO(t, disks[1], "read -P 0xaa 0 64k"); err != nil {
		t.Fatalf("b sees a's writes: %v", err)
	}
	if sum(t, image) != before {
		t.Fatal("the image changed")
	}
	// Ensure again keeps the disk, with what was written on it.
	in := h.instance("a")
	in.Disk = image
	h.ensure(in, runtime.StateRunning)
	if err := qemuIO(t, disks[0], "read -P 0x11 0 64k"); err != nil {
		t.Fatalf("a's disk after Ensure again: %v", err)
	}
}

// TestAnImageThatNamesAHostFileGetsNoDisk: the runtime checks an image again before it builds
// an instance's disk on it. A qcow2 image with a backing file or an external data file is
// refused (runtime.ErrImageNamesAFile) and leaves nothing of the instance; an image is read in
// the format the instance says, never probed: a qcow2 given as raw is raw bytes to the guest,
// not the file its header names.
func TestAnImageThatNamesAHostFileGetsNoDisk(t *testing.T) {
	t.Parallel()
	needQemuUtils(t)
	h := newHarness(t)
	host := filepath.Join(h.base, "shadow")
	if err := os.WriteFile(host, bytes.Repeat([]byte{0x5e}, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	qemuImg := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("qemu-img", args...).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img %v: %v\n%s", args, err, out)
		}
	}
	backed := filepath.Join(h.base, "backed.qcow2")
	qemuImg("create", "-q", "-f", "qcow2", "-b", host, "-F", "raw", backed, "1M")
	withData := filepath.Join(h.base, "data.qcow2")
	qemuImg("create", "-q", "-f", "qcow2", "-o", "data_file="+filepath.Join(h.base, "data-file")+",data_file_raw=on", withData, "1M")
	for name, image := range map[string]string{"a backing file": backed, "a data file": withData} {
		in := h.instance("a")
		in.Disk, in.DiskFormat = image, runtime.FormatQcow2
		if _, err := h.r.Ensure(context.Background(), in); !errors.Is(err, runtime.ErrImageNamesAFile) {
			t.Fatalf("a qcow2 with %s: %v; want it refused", name, err)
		}
		if _, err := os.Stat(h.r.files("a").dir); !os.IsNotExist(err) {
			t.Fatalf("a refused instance left %s: %v", h.r.files("a").dir, err)
		}
	}

	in := h.instance("b")
	in.Disk, in.DiskFormat = backed, runtime.FormatRaw
	h.ensure(in, runtime.StateRunning)
	disk := h.r.files("b").disk
	if info := qemuImgInfo(t, disk); info.BackingFile != backed || info.BackingFormat != "raw" {
		t.Fatalf("b's disk: %+v; want an overlay on %s read as raw", info, backed)
	}
	if err := qemuIO(t, disk, "read -P 0x5e 0 64k"); err == nil {
		t.Fatal("b's guest reads the file its image's header names")
	}
}
