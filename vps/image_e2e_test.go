package vps_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/vps"
)

// TestAnImageThatNamesAHostFileNeverBootsOnARealBCDHost: on a real bcd node over libvirt, a
// tenant's disk image that is a qcow2 backed by a file of the host (readable by QEMU's user,
// so that nothing else stands in the way) is refused: the instance is in error saying what the
// image names, and no domain is defined for it. A flat qcow2 image boots, on its own overlay
// whose backing format the host wrote, not probed.
func TestAnImageThatNamesAHostFileNeverBootsOnARealBCDHost(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skipf("needs qemu-img (apt-get install qemu-utils): %v", err)
	}
	v := startVMHost(t)
	ctx, c, key, h := v.ctx, v.c, v.key, v.h
	host := filepath.Join(h.Dir, "shadow")
	if err := os.WriteFile(host, bytes.Repeat([]byte("HOST-SECRET!"), 1<<14), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	qemuImg := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("qemu-img", args...).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img %v: %v\n%s", args, err, out)
		}
	}
	qemuImg("create", "-q", "-f", "qcow2", "-b", host, "-F", "raw", filepath.Join(dir, "backed.qcow2"), "1M")
	qemuImg("create", "-q", "-f", "qcow2", filepath.Join(dir, "flat.qcow2"), "1M")
	disks := http.NewServeMux()
	sums := map[string]string{}
	for _, name := range []string{"backed.qcow2", "flat.qcow2"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		s := sha256.Sum256(b)
		sums[name] = hex.EncodeToString(s[:])
		disks.HandleFunc("/"+name, func(w http.ResponseWriter, _ *http.Request) { w.Write(b) })
	}
	srv := httptest.NewServer(disks)
	t.Cleanup(srv.Close)
	if _, err := compute.Invoke(ctx, c, key, vps.FlavorsCreate, vps.CreateFlavor{Name: "tiny", VCPUs: 1, MemoryGiB: 1}); err != nil {
		t.Fatal(err)
	}
	create := func(file string) vps.Instance {
		t.Helper()
		name := strings.TrimSuffix(file, ".qcow2")
		if _, err := compute.Invoke(ctx, c, key, vps.VMImagesRegister, vps.RegisterVMImage{Name: name, Cmdline: "console=ttyS0 quiet no_timer_check",
			Kernel: &vps.Artifact{URL: v.images + "/vmlinuz", SHA256: v.sums["vmlinuz"]},
			Initrd: &vps.Artifact{URL: v.images + "/initrd.gz", SHA256: v.sums["initrd.gz"]},
			Disk:   &vps.Artifact{URL: srv.URL + "/" + file, SHA256: sums[file]}}); err != nil {
			t.Fatal(err)
		}
		i, err := compute.Invoke(ctx, c, key, vps.InstancesCreate, vps.CreateInstance{Name: name, Pool: "vms", Flavor: "tiny", Image: name})
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	get := func(id string) vps.Instance {
		t.Helper()
		i, err := compute.Invoke(ctx, c, key, vps.InstancesGet, vps.InstanceRef{Instance: id})
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	virsh := func(args ...string) (string, error) {
		out, err := exec.Command("virsh", append([]string{"-c", "qemu:///session?socket=" + h.Socket}, args...)...).CombinedOutput()
		return string(out), err
	}

	evil := create("backed.qcow2")
	computetest.Eventually(t, 3*time.Minute, "the instance of the backed image in error", func() bool { return get(evil.ID).Status == "error" })
	if d := get(evil.ID).StatusDetail; !strings.Contains(d, "names another file") || !strings.Contains(d, host) {
		t.Fatalf("the error of an image backed by a host file: %q", d)
	}
	if _, err := exec.LookPath("virsh"); err == nil {
		if out, err := virsh("dominfo", "bc-"+evil.ID); err == nil {
			t.Fatalf("a domain was defined for the refused image:\n%s", out)
		}
	}

	honest := create("flat.qcow2")
	computetest.Eventually(t, 3*time.Minute, "the instance of the flat image running", func() bool { return get(honest.ID).Status == "running" })
	overlay := filepath.Join(h.Dir, "vps", "instances", honest.ID, "disk.qcow2")
	if _, err := os.Stat(overlay); err != nil {
		if _, err := exec.LookPath("virsh"); err == nil {
			out, _ := virsh("domblklist", "bc-"+honest.ID)
			t.Logf("the domain's disks:\n%s", out)
		}
		t.Fatalf("the flat image's instance has no overlay at %s: %v", overlay, err)
	}
	out, err := exec.Command("qemu-img", "info", "-U", "--output=json", "-f", "qcow2", overlay).Output()
	if err != nil || !strings.Contains(string(out), `"backing-filename-format": "qcow2"`) {
		t.Fatalf("the overlay does not name its image's format: %v\n%s", err, out)
	}
}
