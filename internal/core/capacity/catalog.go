package capacity

import (
	"context"

	"github.com/google/uuid"

	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// resolveReservation tells IAM a reservation's attributes: resource.pool, resource.state and
// resource.spot besides name (its id), tenantId and labels.
func resolveReservation(ctx context.Context, q postgres.Querier, id string) (map[string]any, error) {
	if uuid.Validate(id) != nil {
		return nil, nil
	}
	return modules.ResolveRow(q.QueryRow(ctx, `SELECT r.id::text, r.tenant_id, r.labels, jsonb_build_object('pool', p.name::text, 'state', r.state, 'spot', r.spot)
		FROM compute.reservations r JOIN compute.pools p ON p.id = r.pool_id WHERE r.id = $1`, id))
}

// eventTypes are the events capacity writes: one per change of a reservation's state.
var eventTypes = []modules.EventType{
	{Name: "reservation.created", Description: "A reservation was booked (data: pool, state, spot)."},
	{Name: "reservation.activated", Description: "A pending reservation's window started."},
	{Name: "reservation.released", Description: "Its holder ended an active reservation."},
	{Name: "reservation.cancelled", Description: "A pending reservation was cancelled."},
	{Name: "reservation.expired", Description: "A reservation's window closed."},
	{Name: "reservation.preempted", Description: "A spot reservation was displaced (data: at, by)."},
	{Name: "reservation.extended", Description: "A reservation's end moved later (data: from, to)."},
	{Name: "quota.exceeded", Description: "A call was refused over a quota; its subject is the tenant (data: method, principal, resource, model, limit, used, requested)."},
}
