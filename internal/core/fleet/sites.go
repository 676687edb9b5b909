package fleet

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

const siteColumns = `id::text, tenant_id, name, display_name, labels, created_at, updated_at`

func scanSite(row pgx.Row) (api.Site, error) {
	var s api.Site
	err := row.Scan(&s.ID, &s.TenantID, &s.Name, &s.DisplayName, &s.Labels, &s.CreatedAt, &s.UpdatedAt)
	return s, err
}

func siteTarget[In any](get func(In) (tenant, site string)) modules.TargetFunc[In] {
	return func(ctx context.Context, l modules.Lookup, in In) (modules.Target, error) {
		tenant, site := get(in)
		return siteRef.inTenant(ctx, l.Q, l.Principal, tenant, site)
	}
}

func registerSites(r *modules.Registry) {
	modules.Handle(r, api.SitesCreate, nil, func(ctx context.Context, c *modules.Call, in api.CreateSite) (api.Site, error) {
		s, err := scanSite(c.Tx.QueryRow(ctx, `INSERT INTO compute.sites (id, tenant_id, name, display_name, labels)
			VALUES ($1, $2, $3, $4, $5) RETURNING `+siteColumns,
			NewID(), c.Target.TenantID, in.Name, in.DisplayName, labelsOrEmpty(in.Labels)))
		if postgres.ErrorCode(err) == postgres.UniqueViolation {
			return s, conflictName("site", in.Name, c.Target.TenantID)
		}
		return s, err
	})

	modules.Handle(r, api.SitesGet, siteTarget(func(in api.GetSite) (string, string) { return in.TenantID, in.Site }),
		func(ctx context.Context, c *modules.Call, in api.GetSite) (api.Site, error) {
			return getSite(ctx, c, in.Site)
		})

	modules.Handle(r, api.SitesList, nil, func(ctx context.Context, c *modules.Call, in api.ListSites) (api.Page[api.Site], error) {
		return page(ctx, c.Tx, in.PageRequest, scanSite, func(s api.Site) string { return s.ID },
			`SELECT `+siteColumns+` FROM compute.sites
			 WHERE tenant_id = $3 AND ($1::uuid IS NULL OR id > $1) ORDER BY id LIMIT $2`, c.Target.TenantID)
	})

	modules.Handle(r, api.SitesUpdate, siteTarget(func(in api.UpdateSite) (string, string) { return in.TenantID, in.Site }),
		func(ctx context.Context, c *modules.Call, in api.UpdateSite) (api.Site, error) {
			s, err := scanSite(c.Tx.QueryRow(ctx, `UPDATE compute.sites SET
				display_name = coalesce($3, display_name), labels = coalesce($4, labels), updated_at = compute.compute_now()
				WHERE id = $1 AND tenant_id = $2 RETURNING `+siteColumns,
				c.Target.ResourceID, c.Target.TenantID, in.DisplayName, in.Labels))
			if errors.Is(err, pgx.ErrNoRows) {
				return s, api.NotFound("site", in.Site)
			}
			return s, err
		})

	modules.Handle(r, api.SitesDelete, siteTarget(func(in api.DeleteSite) (string, string) { return in.TenantID, in.Site }),
		func(ctx context.Context, c *modules.Call, in api.DeleteSite) (api.Site, error) {
			s, err := scanSite(c.Tx.QueryRow(ctx, `SELECT `+siteColumns+` FROM compute.sites WHERE id = $1 AND tenant_id = $2 FOR UPDATE`,
				c.Target.ResourceID, c.Target.TenantID))
			if errors.Is(err, pgx.ErrNoRows) {
				return s, api.NotFound("site", in.Site)
			}
			if err != nil {
				return s, err
			}
			var pools int
			if err := c.Tx.QueryRow(ctx, `SELECT count(*) FROM compute.pools WHERE site_id = $1`, s.ID).Scan(&pools); err != nil {
				return s, err
			}
			if pools > 0 {
				return s, &api.Error{Code: api.CodeFailedPrecondition,
					Message: "site " + s.Name + " still has " + plural(pools, "pool") + "; delete or move them first",
					Details: map[string]any{"reason": "site_has_pools", "pools": pools}}
			}
			_, err = c.Tx.Exec(ctx, `DELETE FROM compute.sites WHERE id = $1`, s.ID)
			return s, err
		})
}

func getSite(ctx context.Context, c *modules.Call, ref string) (api.Site, error) {
	s, err := scanSite(c.Tx.QueryRow(ctx, `SELECT `+siteColumns+` FROM compute.sites WHERE id = $1 AND tenant_id = $2`,
		c.Target.ResourceID, c.Target.TenantID))
	if errors.Is(err, pgx.ErrNoRows) {
		return s, api.NotFound("site", ref)
	}
	return s, err
}
