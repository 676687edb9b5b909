package capacity

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/internal/core/metrics"
	"github.com/better-compute/compute/postgres"
)

// GPUStats counts the whole GPUs of schedulable nodes by pool and model in one query over the
// rollups, as Summary does for one pool, for the metrics scraped from every process.
func GPUStats(ctx context.Context, q postgres.Querier) ([]metrics.PoolGPUs, error) {
	rows, err := q.Query(ctx, `SELECT p.tenant_id, p.name::text, nc.gpu_model, sum(nc.gpus_total)::int, sum(nc.gpus_free)::int,
		  sum(nc.gpus_total - nc.gpus_free - nc.gpus_spot)::int, sum(nc.gpus_spot)::int
		FROM compute.node_capacity nc JOIN compute.pools p ON p.id = nc.pool_id
		WHERE nc.schedulable AND nc.gpus_total > 0
		GROUP BY p.tenant_id, p.name, nc.gpu_model ORDER BY 1, 2, 3`)
	if err != nil {
		return nil, err
	}
	var g metrics.PoolGPUs
	var out []metrics.PoolGPUs
	_, err = pgx.ForEachRow(rows, []any{&g.Tenant, &g.Pool, &g.Model, &g.Total, &g.Free, &g.Used, &g.Spot}, func() error {
		out = append(out, g)
		return nil
	})
	return out, err
}

// ReservationStats counts the live (pending and active) reservations by pool and state, by the
// index of live reservations: ended ones are history, which only grows.
func ReservationStats(ctx context.Context, q postgres.Querier) ([]metrics.Reservations, error) {
	rows, err := q.Query(ctx, `SELECT p.tenant_id, p.name::text, r.state, count(*)::int
		FROM compute.reservations r JOIN compute.pools p ON p.id = r.pool_id
		WHERE r.state IN ('pending', 'active')
		GROUP BY p.tenant_id, p.name, r.state ORDER BY 1, 2, 3`)
	if err != nil {
		return nil, err
	}
	var r metrics.Reservations
	var out []metrics.Reservations
	_, err = pgx.ForEachRow(rows, []any{&r.Tenant, &r.Pool, &r.State, &r.Count}, func() error {
		out = append(out, r)
		return nil
	})
	return out, err
}
