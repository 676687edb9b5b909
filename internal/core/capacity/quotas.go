package capacity

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/modules"
)

const quotaColumns = `tenant_id, pool_id::text, resource, model, "limit", used`

func scanQuota(row pgx.Row) (api.Quota, error) {
	var q api.Quota
	err := row.Scan(&q.TenantID, &q.PoolID, &q.Resource, &q.Model, &q.Limit, &q.Used)
	return q, err
}

// quotaTarget decides a quota change in the tenant that owns the pool, not the tenant limited: a
// tenant does not raise its own quota. A limited tenant outside the caller's reads as the pool
// not found, as a tenant that does not exist does.
func quotaTarget(ctx context.Context, l modules.Lookup, limited, pool string) (modules.Target, error) {
	p, err := lookupPool(ctx, l, limited, pool)
	if err != nil {
		return modules.Target{}, err
	}
	return modules.Target{TenantID: p.TenantID, ResourceID: p.ID, Existing: true, Kind: "pool", Ref: pool}, nil
}

func registerQuotas(r *modules.Registry) {
	modules.Handle(r, api.QuotasSet,
		func(ctx context.Context, l modules.Lookup, in api.SetQuota) (modules.Target, error) {
			return quotaTarget(ctx, l, in.TenantID, in.Pool)
		},
		func(ctx context.Context, c *modules.Call, in api.SetQuota) (api.Quota, error) {
			// What the tenant holds already counts from the start.
			var used int
			err := c.Tx.QueryRow(ctx, `SELECT coalesce(sum(CASE $3::text
				    WHEN 'gpus' THEN (SELECT coalesce(sum(value::int), 0) FROM jsonb_each_text(coalesce(claims->'gpus', '{}')) WHERE $4 = '' OR key = $4)
				    WHEN 'vcpus' THEN coalesce((claims->>'vcpus')::int, 0)
				    ELSE coalesce((claims->>'memoryGiB')::int, 0) END), 0)
				FROM compute.reservations WHERE tenant_id = $1 AND pool_id = $2 AND state IN ('pending', 'active')`,
				in.TenantID, c.Target.ResourceID, in.Resource, in.Model).Scan(&used)
			if err != nil {
				return api.Quota{}, err
			}
			return scanQuota(c.Tx.QueryRow(ctx, `INSERT INTO compute.quotas (tenant_id, pool_id, resource, model, "limit", used)
				VALUES ($1, $2, $3, $4, $5, $6)
				ON CONFLICT (tenant_id, pool_id, resource, model) DO UPDATE SET "limit" = excluded."limit", used = excluded.used, updated_at = compute.compute_now()
				RETURNING `+quotaColumns, in.TenantID, c.Target.ResourceID, in.Resource, in.Model, in.Limit, used))
		})

	modules.Handle(r, api.QuotasList, nil, func(ctx context.Context, c *modules.Call, in api.ListQuotas) (api.Page[api.Quota], error) {
		after := ""
		if in.Cursor != "" {
			k, err := api.DecodeCursor("q1", in.Cursor)
			if err != nil {
				return api.Page[api.Quota]{}, err
			}
			after = k
		}
		limit := in.PageLimit()
		rows, err := c.Tx.Query(ctx, `SELECT `+quotaColumns+` FROM compute.quotas
			WHERE tenant_id = $1 AND (pool_id::text || '/' || resource || '/' || model) > $2
			ORDER BY pool_id::text || '/' || resource || '/' || model LIMIT $3`, c.Target.TenantID, after, limit+1)
		if err != nil {
			return api.Page[api.Quota]{}, err
		}
		items, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (api.Quota, error) { return scanQuota(row) })
		if err != nil {
			return api.Page[api.Quota]{}, err
		}
		out := api.Page[api.Quota]{Items: items}
		if out.Items == nil {
			out.Items = []api.Quota{}
		}
		if len(items) > limit {
			out.Items = items[:limit]
			last := out.Items[limit-1]
			out.NextCursor = api.EncodeCursor("q1", last.PoolID+"/"+last.Resource+"/"+last.Model)
		}
		return out, nil
	})

	modules.Handle(r, api.QuotasDelete,
		func(ctx context.Context, l modules.Lookup, in api.DeleteQuota) (modules.Target, error) {
			return quotaTarget(ctx, l, in.TenantID, in.Pool)
		},
		func(ctx context.Context, c *modules.Call, in api.DeleteQuota) (api.Quota, error) {
			q, err := scanQuota(c.Tx.QueryRow(ctx, `DELETE FROM compute.quotas WHERE tenant_id = $1 AND pool_id = $2 AND resource = $3 AND model = $4
				RETURNING `+quotaColumns, in.TenantID, c.Target.ResourceID, in.Resource, in.Model))
			if errors.Is(err, pgx.ErrNoRows) {
				return q, api.NotFound("quota", fmt.Sprintf("%s/%s/%s", in.TenantID, in.Resource, in.Model))
			}
			return q, err
		})
}
