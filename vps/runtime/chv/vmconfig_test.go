package chv

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/compute/vps/runtime"
)

// TestNewChecksItsOptions: a bad option is refused, naming it; a missing binary says where to
// get cloud-hypervisor.
func TestNewChecksItsOptions(t *testing.T) {
	t.Parallel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		opts Options
		want string
	}{
		{Options{Binary: exe, StateDir: "relative"}, `Options.StateDir "relative" is not an absolute path`},
		{Options{Binary: exe, StateDir: "/x", Firmware: "fw.bin"}, `Options.Firmware "fw.bin" is not an absolute path`},
		{Options{Binary: exe, StateDir: "/x", CallTimeout: -1}, "must not be negative"},
		{Options{Binary: "/nonexistent/cloud-hypervisor", StateDir: "/x"}, "Options.Binary"},
		{Options{Binary: "/nonexistent/cloud-hypervisor", StateDir: "/x"}, "cloud-hypervisor/releases"},
	} {
		if _, err := New(c.opts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v): %v; want an error saying %q", c.opts, err, c.want)
		}
	}
	r, err := New(Options{Binary: exe})
	if err != nil {
		t.Fatal(err)
	}
	if r.opts.StateDir != DefaultStateDir || r.opts.CallTimeout != DefaultCallTimeout || r.opts.QemuImg != DefaultQemuImg || r.Name() != "cloud-hypervisor" {
		t.Fatalf("defaults: %+v, %s", r.opts, r.Name())
	}
}

// TestEnsureRefusesBadInstances: an instance the runtime cannot make is refused before
// anything is made, the error naming the field.
func TestEnsureRefusesBadInstances(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	long := "/" + strings.Repeat("c", maxSocketPath)
	cases := []struct {
		edit func(*runtime.Instance)
		want string
	}{
		{func(in *runtime.Instance) { in.ID = "-a" }, `instance id "-a"`},
		{func(in *runtime.Instance) { in.ID = "a/b" }, `instance id "a/b"`},
		{func(in *runtime.Instance) { in.VCPUs = 0 }, "VCPUs 0 is out of 1..255"},
		{func(in *runtime.Instance) { in.MemoryMiB = -1 }, "MemoryMiB -1 must be positive"},
		{func(in *runtime.Instance) { in.Kernel = "" }, "has neither Kernel nor Disk"},
		{func(in *runtime.Instance) { in.Kernel, in.Disk = "", h.kernel }, "needs a firmware: set Options.Firmware"},
		{func(in *runtime.Instance) { in.Kernel = "vmlinuz" }, `Kernel "vmlinuz" is not an absolute path`},
		{func(in *runtime.Instance) { in.Console = "a.sock" }, `Console "a.sock" is not an absolute path`},
		{func(in *runtime.Instance) { in.Console = long }, "Console " + long + " is longer than a Unix socket path may be"},
		{func(in *runtime.Instance) { in.Power = "on" }, `Power "on"`},
		{func(in *runtime.Instance) { in.NICs[0].Bridge = "" }, "NICs[0] has no Bridge"},
		{func(in *runtime.Instance) { in.NICs[0].VLAN = 4095 }, "NICs[0].VLAN 4095 is out of 0..4094"},
		{func(in *runtime.Instance) { in.NICs[0].MAC = "52:54:00" }, `NICs[0].MAC "52:54:00" is not an Ethernet address`},
		{func(in *runtime.Instance) { in.NICs = make([]runtime.NIC, maxNICs+1) }, "17 NICs, at most 16"},
		{func(in *runtime.Instance) { in.Disk = filepath.Join(h.base, "missing.img") }, "Disk: stat"},
		{func(in *runtime.Instance) { in.Disk, in.DiskFormat = h.kernel, "" }, `DiskFormat "": want "raw" or "qcow2"`},
		{func(in *runtime.Instance) { in.Disk, in.DiskFormat = h.kernel, "vmdk" }, `DiskFormat "vmdk": want "raw" or "qcow2"`},
		{func(in *runtime.Instance) { in.GPUs = []string{"MIG-0d3c2f1a-0000-0000-0000-000000000000"} }, "GPUs[0]: \"MIG-0d3c2f1a-0000-0000-0000-000000000000\" is not a PCI address"},
	}
	for _, c := range cases {
		in := h.instance("a")
		c.edit(&in)
		if _, err := h.r.Ensure(context.Background(), in); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Ensure(%+v): %v; want an error saying %q", in, err, c.want)
		}
	}
	if _, err := os.Stat(h.stateDir); !os.IsNotExist(err) {
		t.Fatalf("refused instances made %s: %v", h.stateDir, err)
	}
}

// TestGPUsArePassedThroughWithVFIO: a GPU bound to vfio-pci is given to the VM by its sysfs path
// (the fake opens it at boot, as cloud-hypervisor does); one bound to another driver, or
// missing, is refused, saying what to do.
func TestGPUsArePassedThroughWithVFIO(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	sys := filepath.Join(h.base, "sys")
	h.r.pciRoot = filepath.Join(sys, "bus", "pci", "devices")
	device := func(addr, driver string) {
		dir := filepath.Join(h.r.pciRoot, addr)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if driver != "" {
			if err := os.MkdirAll(filepath.Join(sys, "bus", "pci", "drivers", driver), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join("..", "..", "drivers", driver), filepath.Join(dir, "driver")); err != nil {
				t.Fatal(err)
			}
		}
	}
	device("0000:3b:00.0", "vfio-pci")
	device("0000:5e:00.0", "nvidia")
	device("0000:86:00.0", "")

	in := h.instance("g")
	in.GPUs = []string{"3B:00.0"}
	h.ensure(in, runtime.StateRunning)
	var cfg vmConfig
	if err := json.Unmarshal(h.requests("g", "vm.create")[0].Body, &cfg); err != nil {
		t.Fatal(err)
	}
	want := []deviceConfig{{Path: filepath.Join(h.r.pciRoot, "0000:3b:00.0"), ID: "gpu0"}}
	if len(cfg.Devices) != 1 || cfg.Devices[0] != want[0] {
		t.Fatalf("devices = %+v; want %+v", cfg.Devices, want)
	}
	for gpu, msg := range map[string]string{
		"0000:5e:00.0": "is bound to nvidia, not vfio-pci: bind it to vfio-pci (driverctl set-override 0000:5e:00.0 vfio-pci)",
		"0000:86:00.0": "is bound to no driver, not vfio-pci",
		"0000:af:00.0": "PCI device 0000:af:00.0: stat",
	} {
		bad := h.instance("b")
		bad.GPUs = []string{gpu}
		if _, err := h.r.Ensure(context.Background(), bad); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("Ensure with GPU %s: %v; want an error saying %q", gpu, err, msg)
		}
	}
}
