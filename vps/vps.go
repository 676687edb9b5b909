// Package vps is the virtual machine module: flavors (the shape of an instance), VM images (what
// it boots) and instances, each holding its vCPUs, memory and GPUs through a reservation (the
// same EXCLUDE-guarded bookings as everyone's) and run by a VM host of its pool: bcd node with a
// VM runtime (vps/hostagent over vps/runtime/libvirt or vps/runtime/chv), which the module tells
// what to run through the desired-state part vps.instances and which reports back what it found
// (the contract is vps/hostapi). docs/vps.md has it all.
package vps

import (
	"context"
	"embed"
	"time"

	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/vps/hostapi"
	"github.com/better-compute/compute/vps/provider"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// Migrations is the module's schema.
var Migrations = postgres.EmbeddedMigrations("vps", "compute", migrationsFS)

// Events of the module; the subject is the instance.
const (
	EventInstanceCreated = "instance.created"
	EventInstanceDeleted = "instance.deleted"
	EventInstanceStatus  = "instance.status" // its host reported a new status
	// EventInstanceLost: its host could not reach its runtime for Options.LostAfter; the
	// instance ended and its reservation was released.
	EventInstanceLost = "instance.lost"
)

// Events of VM hosts; the subject is the node.
const (
	EventVMHostRuntimeDown = "vmhost.runtime_down" // the host's bcd cannot reach its VM runtime: no VM is placed on it
	EventVMHostRuntimeUp   = "vmhost.runtime_up"   // it reaches it again
)

// Options configure the module. Zero values mean the defaults.
type Options struct {
	// ReconcileEvery is how often the worker ends the instances whose reservation ended
	// (expired, preempted, drained); default 15 s.
	ReconcileEvery time.Duration
	// SandboxEvery is how often the sandbox worker ends expired sandboxes, pauses warm
	// instances that have run their warmup and refills warm pools; default 2 s.
	SandboxEvery time.Duration
	// Providers are the providers of provider pools; default hetzner and proxmox.
	Providers []provider.Provider
	// ProviderReconcileEvery is how often each provider account's servers are listed and
	// compared with its instances; default 1 min.
	ProviderReconcileEvery time.Duration
	// LostAfter is how long a VM host may fail to reach its runtime before the instances and
	// sandboxes on it are given up as lost; default LostAfterDefault.
	LostAfter time.Duration
	// WarmLostAfter is how long a warm VM may wait on a host that cannot reach its runtime, or
	// is offline, before it is replaced on another; default WarmLostAfterDefault.
	WarmLostAfter time.Duration
}

// Defaults of Options.
const (
	LostAfterDefault     = 5 * time.Minute
	WarmLostAfterDefault = 30 * time.Second
)

// Module is the vps module: vps.New(vps.Options{}) in compute.Options.Modules.
type Module struct {
	opts     Options
	capacity modules.Capacity // the runtime's, from Initialize: desired parts read reservations
	access   modules.Access   // the runtime's, from Initialize: a sandbox's part has its reservation's KRL

	providers map[string]provider.Provider // Options.Providers by name, which Register makes provision drivers (providers.go)
}

// New returns the module.
func New(opts Options) (*Module, error) {
	if opts.ReconcileEvery <= 0 {
		opts.ReconcileEvery = 15 * time.Second
	}
	if opts.SandboxEvery <= 0 {
		opts.SandboxEvery = 2 * time.Second
	}
	if opts.LostAfter <= 0 {
		opts.LostAfter = LostAfterDefault
	}
	if opts.WarmLostAfter <= 0 {
		opts.WarmLostAfter = WarmLostAfterDefault
	}
	m := &Module{opts: opts}
	if err := m.setUpProviders(); err != nil {
		return nil, err
	}
	return m, nil
}

// Name implements modules.Module.
func (*Module) Name() string { return "vps" }

// Register implements modules.Module.
func (m *Module) Register(r *modules.Registry) error {
	r.Migrations(Migrations)
	r.ResourceTypes(
		iam.ResourceType{Name: ResourceFlavor, Description: "A shape of VM instance: vCPUs, memory, disk and GPUs."},
		iam.ResourceType{Name: ResourceImage, Description: "What VM instances boot: a kernel and initramfs, or a disk image."},
		iam.ResourceType{Name: ResourceInstance, Description: "A VM instance, holding its capacity through a reservation."},
		iam.ResourceType{Name: ResourceSandboxTemplate, Description: "What sandboxes are made from, how long they live and how many wait warm."},
		iam.ResourceType{Name: ResourceSandbox, Description: "A short-lived VM made from a template."},
		iam.ResourceType{Name: ResourceSnapshot, Description: "A saved state of a sandbox, memory included."},
	)
	r.Actions(modules.ActionsFor(append(Methods(), SandboxMethods()...)...)...)
	r.EventTypes(
		modules.EventType{Name: EventInstanceCreated, Description: "An instance was created (data: name, flavor, node, reservation)."},
		modules.EventType{Name: EventInstanceDeleted, Description: "An instance was deleted, or ended with its reservation (data: reason)."},
		modules.EventType{Name: EventInstanceStatus, Description: "An instance's host reported a new status (data: status, detail)."},
		modules.EventType{Name: EventInstanceLost, Description: "An instance's host could not reach its VM runtime for the module's LostAfter: the instance ended, its reservation released (data: reason)."},
		modules.EventType{Name: EventVMHostRuntimeDown, Description: "A VM host's bcd cannot reach its VM runtime: no VM is placed on it until it can (data: runtime, detail)."},
		modules.EventType{Name: EventVMHostRuntimeUp, Description: "A VM host's bcd reaches its VM runtime again (data: runtime)."},
		modules.EventType{Name: EventSandboxCreated, Description: "A sandbox was created (data: name, template, node, fromWarmPool)."},
		modules.EventType{Name: EventSandboxDeleted, Description: "A sandbox was deleted (data: reason)."},
		modules.EventType{Name: EventSandboxExpired, Description: "A sandbox's time to live ran out and the worker deleted it."},
		modules.EventType{Name: EventSandboxStatus, Description: "A sandbox's host reported a new status (data: status, detail)."},
		modules.EventType{Name: EventSandboxLost, Description: "A sandbox's host could not reach its VM runtime for the module's LostAfter: the sandbox ended, its reservation released (data: reason)."},
	)
	r.OnInitialize(func(_ context.Context, rt *modules.Runtime) error {
		m.capacity = rt.Capacity
		m.access = rt.Access
		return nil
	})
	m.registerFlavors(r)
	m.registerImages(r)
	m.registerInstances(r)
	m.registerSandboxes(r)
	m.registerNetworks(r)
	m.registerProviders(r)
	r.DesiredKind(modules.DesiredKind{Name: hostapi.KindInstances, Version: hostapi.InstancesVersion, Optional: true, State: m.desiredInstances})
	r.ReportKind(
		modules.ReportKind{Name: hostapi.KindHost, Handle: hostReported},
		modules.ReportKind{Name: hostapi.KindStatus, Handle: statusReported},
	)
	r.Worker(modules.Worker{Name: "vps-instances", Modes: []string{"worker"}, Run: func(ctx context.Context, rt *modules.Runtime) error {
		return modules.Every(ctx, m.opts.ReconcileEvery, func() error {
			if err := endWithReservations(ctx, rt); err != nil {
				return err
			}
			return m.endLost(ctx, rt)
		})
	}})
	r.Worker(modules.Worker{Name: "vps-sandboxes", Modes: []string{"worker"}, Run: func(ctx context.Context, rt *modules.Runtime) error {
		return modules.Every(ctx, m.opts.SandboxEvery, func() error { return sandboxRound(ctx, rt) })
	}})
	return nil
}
