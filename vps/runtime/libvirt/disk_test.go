package libvirt

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"

	"github.com/better-compute/compute/vps/runtime"
)

// TestDisksAreBuiltOnlyOnImagesThatStandAlone: the domain's disk is the instance's qcow2
// overlay, made on its image in the format the instance says (never probed), after the image
// was checked: a qcow2 with a backing file or a data file is refused before anything is made
// or defined, and a qcow2 given as raw is raw bytes to the guest, not the file its header
// names. No libvirtd: the domain's XML and its disk are what is checked.
func TestDisksAreBuiltOnlyOnImagesThatStandAlone(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skipf("needs qemu-img (apt-get install qemu-utils): %v", err)
	}
	base := t.TempDir()
	r, err := New(Options{StateDir: filepath.Join(base, "state")})
	if err != nil {
		t.Fatal(err)
	}
	qemuImg := func(args ...string) []byte {
		t.Helper()
		out, err := exec.Command("qemu-img", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("qemu-img %v: %v\n%s", args, err, out)
		}
		return out
	}
	host := filepath.Join(base, "shadow")
	if err := os.WriteFile(host, bytes.Repeat([]byte("HOST-SECRET!"), 1<<14), 0o600); err != nil {
		t.Fatal(err)
	}
	backed := filepath.Join(base, "backed.qcow2")
	qemuImg("create", "-q", "-f", "qcow2", "-b", host, "-F", "raw", backed, "1M")
	withData := filepath.Join(base, "data.qcow2")
	qemuImg("create", "-q", "-f", "qcow2", "-o", "data_file="+filepath.Join(base, "data-file")+",data_file_raw=on", withData, "1M")
	instance := func(id, disk, format string) runtime.Instance {
		return runtime.Instance{ID: id, VCPUs: 1, MemoryMiB: 128, Disk: disk, DiskFormat: format, Power: runtime.PowerRunning}
	}
	ctx := context.Background()
	for name, image := range map[string]string{"a backing file": backed, "a data file": withData} {
		if _, err := r.domainXML(ctx, instance("a", image, runtime.FormatQcow2), nil); !errors.Is(err, runtime.ErrImageNamesAFile) {
			t.Fatalf("a qcow2 image with %s: %v; want it refused", name, err)
		}
		if _, err := os.Stat(filepath.Join(r.opts.StateDir, "a")); !os.IsNotExist(err) {
			t.Fatalf("a refused image left the instance's directory: %v", err)
		}
	}
	for _, format := range []string{"", "vmdk"} {
		if err := checkInstance(instance("a", backed, format)); err == nil || !strings.Contains(err.Error(), "DiskFormat") {
			t.Fatalf("DiskFormat %q: %v; want it refused, naming the field", format, err)
		}
	}

	// The same bytes given as raw: the guest reads them, not the host's file.
	x, err := r.domainXML(ctx, instance("b", backed, runtime.FormatRaw), nil)
	if err != nil {
		t.Fatal(err)
	}
	var dom libvirtxml.Domain
	if err := dom.Unmarshal(x); err != nil {
		t.Fatal(err)
	}
	disk := r.diskPath("b")
	if d := dom.Devices.Disks; len(d) != 1 || d[0].Driver.Type != "qcow2" || d[0].Source.File.File != disk {
		t.Fatalf("the domain's disks: %s", x)
	}
	var info struct {
		BackingFile   string `json:"full-backing-filename"`
		BackingFormat string `json:"backing-filename-format"`
	}
	if err := json.Unmarshal(qemuImg("info", "-U", "--output=json", "-f", "qcow2", disk), &info); err != nil {
		t.Fatal(err)
	}
	if info.BackingFile != backed || info.BackingFormat != "raw" {
		t.Fatalf("b's disk: %+v; want an overlay on %s read as raw", info, backed)
	}
	read := filepath.Join(base, "b.raw")
	qemuImg("convert", "-U", "-f", "qcow2", "-O", "raw", disk, read)
	if b, err := os.ReadFile(read); err != nil || bytes.Contains(b, []byte("HOST-SECRET!")) {
		t.Fatalf("b's guest reads the file its image's header names (%v)", err)
	}
}
