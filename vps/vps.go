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
)

// Options configure the module. Zero values mean the defaults.
type Options struct {
	// ReconcileEvery is how often the worker ends the instances whose reservation ended
	// (expired, preempted, drained); default 15 s.
	ReconcileEvery time.Duration
}

// Module is the vps module: vps.New(vps.Options{}) in compute.Options.Modules.
type Module struct {
	opts     Options
	capacity modules.Capacity // the runtime's, from Initialize: desired parts read reservations
}

// New returns the module.
func New(opts Options) (*Module, error) {
	if opts.ReconcileEvery <= 0 {
		opts.ReconcileEvery = 15 * time.Second
	}
	return &Module{opts: opts}, nil
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
	)
	r.Actions(modules.ActionsFor(Methods()...)...)
	r.EventTypes(
		modules.EventType{Name: EventInstanceCreated, Description: "An instance was created (data: name, flavor, node, reservation)."},
		modules.EventType{Name: EventInstanceDeleted, Description: "An instance was deleted, or ended with its reservation (data: reason)."},
		modules.EventType{Name: EventInstanceStatus, Description: "An instance's host reported a new status (data: status, detail)."},
	)
	r.OnInitialize(func(_ context.Context, rt *modules.Runtime) error {
		m.capacity = rt.Capacity
		return nil
	})
	m.registerFlavors(r)
	m.registerImages(r)
	m.registerInstances(r)
	r.DesiredKind(modules.DesiredKind{Name: hostapi.KindInstances, Version: hostapi.InstancesVersion, Optional: true, State: m.desiredInstances})
	r.ReportKind(
		modules.ReportKind{Name: hostapi.KindHost, Handle: hostReported},
		modules.ReportKind{Name: hostapi.KindStatus, Handle: statusReported},
	)
	r.Worker(modules.Worker{Name: "vps-instances", Modes: []string{"worker"}, Run: func(ctx context.Context, rt *modules.Runtime) error {
		return modules.Every(ctx, m.opts.ReconcileEvery, func() error { return endWithReservations(ctx, rt) })
	}})
	return nil
}
