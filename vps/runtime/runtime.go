// Package runtime is the contract between the vps module's node side (the converger of the
// desired-state part vps.instances, in bcd) and the hypervisors it drives: libvirt-kvm
// (vps/runtime/libvirt, through go-libvirt) and cloud-hypervisor (vps/runtime/chv, through its
// HTTP API). A runtime only carries out: what should exist and in which power state is decided by
// the control plane, and the converger asks a runtime to make it so, instance by instance.
package runtime

import (
	"context"
	"errors"
)

// Power states an instance is asked to be in.
const (
	PowerRunning = "running"
	PowerPaused  = "paused" // running, its vCPUs stopped: a warm sandbox, resumed in milliseconds
	PowerStopped = "stopped"
)

// States an instance is found in (Status.State).
const (
	StateRunning = "running"
	StatePaused  = "paused"
	StateStopped = "stopped" // defined, not running
	StateError   = "error"
)

// Instance is what a runtime makes exist. Paths are local to the host: the converger has fetched
// and checked the images before it asks.
type Instance struct {
	ID        string // the control plane's id; the runtime names its VM from it (Name)
	VCPUs     int
	MemoryMiB int
	// Boot: a kernel with its initramfs and command line (direct boot), and/or a disk image.
	Kernel, Initrd, Cmdline string
	Disk                    string // a qcow2 or raw image the instance boots from and writes to (its own copy)
	// DiskFormat is Disk's format, FormatRaw or FormatQcow2, as the host decided it
	// (ImageFormat) and checked it (CheckImage) when the image entered its cache. Required with
	// a Disk: a runtime never lets QEMU, libvirt or cloud-hypervisor probe an image's format,
	// and checks the image again before it builds the instance's disk on it.
	DiskFormat string
	// DiskGiB grows the instance's own disk to this size when it is made (its flavor's disk);
	// 0, or less than the image, leaves it at the image's size.
	DiskGiB int
	Power   string // PowerRunning, PowerPaused or PowerStopped
	NICs    []NIC
	// Console is where the instance's serial console is served, a Unix socket path the runtime
	// creates (the node's access.console attaches to it).
	Console string
	// Agent, if set, is where the instance's second serial port is served, a Unix socket path
	// like Console's: a sandbox's guest runs SSH on it (docs/sandboxes.md, Exec over SSH).
	Agent string
	// GPUs are PCI addresses of devices passed through (0000:3b:00.0), or MIG device UUIDs.
	GPUs []string
	// Seed, if set, is a read-only image given to the guest as a second disk: its cloud-init
	// NoCloud seed (an ISO 9660 volume labelled cidata).
	Seed string
}

// NIC is a network interface on a host bridge, optionally on a VLAN.
type NIC struct {
	MAC    string
	Bridge string
	VLAN   int // 0: untagged
}

// Status is what a runtime found of an instance.
type Status struct {
	ID     string
	State  string // StateRunning, StatePaused, StateStopped or StateError
	Detail string // why, for StateError
}

// Runtime drives one hypervisor on one host. Every call converges: asked twice, it does the work
// once.
type Runtime interface {
	// Name is the runtime's name in the API: libvirt-kvm, cloud-hypervisor.
	Name() string
	// List returns the instances this runtime manages on the host (those it made, not others).
	List(ctx context.Context) ([]Status, error)
	// Ensure makes in exist in its power state: defines it if missing, starts, pauses, resumes
	// or stops it. A change of shape (vCPUs, memory) is applied at its next start.
	Ensure(ctx context.Context, in Instance) (Status, error)
	// Reboot restarts a running instance.
	Reboot(ctx context.Context, id string) error
	// Delete stops the instance and removes it and what the runtime kept of it. Deleting one
	// that does not exist is not an error.
	Delete(ctx context.Context, id string) error
	// Save writes the instance's whole state, memory included, to path and leaves it as it was
	// (running or paused); Restore makes in from a saved state, in in's power state. A saved
	// state restores on the host that saved it, with the same runtime.
	Save(ctx context.Context, id, path string) error
	Restore(ctx context.Context, path string, in Instance) (Status, error)
}

// ErrNotFound is an instance the runtime does not have.
var ErrNotFound = errors.New("runtime: no such instance")

// Name is the name a runtime gives the VM of an instance id, so that List can tell its own VMs
// from others on the host.
func Name(id string) string { return "bc-" + id }
