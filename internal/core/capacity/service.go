package capacity

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// Service is capacity's part of modules.Runtime: booking for another module's call, in that
// call's transaction, under the decision its own method made.
type Service struct {
	// Leases is the control plane's pool-lease placer (nil when off), for its tests and
	// benchmarks to watch.
	Leases *Leases
}

// Reserve implements modules.Capacity: in is checked as reservations.create's input would be.
func (Service) Reserve(ctx context.Context, c *modules.Call, in api.CreateReservation, avoid ...string) (api.Reservation, error) {
	if err := api.CheckInput(in); err != nil {
		return api.Reservation{}, err
	}
	if err := in.Validate(); err != nil {
		return api.Reservation{}, err
	}
	for _, id := range avoid {
		if !fleet.IsID(id) {
			return api.Reservation{}, fmt.Errorf("capacity: a node to avoid, %q, is no node id", id)
		}
	}
	return reserveAvoiding(ctx, c, in, avoid)
}

// Release implements modules.Capacity: an active reservation is released, a pending one
// cancelled; one already ended is left as it is. A reservation the worker activates between the
// read of its state and the change is read again once.
func (Service) Release(ctx context.Context, c *modules.Call, id string) error {
	if !fleet.IsID(id) {
		return api.NotFound("reservation", id) // as reservations.get answers
	}
	for attempt := 0; ; attempt++ {
		var state string
		err := c.Tx.QueryRow(ctx, `SELECT state FROM compute.reservations WHERE id = $1 AND tenant_id = $2`, id, c.Target.TenantID).Scan(&state)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return api.NotFound("reservation", id)
		case err != nil:
			return err
		case state == api.ReservationActive:
			err = release(ctx, c.Tx, id, c.Target.TenantID)
		case state == api.ReservationPending:
			err = cancel(ctx, c.Tx, id, c.Target.TenantID)
		}
		if api.CodeOf(err) != api.CodeFailedPrecondition || attempt == 1 {
			return err
		}
	}
}

// Reservations implements modules.Capacity.
func (Service) Reservations(ctx context.Context, q postgres.Querier, ids []string) ([]api.Reservation, error) {
	ids = slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return !fleet.IsID(id) })
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := q.Query(ctx, `SELECT `+reservationColumns+` FROM compute.reservations WHERE id = ANY($1::uuid[])`, ids)
	if err != nil {
		return nil, err
	}
	rs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (api.Reservation, error) { return scanReservation(r) })
	if err != nil {
		return nil, err
	}
	shapes := make(map[string]api.Shape, len(rs))
	for _, r := range rs {
		shapes[r.ID] = r.Shape
	}
	allocs, err := loadAllocations(ctx, q, shapes)
	for i := range rs {
		rs[i].Allocations = allocs[rs[i].ID]
	}
	return rs, err
}
