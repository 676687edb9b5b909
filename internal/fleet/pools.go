package fleet

import (
	"context"
	"errors"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

const poolColumns = `p.id::text, p.tenant_id, coalesce(p.site_id::text, ''), p.name, p.display_name, p.description, p.labels,
	(SELECT count(*) FROM compute.nodes n WHERE n.pool_id = p.id), p.created_at, p.updated_at`

func scanPool(row pgx.Row) (api.Pool, error) {
	var p api.Pool
	err := row.Scan(&p.ID, &p.TenantID, &p.SiteID, &p.Name, &p.DisplayName, &p.Description, &p.Labels, &p.NodeCount, &p.CreatedAt, &p.UpdatedAt)
	return p, err
}

func poolTarget[In any](get func(In) (tenant, pool string)) modules.TargetFunc[In] {
	return func(ctx context.Context, l modules.Lookup, in In) (modules.Target, error) {
		tenant, pool := get(in)
		return poolRef.inTenant(ctx, l.Q, l.Principal, tenant, pool)
	}
}

func registerPools(r *modules.Registry) {
	modules.Handle(r, api.PoolsCreate, nil, func(ctx context.Context, c *modules.Call, in api.CreatePool) (api.Pool, error) {
		var siteID *string
		if in.Site != "" {
			id, err := siteRef.idIn(ctx, c.Tx, c.Target.TenantID, in.Site)
			if err != nil {
				return api.Pool{}, err
			}
			siteID = &id
		}
		id := NewID()
		_, err := c.Tx.Exec(ctx, `INSERT INTO compute.pools (id, tenant_id, site_id, name, display_name, description, labels)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`,
			id, c.Target.TenantID, siteID, in.Name, in.DisplayName, in.Description, labelsOrEmpty(in.Labels))
		if postgres.ErrorCode(err) == postgres.UniqueViolation {
			return api.Pool{}, conflictName("pool", in.Name, c.Target.TenantID)
		}
		if err != nil {
			return api.Pool{}, err
		}
		return scanPool(c.Tx.QueryRow(ctx, `SELECT `+poolColumns+` FROM compute.pools p WHERE p.id = $1`, id))
	})

	modules.Handle(r, api.PoolsGet, poolTarget(func(in api.GetPool) (string, string) { return in.TenantID, in.Pool }),
		func(ctx context.Context, c *modules.Call, in api.GetPool) (api.Pool, error) {
			p, err := scanPool(c.Tx.QueryRow(ctx, `SELECT `+poolColumns+` FROM compute.pools p WHERE p.id = $1 AND p.tenant_id = $2`,
				c.Target.ResourceID, c.Target.TenantID))
			if errors.Is(err, pgx.ErrNoRows) {
				return p, api.NotFound("pool", in.Pool)
			}
			return p, err
		})

	modules.Handle(r, api.PoolsList, nil, func(ctx context.Context, c *modules.Call, in api.ListPools) (api.Page[api.Pool], error) {
		var siteID *string
		if in.Site != "" {
			id, err := siteRef.idIn(ctx, c.Tx, c.Target.TenantID, in.Site)
			if err != nil {
				return api.Page[api.Pool]{}, err
			}
			siteID = &id
		}
		return page(ctx, c.Tx, in.PageRequest, scanPool, func(p api.Pool) string { return p.ID },
			`SELECT `+poolColumns+` FROM compute.pools p
			 WHERE p.tenant_id = $3 AND ($4::uuid IS NULL OR p.site_id = $4) AND ($1::uuid IS NULL OR p.id > $1)
			 ORDER BY p.id LIMIT $2`, c.Target.TenantID, siteID)
	})

	modules.Handle(r, api.PoolsUpdate, poolTarget(func(in api.UpdatePool) (string, string) { return in.TenantID, in.Pool }),
		func(ctx context.Context, c *modules.Call, in api.UpdatePool) (api.Pool, error) {
			tag, err := c.Tx.Exec(ctx, `UPDATE compute.pools SET
				display_name = coalesce($3, display_name), description = coalesce($4, description),
				labels = coalesce($5, labels), updated_at = compute.compute_now()
				WHERE id = $1 AND tenant_id = $2`,
				c.Target.ResourceID, c.Target.TenantID, in.DisplayName, in.Description, in.Labels)
			if err != nil {
				return api.Pool{}, err
			}
			if tag.RowsAffected() == 0 {
				return api.Pool{}, api.NotFound("pool", in.Pool)
			}
			return scanPool(c.Tx.QueryRow(ctx, `SELECT `+poolColumns+` FROM compute.pools p WHERE p.id = $1`, c.Target.ResourceID))
		})

	modules.Handle(r, api.PoolsDelete, poolTarget(func(in api.DeletePool) (string, string) { return in.TenantID, in.Pool }),
		func(ctx context.Context, c *modules.Call, in api.DeletePool) (api.Pool, error) {
			// The row lock orders this delete against a node joining the pool: the join's foreign
			// key check waits for it, and the constraint refuses whichever loses.
			p, err := scanPool(c.Tx.QueryRow(ctx, `SELECT `+poolColumns+` FROM compute.pools p WHERE p.id = $1 AND p.tenant_id = $2 FOR UPDATE`,
				c.Target.ResourceID, c.Target.TenantID))
			if errors.Is(err, pgx.ErrNoRows) {
				return p, api.NotFound("pool", in.Pool)
			}
			if err != nil {
				return p, err
			}
			if p.NodeCount > 0 {
				return p, &api.Error{Code: api.CodeFailedPrecondition,
					Message: "pool " + p.Name + " still has " + plural(p.NodeCount, "node") + "; retire and remove them first",
					Details: map[string]any{"reason": "pool_has_nodes", "nodes": p.NodeCount}}
			}
			_, err = c.Tx.Exec(ctx, `DELETE FROM compute.pools WHERE id = $1`, p.ID)
			return p, err
		})
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}
