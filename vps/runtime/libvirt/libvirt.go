// Package libvirt is the libvirt-kvm runtime of the vps module: VMs defined, started, paused,
// saved and restored through libvirtd's RPC protocol with github.com/digitalocean/go-libvirt
// (pure Go, no libvirt C library), their domain XML built with libvirt.org/go/libvirtxml.
//
// Each instance is a persistent domain named runtime.Name(id), its serial console a Unix socket
// libvirt binds at Instance.Console. A stop is a power-off (the guest is not asked), a reboot a
// reset: sandboxes' guests need not run ACPI.
package libvirt

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"
	"libvirt.org/go/libvirtxml"

	"github.com/better-compute/compute/vps/runtime"
)

// Options configure the runtime. Zero values mean the defaults.
type Options struct {
	// Socket is libvirtd's (or virtqemud's) Unix socket; default /run/libvirt/libvirt-sock.
	Socket string
	// URI is the driver to open: qemu:///system (the default) or qemu:///session for a
	// per-user daemon.
	URI string
	// DomainType is kvm (the default) or qemu, for hosts without /dev/kvm (TCG: slow, for tests
	// and emulated hosts).
	DomainType string
	// Emulator is the QEMU binary; empty lets libvirt choose.
	Emulator string
	// StateDir keeps what the runtime makes per instance: copies of disks. Required.
	StateDir string
	// Timeout bounds dialing libvirtd; default 5 s.
	Timeout time.Duration
	// FileOwner ("uid:gid"), if set, owns the files and directories the runtime makes: the user
	// a session-mode libvirtd runs as, which must write disks and saved states. A system
	// libvirtd gives them to its QEMU user itself.
	FileOwner string
}

// Runtime is the libvirt-kvm runtime.
type Runtime struct {
	opts     Options
	uid, gid int // FileOwner's; -1 for none

	mu sync.Mutex
	lv *golibvirt.Libvirt // nil until the first call, and after a lost connection
}

var _ runtime.Runtime = (*Runtime)(nil)

// New checks the options; it connects on first use, so a host whose libvirtd starts later is
// served once it does.
func New(opts Options) (*Runtime, error) {
	opts.Socket = cmp.Or(opts.Socket, "/run/libvirt/libvirt-sock")
	opts.URI = cmp.Or(opts.URI, string(golibvirt.QEMUSystem))
	opts.DomainType = cmp.Or(opts.DomainType, "kvm")
	opts.Timeout = cmp.Or(opts.Timeout, 5*time.Second)
	switch {
	case opts.DomainType != "kvm" && opts.DomainType != "qemu":
		return nil, fmt.Errorf("libvirt: DomainType %q: kvm or qemu", opts.DomainType)
	case !filepath.IsAbs(opts.StateDir):
		return nil, fmt.Errorf("libvirt: StateDir %q must be an absolute path", opts.StateDir)
	case !strings.HasPrefix(opts.URI, "qemu:///"):
		return nil, fmt.Errorf("libvirt: URI %q: qemu:///system or qemu:///session", opts.URI)
	}
	r := &Runtime{opts: opts, uid: -1, gid: -1}
	if opts.FileOwner != "" {
		if _, err := fmt.Sscanf(opts.FileOwner, "%d:%d", &r.uid, &r.gid); err != nil || r.uid < 0 || r.gid < 0 {
			return nil, fmt.Errorf("libvirt: FileOwner %q: want uid:gid", opts.FileOwner)
		}
	}
	if err := r.mkdir(opts.StateDir); err != nil {
		return nil, fmt.Errorf("libvirt: %w", err)
	}
	return r, nil
}

// mkdir makes a directory (and its parents) and gives it to FileOwner.
func (r *Runtime) mkdir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return r.own(dir)
}

// own gives a file the runtime made to FileOwner.
func (r *Runtime) own(path string) error {
	if r.uid < 0 {
		return nil
	}
	return os.Chown(path, r.uid, r.gid)
}

// Name implements runtime.Runtime.
func (*Runtime) Name() string { return "libvirt-kvm" }

// conn returns the connection, dialing it when there is none or it was lost.
func (r *Runtime) conn() (*golibvirt.Libvirt, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lv != nil {
		select {
		case <-r.lv.Disconnected():
			r.lv = nil
		default:
			return r.lv, nil
		}
	}
	lv := golibvirt.NewWithDialer(dialers.NewLocal(dialers.WithSocket(r.opts.Socket), dialers.WithLocalTimeout(r.opts.Timeout)))
	if err := lv.ConnectToURI(golibvirt.ConnectURI(r.opts.URI)); err != nil {
		return nil, fmt.Errorf("libvirt: connect to %s at %s: %w", r.opts.URI, r.opts.Socket, err)
	}
	r.lv = lv
	return lv, nil
}

// Close ends the connection.
func (r *Runtime) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lv == nil {
		return nil
	}
	err := r.lv.Disconnect()
	r.lv = nil
	return err
}

// lookup finds an instance's domain; runtime.ErrNotFound when it has none.
func (r *Runtime) lookup(id string) (*golibvirt.Libvirt, golibvirt.Domain, error) {
	lv, err := r.conn()
	if err != nil {
		return nil, golibvirt.Domain{}, err
	}
	d, err := lv.DomainLookupByName(runtime.Name(id))
	if golibvirt.IsNotFound(err) {
		return lv, d, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	}
	return lv, d, err
}

func stateOf(lv *golibvirt.Libvirt, d golibvirt.Domain) (string, error) {
	s, _, err := lv.DomainGetState(d, 0)
	if err != nil {
		return "", err
	}
	switch golibvirt.DomainState(s) {
	case golibvirt.DomainRunning, golibvirt.DomainBlocked:
		return runtime.StateRunning, nil
	case golibvirt.DomainPaused, golibvirt.DomainPmsuspended:
		return runtime.StatePaused, nil
	case golibvirt.DomainShutoff, golibvirt.DomainShutdown:
		return runtime.StateStopped, nil
	}
	return runtime.StateError, nil // crashed, or no state
}

// List implements runtime.Runtime: the domains named as the runtime names them.
func (r *Runtime) List(ctx context.Context) ([]runtime.Status, error) {
	lv, err := r.conn()
	if err != nil {
		return nil, err
	}
	doms, _, err := lv.ConnectListAllDomains(1, 0)
	if err != nil {
		return nil, fmt.Errorf("libvirt: list domains: %w", err)
	}
	var out []runtime.Status
	for _, d := range doms {
		id, ok := strings.CutPrefix(d.Name, runtime.Name(""))
		if !ok {
			continue
		}
		st, err := stateOf(lv, d)
		if err != nil {
			if golibvirt.IsNotFound(err) {
				continue // deleted while we listed
			}
			return nil, fmt.Errorf("libvirt: state of %s: %w", d.Name, err)
		}
		out = append(out, runtime.Status{ID: id, State: st})
	}
	return out, nil
}

// Ensure implements runtime.Runtime.
func (r *Runtime) Ensure(ctx context.Context, in runtime.Instance) (runtime.Status, error) {
	st := runtime.Status{ID: in.ID}
	if err := checkInstance(in); err != nil {
		return st, err
	}
	lv, d, err := r.lookup(in.ID)
	switch {
	case errors.Is(err, runtime.ErrNotFound):
		if d, err = r.define(ctx, lv, in, nil); err != nil {
			return st, err
		}
	case err != nil:
		return st, err
	}
	state, err := stateOf(lv, d)
	if err != nil {
		return st, fmt.Errorf("libvirt: state of %s: %w", in.ID, err)
	}
	if state == runtime.StateStopped {
		// Stopped: its definition may be brought up to date before it starts again.
		if d, err = r.define(ctx, lv, in, &d.UUID); err != nil {
			return st, err
		}
	}
	switch {
	case in.Power == runtime.PowerRunning && state == runtime.StateStopped:
		err = lv.DomainCreate(d)
	case in.Power == runtime.PowerRunning && state == runtime.StatePaused:
		err = lv.DomainResume(d)
	case in.Power == runtime.PowerPaused && state == runtime.StateStopped:
		_, err = lv.DomainCreateWithFlags(d, uint32(golibvirt.DomainStartPaused))
	case in.Power == runtime.PowerPaused && state == runtime.StateRunning:
		err = lv.DomainSuspend(d)
	case in.Power == runtime.PowerStopped && state != runtime.StateStopped:
		err = lv.DomainDestroy(d)
	}
	if err != nil {
		return st, fmt.Errorf("libvirt: make %s %s: %w", in.ID, in.Power, err)
	}
	st.State, err = stateOf(lv, d)
	return st, err
}

func checkInstance(in runtime.Instance) error {
	switch {
	case in.ID == "" || strings.ContainsAny(in.ID, "/ \x00"):
		return fmt.Errorf("libvirt: instance id %q", in.ID)
	case in.VCPUs < 1 || in.MemoryMiB < 16:
		return fmt.Errorf("libvirt: instance %s: %d vCPUs and %d MiB is not a machine", in.ID, in.VCPUs, in.MemoryMiB)
	case in.Kernel == "" && in.Disk == "":
		return fmt.Errorf("libvirt: instance %s has neither a kernel nor a disk to boot", in.ID)
	case in.Disk != "" && in.DiskFormat != runtime.FormatRaw && in.DiskFormat != runtime.FormatQcow2:
		// Never probed: the host says what the image is (runtime.ImageFormat).
		return fmt.Errorf("libvirt: instance %s: DiskFormat %q: want %q or %q", in.ID, in.DiskFormat, runtime.FormatRaw, runtime.FormatQcow2)
	case in.Power != runtime.PowerRunning && in.Power != runtime.PowerPaused && in.Power != runtime.PowerStopped:
		return fmt.Errorf("libvirt: instance %s: power %q", in.ID, in.Power)
	}
	return nil
}

// define defines an instance's domain, or (with its UUID) redefines it.
func (r *Runtime) define(ctx context.Context, lv *golibvirt.Libvirt, in runtime.Instance, uuid *golibvirt.UUID) (golibvirt.Domain, error) {
	x, err := r.domainXML(ctx, in, uuid)
	if err != nil {
		return golibvirt.Domain{}, err
	}
	d, err := lv.DomainDefineXML(x)
	if err != nil {
		return d, fmt.Errorf("libvirt: define %s: %w", in.ID, err)
	}
	return d, nil
}

// diskPath is the instance's own copy of its disk.
func (r *Runtime) diskPath(id string) string { return filepath.Join(r.opts.StateDir, id, "disk.qcow2") }

func (r *Runtime) domainXML(ctx context.Context, in runtime.Instance, uuid *golibvirt.UUID) (string, error) {
	dom := &libvirtxml.Domain{
		Type:        r.opts.DomainType,
		Name:        runtime.Name(in.ID),
		Description: "a Better Compute instance: managed by bcd; changes here are undone",
		Memory:      &libvirtxml.DomainMemory{Value: uint(in.MemoryMiB), Unit: "MiB"},
		VCPU:        &libvirtxml.DomainVCPU{Value: uint(in.VCPUs)},
		OS: &libvirtxml.DomainOS{
			Type:    &libvirtxml.DomainOSType{Arch: "x86_64", Type: "hvm"},
			Kernel:  in.Kernel,
			Initrd:  in.Initrd,
			Cmdline: in.Cmdline,
		},
		OnPoweroff: "destroy",
		OnReboot:   "restart",
		OnCrash:    "destroy",
		Devices: &libvirtxml.DomainDeviceList{Emulator: r.opts.Emulator,
			// The host's entropy for the guest (virtio-rng): a VM without it waits for its own
			// random numbers after its boot, and with it its SSH host keys and TLS are ready.
			RNGs: []libvirtxml.DomainRNG{{Model: "virtio", Backend: &libvirtxml.DomainRNGBackend{Random: &libvirtxml.DomainRNGBackendRandom{Device: "/dev/urandom"}}}}},
	}
	if uuid != nil {
		u := *uuid
		dom.UUID = fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
	}
	if in.Kernel == "" {
		dom.OS.BootDevices = []libvirtxml.DomainBootDevice{{Dev: "hd"}}
	}
	if in.Disk != "" {
		disk, err := r.ensureDisk(ctx, in)
		if err != nil {
			return "", err
		}
		// The overlay, its format given; the image under it is named in the overlay with its
		// format (ensureDisk), which libvirt and QEMU read from there and never probe.
		dom.Devices.Disks = []libvirtxml.DomainDisk{{
			Device: "disk",
			Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: runtime.FormatQcow2},
			Source: &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: disk}},
			Target: &libvirtxml.DomainDiskTarget{Dev: "vda", Bus: "virtio"},
		}}
	}
	if in.Seed != "" {
		dom.Devices.Disks = append(dom.Devices.Disks, libvirtxml.DomainDisk{
			Device:   "disk",
			Driver:   &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "raw"},
			Source:   &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: in.Seed}},
			Target:   &libvirtxml.DomainDiskTarget{Dev: "vdb", Bus: "virtio"},
			ReadOnly: &libvirtxml.DomainDiskReadOnly{},
		})
	}
	if in.Console != "" {
		if err := r.mkdir(filepath.Dir(in.Console)); err != nil { // QEMU binds it: the directory is its user's
			return "", err
		}
		src := &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "bind", Path: in.Console}}
		port := uint(0)
		dom.Devices.Serials = []libvirtxml.DomainSerial{{Source: src, Target: &libvirtxml.DomainSerialTarget{Port: &port}}}
		dom.Devices.Consoles = []libvirtxml.DomainConsole{{Source: src, Target: &libvirtxml.DomainConsoleTarget{Type: "serial", Port: &port}}}
	}
	if in.Agent != "" { // the second serial port (ttyS1)
		if err := r.mkdir(filepath.Dir(in.Agent)); err != nil {
			return "", err
		}
		port := uint(1)
		dom.Devices.Serials = append(dom.Devices.Serials, libvirtxml.DomainSerial{
			Source: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "bind", Path: in.Agent}},
			Target: &libvirtxml.DomainSerialTarget{Port: &port}})
	}
	for _, n := range in.NICs {
		nic := libvirtxml.DomainInterface{
			Source: &libvirtxml.DomainInterfaceSource{Bridge: &libvirtxml.DomainInterfaceSourceBridge{Bridge: n.Bridge}},
			Model:  &libvirtxml.DomainInterfaceModel{Type: "virtio"},
		}
		if n.MAC != "" {
			nic.MAC = &libvirtxml.DomainInterfaceMAC{Address: n.MAC}
		}
		if n.VLAN > 0 {
			nic.VLan = &libvirtxml.DomainInterfaceVLan{Tags: []libvirtxml.DomainInterfaceVLanTag{{ID: uint(n.VLAN)}}}
		}
		dom.Devices.Interfaces = append(dom.Devices.Interfaces, nic)
	}
	for _, g := range in.GPUs {
		addr, err := pciAddress(g)
		if err != nil {
			return "", fmt.Errorf("libvirt: instance %s: %w", in.ID, err)
		}
		dom.Devices.Hostdevs = append(dom.Devices.Hostdevs, libvirtxml.DomainHostdev{
			Managed:   "yes",
			SubsysPCI: &libvirtxml.DomainHostdevSubsysPCI{Source: &libvirtxml.DomainHostdevSubsysPCISource{Address: addr}},
		})
	}
	return dom.Marshal()
}

// pciAddress reads a PCI address, 0000:3b:00.0.
func pciAddress(s string) (*libvirtxml.DomainAddressPCI, error) {
	var dom, bus, slot, fn uint
	if n, err := fmt.Sscanf(s, "%04x:%02x:%02x.%1x", &dom, &bus, &slot, &fn); err != nil || n != 4 {
		return nil, fmt.Errorf("%q is not a PCI address (0000:3b:00.0): only whole devices are passed through", s)
	}
	return &libvirtxml.DomainAddressPCI{Domain: &dom, Bus: &bus, Slot: &slot, Function: &fn}, nil
}

// ensureDisk makes the instance's own disk once: a qcow2 overlay on its image, which stays as
// the image was. The image is checked first (runtime.CheckImage): one that names another file
// (a backing file, a data file) would let the guest read that file on the host. Its format is
// the instance's, written into the overlay (-F), never probed.
func (r *Runtime) ensureDisk(ctx context.Context, in runtime.Instance) (string, error) {
	p := r.diskPath(in.ID)
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	size, err := runtime.CheckImage(ctx, "qemu-img", in.Disk, in.DiskFormat)
	if err != nil {
		return "", fmt.Errorf("libvirt: instance %s's image: %w", in.ID, err)
	}
	if err := r.mkdir(filepath.Dir(p)); err != nil {
		return "", err
	}
	args := []string{"create", "-q", "-f", "qcow2", "-F", in.DiskFormat, "-b", in.Disk, p + ".new"}
	if want := int64(in.DiskGiB) << 30; want > size { // the flavor's disk, larger than the image
		args = append(args, strconv.FormatInt(want, 10))
	}
	if err := qemuImg(args...); err != nil {
		return "", fmt.Errorf("libvirt: instance %s's disk: %w", in.ID, err)
	}
	if err := r.own(p + ".new"); err != nil {
		return "", err
	}
	return p, os.Rename(p+".new", p)
}

// Reboot implements runtime.Runtime: a reset, which needs nothing of the guest.
func (r *Runtime) Reboot(ctx context.Context, id string) error {
	lv, d, err := r.lookup(id)
	if err != nil {
		return err
	}
	if err := lv.DomainReset(d, 0); err != nil {
		return fmt.Errorf("libvirt: reset %s: %w", id, err)
	}
	return nil
}

// Delete implements runtime.Runtime.
func (r *Runtime) Delete(ctx context.Context, id string) error {
	lv, d, err := r.lookup(id)
	if errors.Is(err, runtime.ErrNotFound) {
		return os.RemoveAll(filepath.Join(r.opts.StateDir, id))
	}
	if err != nil {
		return err
	}
	if err := lv.DomainDestroy(d); err != nil && !isNotRunning(err) && !golibvirt.IsNotFound(err) {
		return fmt.Errorf("libvirt: stop %s: %w", id, err)
	}
	flags := golibvirt.DomainUndefineManagedSave | golibvirt.DomainUndefineSnapshotsMetadata | golibvirt.DomainUndefineNvram
	if err := lv.DomainUndefineFlags(d, flags); err != nil && !golibvirt.IsNotFound(err) {
		return fmt.Errorf("libvirt: undefine %s: %w", id, err)
	}
	return os.RemoveAll(filepath.Join(r.opts.StateDir, id))
}

func isNotRunning(err error) bool {
	var e golibvirt.Error
	return errors.As(err, &e) && golibvirt.ErrorNumber(e.Code) == golibvirt.ErrOperationInvalid
}

// Save implements runtime.Runtime: libvirt writes the memory and device state to path (the
// domain stops while it does), a copy of the disk goes beside it, and the domain is restored
// from path at once, in the state it was in.
func (r *Runtime) Save(ctx context.Context, id, path string) error {
	lv, d, err := r.lookup(id)
	if err != nil {
		return err
	}
	state, err := stateOf(lv, d)
	if err != nil {
		return err
	}
	if state != runtime.StateRunning && state != runtime.StatePaused {
		return fmt.Errorf("libvirt: save %s: it is %s; only a running or paused instance has memory to save", id, state)
	}
	if err := r.mkdir(filepath.Dir(path)); err != nil {
		return err
	}
	flag := golibvirt.DomainSaveRunning
	if state == runtime.StatePaused {
		flag = golibvirt.DomainSavePaused
	}
	if err := lv.DomainSaveFlags(d, path, nil, uint32(flag)); err != nil {
		return fmt.Errorf("libvirt: save %s: %w", id, err)
	}
	disk := r.diskPath(id)
	if _, err := os.Stat(disk); err == nil {
		if err := qemuImg("convert", "-q", "-f", "qcow2", "-O", "qcow2", disk, path+".disk"); err != nil {
			return errors.Join(fmt.Errorf("libvirt: copy %s's disk: %w", id, err), lv.DomainRestoreFlags(path, nil, uint32(flag)))
		}
		if err := r.own(path + ".disk"); err != nil {
			return err
		}
	}
	if err := lv.DomainRestoreFlags(path, nil, uint32(flag)); err != nil {
		return fmt.Errorf("libvirt: resume %s after saving it: %w", id, err)
	}
	return nil
}

// Restore implements runtime.Runtime. libvirt restores a saved state only into the domain that
// saved it (its name and UUID): in.ID must be the instance that saved path. A running copy of
// it is replaced.
func (r *Runtime) Restore(ctx context.Context, path string, in runtime.Instance) (runtime.Status, error) {
	st := runtime.Status{ID: in.ID}
	lv, d, err := r.lookup(in.ID)
	if err != nil && !errors.Is(err, runtime.ErrNotFound) {
		return st, err
	}
	if err == nil {
		if err := lv.DomainDestroy(d); err != nil && !isNotRunning(err) {
			return st, fmt.Errorf("libvirt: stop %s to restore it: %w", in.ID, err)
		}
	}
	if _, err := os.Stat(path + ".disk"); err == nil {
		if err := r.mkdir(filepath.Dir(r.diskPath(in.ID))); err != nil {
			return st, err
		}
		if err := qemuImg("convert", "-q", "-f", "qcow2", "-O", "qcow2", path+".disk", r.diskPath(in.ID)); err != nil {
			return st, fmt.Errorf("libvirt: restore %s's disk: %w", in.ID, err)
		}
		if err := r.own(r.diskPath(in.ID)); err != nil {
			return st, err
		}
	}
	flag := golibvirt.DomainSaveRunning
	if in.Power == runtime.PowerPaused {
		flag = golibvirt.DomainSavePaused
	}
	if err := lv.DomainRestoreFlags(path, nil, uint32(flag)); err != nil {
		return st, fmt.Errorf("libvirt: restore %s: %w", in.ID, err)
	}
	return r.Ensure(ctx, in)
}

// qemuImg runs qemu-img, which every libvirt QEMU host has.
func qemuImg(args ...string) error {
	out, err := exec.Command("qemu-img", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-img %s: %w: %s", args[0], err, bytes.TrimSpace(out))
	}
	return nil
}
