package capacity

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/modules"
)

// mapCursorKind tags the cursors of devices.map.
const mapCursorKind = "m1"

// registerMap registers devices.map: the fleet map, read in three statements a page whatever
// its size (the nodes, their GPUs, the GPU bookings that hold now), never a statement per node.
func registerMap(r *modules.Registry) {
	modules.Handle(r, api.DevicesMap, nil, func(ctx context.Context, c *modules.Call, in api.MapDevices) (api.Page[api.MapNode], error) {
		var after, pool *string
		if in.Cursor != "" {
			id, err := api.DecodeCursor(mapCursorKind, in.Cursor)
			if err != nil || !fleet.IsID(id) {
				return api.Page[api.MapNode]{}, api.InvalidField("cursor", "is not a cursor returned by this API")
			}
			after = &id
		}
		if in.Pool != "" {
			p, err := resolvePool(ctx, c.Tx, []string{c.Target.TenantID}, in.Pool)
			if err != nil {
				return api.Page[api.MapNode]{}, err
			}
			pool = &p.ID
		}
		limit := in.MapLimit()
		nodes, err := mapNodes(ctx, c.Tx, c.Target.TenantID, pool, after, limit+1)
		if err != nil {
			return api.Page[api.MapNode]{}, err
		}
		page := api.PageOf(nodes, limit, mapCursorKind, func(n api.MapNode) string { return n.ID })
		return page, mapGPUs(ctx, c.Tx, page.Items)
	})
}

// mapNodes reads a page of a tenant's nodes that offer capacity (role node, not retired).
func mapNodes(ctx context.Context, tx pgx.Tx, tenant string, pool, after *string, limit int) ([]api.MapNode, error) {
	rows, err := tx.Query(ctx, `SELECT id::text, name, pool_id::text, state, status, health FROM compute.nodes
		WHERE tenant_id = $1 AND ($2::uuid IS NULL OR pool_id = $2) AND ($3::uuid IS NULL OR id > $3)
		  AND role = 'node' AND state <> 'retired'
		ORDER BY id LIMIT $4`, tenant, pool, after, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (api.MapNode, error) {
		n := api.MapNode{GPUs: []api.MapGPU{}}
		err := row.Scan(&n.ID, &n.Name, &n.PoolID, &n.State, &n.Status, &n.Health)
		return n, err
	})
}

// mapGPUs fills the GPUs of nodes and what holds each now.
func mapGPUs(ctx context.Context, tx pgx.Tx, nodes []api.MapNode) error {
	if len(nodes) == 0 {
		return nil
	}
	ids := make([]string, len(nodes))
	byID := make(map[string]*api.MapNode, len(nodes))
	for i := range nodes {
		ids[i] = nodes[i].ID
		byID[nodes[i].ID] = &nodes[i]
	}
	rows, err := tx.Query(ctx, `SELECT node_id::text, index, model, mode, health, shares FROM compute.devices
		WHERE node_id = ANY($1::uuid[]) ORDER BY node_id, index`, ids)
	if err != nil {
		return err
	}
	var node string
	var g api.MapGPU
	if _, err := pgx.ForEachRow(rows, []any{&node, &g.Index, &g.Model, &g.Mode, &g.Health, &g.Shares}, func() error {
		n := byID[node]
		n.GPUs = append(n.GPUs, g)
		return nil
	}); err != nil {
		return err
	}
	rows, err = tx.Query(ctx, `SELECT node_id::text, lower(atoms), upper(atoms), reservation_id::text, spot FROM compute.bookings
		WHERE node_id = ANY($1::uuid[]) AND resource = 'gpu' AND during @> compute.compute_now()
		ORDER BY node_id, lower(atoms)`, ids)
	if err != nil {
		return err
	}
	notSpot := map[*api.MapGPU]bool{}
	var lo, hi int
	var res string
	var spot bool
	_, err = pgx.ForEachRow(rows, []any{&node, &lo, &hi, &res, &spot}, func() error {
		n := byID[node]
		for i := range n.GPUs {
			g := &n.GPUs[i]
			s := GPUSpan(g.Index)
			from, to := max(lo, s.Lo), min(hi, s.Hi)
			if from >= to {
				continue
			}
			g.Held += to - from
			if len(g.Holders) == 0 || g.Holders[len(g.Holders)-1] != res {
				g.Holders = append(g.Holders, res)
			}
			if !spot {
				notSpot[g] = true
			}
			g.Spot = !notSpot[g]
		}
		return nil
	})
	return err
}
