// Package chv is the cloud-hypervisor runtime of the vps module: it runs each instance as its own
// cloud-hypervisor process and drives it through the process's HTTP API on a Unix socket
// (--api-socket), as runtime.Runtime asks.
//
// A VM's files live in StateDir/bc-<id>/ (see docs/vps-chv.md): the API socket, the record of
// the configuration the VM was created with, the VMM's pid and log, and the instance's own disk
// (a qcow2 overlay on its image). The VMM runs in a session
// of its own, detached from bcd, so that it outlives bcd's restarts; the runtime finds it again by
// its socket. Its serial console is served on the instance's Console socket, its NICs are tap
// devices the runtime puts on the NICs' bridges (Taps), and GPUs are passed through with VFIO.
//
// Running VMs needs KVM, cloud-hypervisor, and root (or CAP_NET_ADMIN for the taps and access to
// /dev/kvm and the VFIO groups). The package is tested against a fake cloud-hypervisor that
// serves the API as its OpenAPI description says; it has not run a real VM here.
package chv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/better-compute/compute/vps/runtime"
)

// Defaults of Options.
const (
	DefaultBinary       = "cloud-hypervisor"
	DefaultQemuImg      = "qemu-img"
	DefaultStateDir     = "/var/lib/bcd/cloud-hypervisor"
	DefaultStartTimeout = 10 * time.Second
	DefaultStopTimeout  = 10 * time.Second
	DefaultCallTimeout  = time.Minute
)

// RuntimeName is the runtime's name in the API.
const RuntimeName = "cloud-hypervisor"

// Options configure a Runtime. Zero values mean the documented defaults.
type Options struct {
	// Binary is the cloud-hypervisor executable, a path or a name looked up on PATH
	// (DefaultBinary).
	Binary string
	// QemuImg is the qemu-img executable, a path or a name looked up on PATH (DefaultQemuImg).
	// It makes the copy-on-write disks of instances that have a Disk, and copies them into
	// saved states and back; instances without a Disk do not need it.
	QemuImg string
	// StateDir is an absolute directory that holds a directory per VM: its API socket, log,
	// pid and configuration record (DefaultStateDir). It is created when the first VM is.
	StateDir string
	// Firmware is the firmware (e.g. rust-hypervisor-fw or CLOUDHV.fd) that boots instances that
	// have a disk and no kernel. Empty: such instances are refused.
	Firmware string
	// Args are more arguments for every cloud-hypervisor process, e.g. "--no-shutdown" (since
	// v52: the VMM stays when its guest powers off) or "-v".
	Args []string
	// Taps makes the host side of NICs (default NetlinkTaps, which needs CAP_NET_ADMIN).
	Taps Taps
	// StartTimeout is how long a new VMM has to answer on its API socket (DefaultStartTimeout);
	// StopTimeout how long one has to exit after vmm.shutdown before it is killed
	// (DefaultStopTimeout).
	StartTimeout, StopTimeout time.Duration
	// CallTimeout bounds how long a call of a VMM's API waits for its answer
	// (DefaultCallTimeout), so that a VMM that stops answering does not hold its instance
	// forever. vm.snapshot and vm.restore, whose time grows with the VM's memory, are bounded
	// by the caller's context only.
	CallTimeout time.Duration
}

// Runtime is the cloud-hypervisor runtime.Runtime. It is safe for concurrent use; calls for one
// instance are serialized.
type Runtime struct {
	opts    Options
	binary  string // resolved
	pciRoot string // where PCI devices are in sysfs; tests point it elsewhere

	mu    sync.Mutex
	locks map[string]*instanceLock // by instance id, while a call holds or waits for it
}

// instanceLock is one instance's lock and how many calls hold or wait for it: the last one out
// removes it, so the map holds only instances being worked on.
type instanceLock struct {
	sync.Mutex
	users int
}

var _ runtime.Runtime = (*Runtime)(nil)

// New returns a Runtime. It checks the options and that the binary exists; it starts nothing.
func New(opts Options) (*Runtime, error) {
	o := opts
	o.Args = append([]string(nil), opts.Args...)
	if o.Binary == "" {
		o.Binary = DefaultBinary
	}
	if o.QemuImg == "" {
		o.QemuImg = DefaultQemuImg
	}
	if o.StateDir == "" {
		o.StateDir = DefaultStateDir
	}
	if o.Taps == nil {
		o.Taps = NetlinkTaps{}
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = DefaultStartTimeout
	}
	if o.StopTimeout == 0 {
		o.StopTimeout = DefaultStopTimeout
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = DefaultCallTimeout
	}
	if !filepath.IsAbs(o.StateDir) {
		return nil, fmt.Errorf("chv: Options.StateDir %q is not an absolute path", o.StateDir)
	}
	o.StateDir = filepath.Clean(o.StateDir)
	if o.Firmware != "" && !filepath.IsAbs(o.Firmware) {
		return nil, fmt.Errorf("chv: Options.Firmware %q is not an absolute path", o.Firmware)
	}
	if o.StartTimeout < 0 || o.StopTimeout < 0 || o.CallTimeout < 0 {
		return nil, errors.New("chv: Options.StartTimeout, StopTimeout and CallTimeout must not be negative")
	}
	bin, err := exec.LookPath(o.Binary)
	if err != nil {
		return nil, fmt.Errorf("chv: Options.Binary: %w (install cloud-hypervisor from "+
			"https://github.com/cloud-hypervisor/cloud-hypervisor/releases; Debian bookworm does not package it)", err)
	}
	if bin, err = filepath.Abs(bin); err != nil {
		return nil, fmt.Errorf("chv: Options.Binary: %w", err)
	}
	return &Runtime{opts: o, binary: bin, pciRoot: "/sys/bus/pci/devices", locks: map[string]*instanceLock{}}, nil
}

// Name returns "cloud-hypervisor".
func (r *Runtime) Name() string { return RuntimeName }

// lock serializes the calls for one instance; the returned func unlocks.
func (r *Runtime) lock(id string) func() {
	r.mu.Lock()
	l, ok := r.locks[id]
	if !ok {
		l = &instanceLock{}
		r.locks[id] = l
	}
	l.users++
	r.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		r.mu.Lock()
		if l.users--; l.users == 0 {
			delete(r.locks, id)
		}
		r.mu.Unlock()
	}
}

// client is a client of the VM's VMM.
func (r *Runtime) client(v vmFiles) *client { return newClient(v.name, v.socket, r.opts.CallTimeout) }

// vmFiles are the paths of one VM under StateDir.
type vmFiles struct {
	name   string // bc-<id>
	dir    string
	socket string // the API socket
	record string // the configuration the VM was created with (record.json)
	disk   string // the instance's own disk, an overlay on its image
	pid    string
	log    string // the VMM's stdout and stderr
	serial string // the serial console when the instance has no Console socket
}

func (r *Runtime) files(id string) vmFiles {
	name := runtime.Name(id)
	dir := filepath.Join(r.opts.StateDir, name)
	return vmFiles{
		name:   name,
		dir:    dir,
		socket: filepath.Join(dir, "api.sock"),
		record: filepath.Join(dir, "record.json"),
		disk:   filepath.Join(dir, "disk.qcow2"),
		pid:    filepath.Join(dir, "pid"),
		log:    filepath.Join(dir, "cloud-hypervisor.log"),
		serial: filepath.Join(dir, "serial.log"),
	}
}

// maxSocketPath is the longest path a Unix socket may have on Linux (sun_path less its NUL).
const maxSocketPath = 107

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// checkID refuses an id that cannot name files and sockets.
func (r *Runtime) checkID(id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("chv: instance id %q: want 1 to 64 letters, digits, '.', '_' or '-', not starting with a punctuation mark", id)
	}
	if s := r.files(id).socket; len(s) > maxSocketPath {
		return fmt.Errorf("chv: instance %s: its API socket %s is longer than a Unix socket path may be (%d bytes): use a shorter Options.StateDir", id, s, maxSocketPath)
	}
	return nil
}

// notFound is the error for an instance the runtime does not have.
func notFound(id string) error {
	return fmt.Errorf("chv: instance %s: %w", id, runtime.ErrNotFound)
}

// exists reports whether the runtime has a VM for the instance (its directory).
func exists(v vmFiles) (bool, error) {
	_, err := os.Stat(v.dir)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// detached returns a context for the calls that must finish even when ctx is cancelled (resuming
// a VM that Save paused), bounded by d.
func detached(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), d)
}
