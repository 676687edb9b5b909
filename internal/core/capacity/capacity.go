// Package capacity is the heart of Better Compute: atoms, bookings guarded by one EXCLUDE
// constraint, reservations now and over a horizon (gangs, spot, MIG slices and time-slice
// shares), quotas, the rollups of what is free, and billing on reserved time.
package capacity

import (
	"context"
	"embed"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// Migrations is capacity's schema. It builds on the fleet's.
var Migrations = postgres.EmbeddedMigrations("capacity", "compute", migrationsFS)

// Module registers capacity's tables, groups and workers. It is part of the core.
type Module struct {
	// Tick is how often the lifecycle worker activates and ends reservations; zero is TickDefault.
	Tick time.Duration
	// BillingEvery is how often reserved time is handed to billing; zero is BillingEveryDefault.
	BillingEvery time.Duration
	// Leases is the control plane's pool-lease placer; nil (or off) places everything through
	// the database. Its worker runs in the api mode.
	Leases *Leases
}

// The defaults of Module's fields.
const (
	TickDefault         = time.Second
	BillingEveryDefault = time.Minute
)

// Name implements modules.Module.
func (Module) Name() string { return "capacity" }

// Register implements modules.Module.
func (m Module) Register(r *modules.Registry) error {
	if m.Tick == 0 {
		m.Tick = TickDefault
	}
	if m.BillingEvery == 0 {
		m.BillingEvery = BillingEveryDefault
	}
	r.Migrations(Migrations)
	r.ResourceTypes(
		iam.ResourceType{Name: api.ResourceReservation, Description: "A claim on capacity: bookings over a window."},
		iam.ResourceType{Name: api.ResourceQuota, Description: "A limit on what a tenant may hold in a pool."},
		iam.ResourceType{Name: api.ResourceDevice, Description: "A GPU of a node."},
	)
	r.Actions(modules.ActionsFor(api.CapacityMethods()...)...)
	r.Resolver(api.ResourceReservation, resolveReservation)
	r.EventTypes(eventTypes...)
	r.OnInitialize(func(ctx context.Context, rt *modules.Runtime) error { return ensureMeters(ctx, rt) })
	r.Worker(modules.Worker{Name: "reservation-lifecycle", Modes: []string{"worker"}, Run: func(ctx context.Context, rt *modules.Runtime) error {
		return modules.Every(ctx, m.Tick, func() error { _, err := Tick(ctx, rt.DB); return err })
	}})
	r.Worker(modules.Worker{Name: "billing", Modes: []string{"worker"}, Run: func(ctx context.Context, rt *modules.Runtime) error {
		return modules.Every(ctx, m.BillingEvery, func() error { _, err := Bill(ctx, rt.DB, rt.IAM); return err })
	}})

	reservationTarget := func(ctx context.Context, l modules.Lookup, id string) (modules.Target, error) {
		t := modules.Target{Existing: true, Kind: "reservation", Ref: id, ResourceID: id}
		err := l.Q.QueryRow(ctx, `SELECT tenant_id FROM compute.reservations WHERE id = $1`, id).Scan(&t.TenantID)
		if errors.Is(err, pgx.ErrNoRows) || postgres.ErrorCode(err) == "22P02" { // not there, or not an id
			return t, api.NotFound("reservation", id)
		}
		return t, err
	}

	batch := reserveBatch
	if m.Leases.On() {
		batch = m.Leases.reserveBatch
		r.Worker(modules.Worker{Name: "pool-lease", Modes: []string{"api"}, Run: m.Leases.run})
	}
	modules.HandleBatched(r, api.ReservationsCreate, nil, reserve, batchKey, batch)
	modules.Handle(r, api.ReservationsGet,
		func(ctx context.Context, l modules.Lookup, in api.GetReservation) (modules.Target, error) {
			return reservationTarget(ctx, l, in.Reservation)
		},
		func(ctx context.Context, c *modules.Call, in api.GetReservation) (api.Reservation, error) {
			return getReservation(ctx, c.Tx, in.Reservation, c.Target.TenantID)
		})
	modules.Handle(r, api.ReservationsList, nil, listReservations)
	modules.Handle(r, api.ReservationsCancel,
		func(ctx context.Context, l modules.Lookup, in api.CancelReservation) (modules.Target, error) {
			return reservationTarget(ctx, l, in.Reservation)
		},
		func(ctx context.Context, c *modules.Call, in api.CancelReservation) (api.Reservation, error) {
			if err := cancel(ctx, c.Tx, in.Reservation, c.Target.TenantID); err != nil {
				return api.Reservation{}, err
			}
			return getReservation(ctx, c.Tx, in.Reservation, c.Target.TenantID)
		})
	modules.Handle(r, api.ReservationsRelease,
		func(ctx context.Context, l modules.Lookup, in api.ReleaseReservation) (modules.Target, error) {
			return reservationTarget(ctx, l, in.Reservation)
		},
		func(ctx context.Context, c *modules.Call, in api.ReleaseReservation) (api.Reservation, error) {
			if err := release(ctx, c.Tx, in.Reservation, c.Target.TenantID); err != nil {
				return api.Reservation{}, err
			}
			return getReservation(ctx, c.Tx, in.Reservation, c.Target.TenantID)
		})
	modules.Handle(r, api.ReservationsExtend,
		func(ctx context.Context, l modules.Lookup, in api.ExtendReservation) (modules.Target, error) {
			return reservationTarget(ctx, l, in.Reservation)
		},
		func(ctx context.Context, c *modules.Call, in api.ExtendReservation) (api.Reservation, error) {
			if err := extend(ctx, c.Tx, in, c.Target.TenantID); err != nil {
				return api.Reservation{}, err
			}
			return getReservation(ctx, c.Tx, in.Reservation, c.Target.TenantID)
		})
	modules.Handle(r, api.ReservationsAvailability, poolTarget(func(in api.Availability) (string, string) { return in.TenantID, in.Pool }), availability)
	modules.Handle(r, api.CapacitySummary, poolTarget(func(in api.SummarizeCapacity) (string, string) { return in.TenantID, in.Pool }),
		func(ctx context.Context, c *modules.Call, in api.SummarizeCapacity) (api.PoolCapacity, error) {
			return Summary(ctx, c.Tx, c.Target.ResourceID)
		})
	modules.Handle(r, api.CapacitySearch, poolTarget(func(in api.SearchCapacity) (string, string) { return in.TenantID, in.Pool }), search)
	registerQuotas(r)
	registerDevices(r)
	registerMap(r)
	return nil
}

// poolTarget resolves the pool an input names (the tenant's own or an ancestor's) and decides in
// the caller's (or the input's) tenant, on the pool.
func poolTarget[In any](get func(In) (tenant, pool string)) modules.TargetFunc[In] {
	return func(ctx context.Context, l modules.Lookup, in In) (modules.Target, error) {
		tenant, ref := get(in)
		if tenant == "" {
			tenant = l.Principal.TenantID
		}
		pool, err := lookupPool(ctx, l, tenant, ref)
		if err != nil {
			return modules.Target{}, err
		}
		return modules.Target{TenantID: tenant, ResourceID: pool.ID, Existing: true, Kind: "pool", Ref: ref}, nil
	}
}
