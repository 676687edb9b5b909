package chv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/better-compute/compute/vps/runtime"
)

// maxNICs bounds an instance's NICs (and keeps tap names within 15 bytes).
const maxNICs = 16

// checkInstance refuses an instance the runtime cannot make, naming the field.
func (r *Runtime) checkInstance(in runtime.Instance) error {
	if err := r.checkID(in.ID); err != nil {
		return err
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("chv: instance %s: "+format, append([]any{in.ID}, args...)...)
	}
	switch {
	case in.VCPUs < 1 || in.VCPUs > 255:
		return bad("VCPUs %d is out of 1..255", in.VCPUs)
	case in.MemoryMiB < 1:
		return bad("MemoryMiB %d must be positive", in.MemoryMiB)
	case in.Kernel == "" && in.Disk == "":
		return bad("has neither Kernel nor Disk to boot from")
	case in.Kernel == "" && r.opts.Firmware == "":
		return bad("boots from its Disk, which needs a firmware: set Options.Firmware (e.g. CLOUDHV.fd)")
	case in.Kernel == "" && (in.Initrd != "" || in.Cmdline != ""):
		return bad("Initrd and Cmdline need a Kernel")
	case in.Disk != "" && in.DiskFormat != runtime.FormatRaw && in.DiskFormat != runtime.FormatQcow2:
		// Never probed: the host says what the image is (runtime.ImageFormat).
		return bad("DiskFormat %q: want %q or %q", in.DiskFormat, runtime.FormatRaw, runtime.FormatQcow2)
	case len(in.NICs) > maxNICs:
		return bad("%d NICs, at most %d", len(in.NICs), maxNICs)
	}
	switch in.Power {
	case runtime.PowerRunning, runtime.PowerPaused, runtime.PowerStopped:
	default:
		return bad("Power %q: want %q, %q or %q", in.Power, runtime.PowerRunning, runtime.PowerPaused, runtime.PowerStopped)
	}
	for name, p := range map[string]string{"Kernel": in.Kernel, "Initrd": in.Initrd, "Disk": in.Disk, "Console": in.Console} {
		if p != "" && !filepath.IsAbs(p) {
			return bad("%s %q is not an absolute path", name, p)
		}
	}
	if len(in.Console) > maxSocketPath {
		return bad("Console %s is longer than a Unix socket path may be", in.Console)
	}
	for i, n := range in.NICs {
		if n.Bridge == "" {
			return bad("NICs[%d] has no Bridge", i)
		}
		if n.VLAN < 0 || n.VLAN > 4094 {
			return bad("NICs[%d].VLAN %d is out of 0..4094", i, n.VLAN)
		}
		if n.MAC != "" {
			if hw, err := net.ParseMAC(n.MAC); err != nil || len(hw) != 6 {
				return bad("NICs[%d].MAC %q is not an Ethernet address", i, n.MAC)
			}
		}
	}
	return nil
}

// vmConfig is the VmConfig that makes in, and the taps its NICs need. It checks that the disk's
// image exists and that GPUs are bound to vfio-pci.
func (r *Runtime) vmConfig(in runtime.Instance, v vmFiles) (vmConfig, []Tap, error) {
	cfg := vmConfig{
		CPUs:    cpusConfig{BootVCPUs: in.VCPUs, MaxVCPUs: in.VCPUs},
		Memory:  memoryConfig{Size: int64(in.MemoryMiB) << 20},
		Console: consoleConfig{Mode: "Off"},
		Serial:  consoleConfig{Mode: "Socket", Socket: in.Console},
	}
	if in.Console == "" {
		cfg.Serial = consoleConfig{Mode: "File", File: v.serial}
	}
	if in.Kernel != "" {
		cfg.Payload = payloadConfig{Kernel: in.Kernel, Initramfs: in.Initrd, Cmdline: in.Cmdline}
	} else {
		cfg.Payload = payloadConfig{Firmware: r.opts.Firmware}
	}
	if in.Disk != "" {
		if _, err := os.Stat(in.Disk); err != nil {
			return vmConfig{}, nil, fmt.Errorf("chv: instance %s: Disk: %w", in.ID, err)
		}
		// The instance's own overlay on the image (disk.go).
		cfg.Disks = []diskConfig{diskOf(v)}
	}
	if in.Seed != "" { // the cloud-init seed, read-only, after the boot disk
		cfg.Disks = append(cfg.Disks, diskConfig{Path: in.Seed, ImageType: "Raw", Readonly: true, ID: "seed"})
	}
	var taps []Tap
	for i, n := range in.NICs {
		t := Tap{Name: tapName(in.ID, i), Bridge: n.Bridge, VLAN: n.VLAN}
		taps = append(taps, t)
		cfg.Net = append(cfg.Net, netConfig{Tap: t.Name, MAC: strings.ToLower(n.MAC), ID: "net" + strconv.Itoa(i)})
	}
	for i, g := range in.GPUs {
		path, err := r.vfioDevice(g)
		if err != nil {
			return vmConfig{}, nil, fmt.Errorf("chv: instance %s: GPUs[%d]: %w", in.ID, i, err)
		}
		cfg.Devices = append(cfg.Devices, deviceConfig{Path: path, ID: "gpu" + strconv.Itoa(i)})
	}
	return cfg, taps, nil
}

var pciAddress = regexp.MustCompile(`^(?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$`)

// vfioDevice is the sysfs path of the GPU at a PCI address, which must be bound to vfio-pci.
func (r *Runtime) vfioDevice(addr string) (string, error) {
	a := strings.ToLower(addr)
	if !pciAddress.MatchString(a) {
		return "", fmt.Errorf("%q is not a PCI address (0000:3b:00.0); this runtime passes whole GPUs "+
			"through with VFIO and cannot pass a MIG device", addr)
	}
	if len(a) == len("3b:00.0") {
		a = "0000:" + a
	}
	path := filepath.Join(r.pciRoot, a)
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("PCI device %s: %w", a, err)
	}
	drv, err := os.Readlink(filepath.Join(path, "driver"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("PCI device %s: %w", a, err)
	}
	if filepath.Base(drv) != "vfio-pci" {
		bound := "no driver"
		if drv != "" {
			bound = filepath.Base(drv)
		}
		return "", fmt.Errorf("PCI device %s is bound to %s, not vfio-pci: bind it to vfio-pci "+
			"(driverctl set-override %s vfio-pci) before it is passed through", a, bound, a)
	}
	return path, nil
}
