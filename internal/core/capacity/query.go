package capacity

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

const reservationColumns = `id::text, tenant_id, pool_id::text, state, spot, shape, members, starts_at, ends_at, ended_at,
	coalesce(end_reason, ''), coalesce(ended_by, ''), labels, created_by, created_at, updated_at`

func scanReservation(row pgx.Row) (api.Reservation, error) {
	var r api.Reservation
	err := row.Scan(&r.ID, &r.TenantID, &r.PoolID, &r.State, &r.Spot, &r.Shape, &r.Members, &r.StartsAt, &r.EndsAt, &r.EndedAt,
		&r.EndReason, &r.EndedBy, &r.Labels, &r.CreatedBy, &r.CreatedAt, &r.UpdatedAt)
	return r, err
}

func getReservation(ctx context.Context, q postgres.Querier, id, tenant string) (api.Reservation, error) {
	r, err := scanReservation(q.QueryRow(ctx, `SELECT `+reservationColumns+` FROM compute.reservations WHERE id = $1 AND tenant_id = $2`, id, tenant))
	if errors.Is(err, pgx.ErrNoRows) {
		return r, api.NotFound("reservation", id)
	}
	if err != nil {
		return r, err
	}
	allocs, err := loadAllocations(ctx, q, map[string]api.Shape{r.ID: r.Shape})
	r.Allocations = allocs[r.ID]
	if r.Allocations == nil {
		r.Allocations = []api.Allocation{}
	}
	return r, err
}

func listReservations(ctx context.Context, c *modules.Call, in api.ListReservations) (api.Page[api.Reservation], error) {
	var after *string
	if in.Cursor != "" {
		b, err := base64.RawURLEncoding.DecodeString(in.Cursor)
		id, ok := strings.CutPrefix(string(b), "r1:")
		if err != nil || !ok || !fleet.IsID(id) {
			return api.Page[api.Reservation]{}, api.InvalidField("cursor", "is not a cursor returned by this API")
		}
		after = &id
	}
	var poolID, state, node *string
	if in.Pool != "" {
		p, err := resolvePool(ctx, c.Tx, c.Target.TenantPath, in.Pool)
		if err != nil {
			return api.Page[api.Reservation]{}, err
		}
		poolID = &p.ID
	}
	if in.State != "" {
		state = &in.State
	}
	if in.Node != "" {
		node = &in.Node
	}
	limit := in.PageLimit()
	rows, err := c.Tx.Query(ctx, `SELECT `+reservationColumns+` FROM compute.reservations
		WHERE tenant_id = $1 AND ($2::uuid IS NULL OR pool_id = $2) AND ($3::text IS NULL OR state = $3) AND ($4::uuid IS NULL OR id > $4)
		  AND ($6::text IS NULL OR `+onNodeSQL+`)
		ORDER BY id LIMIT $5`, c.Target.TenantID, poolID, state, after, limit+1, node)
	if err != nil {
		return api.Page[api.Reservation]{}, err
	}
	items, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (api.Reservation, error) { return scanReservation(row) })
	if err != nil {
		return api.Page[api.Reservation]{}, err
	}
	out := api.Page[api.Reservation]{Items: items}
	if len(items) > limit {
		out.Items = items[:limit]
		out.NextCursor = base64.RawURLEncoding.EncodeToString([]byte("r1:" + out.Items[limit-1].ID))
	}
	shapes := map[string]api.Shape{}
	for _, r := range out.Items {
		shapes[r.ID] = r.Shape
	}
	allocs, err := loadAllocations(ctx, c.Tx, shapes)
	if err != nil {
		return out, err
	}
	for i := range out.Items {
		out.Items[i].Allocations = allocs[out.Items[i].ID]
		if out.Items[i].Allocations == nil {
			out.Items[i].Allocations = []api.Allocation{}
		}
	}
	if out.Items == nil {
		out.Items = []api.Reservation{}
	}
	return out, nil
}
