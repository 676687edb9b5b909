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
	(SELECT count(*) FROM compute.nodes n WHERE n.pool_id = p.id), p.tpm_attestation, p.tpm_ek_roots, p.created_at, p.updated_at`

func scanPool(row pgx.Row) (api.Pool, error) {
	var p api.Pool
	err := row.Scan(&p.ID, &p.TenantID, &p.SiteID, &p.Name, &p.DisplayName, &p.Description, &p.Labels, &p.NodeCount,
		&p.Attestation.TPM, &p.Attestation.EKRoots, &p.CreatedAt, &p.UpdatedAt)
	return p, err
}

// PoolAttestation reads a pool's attestation policy, as a join into it applies it.
func PoolAttestation(ctx context.Context, q postgres.Querier, poolID string) (api.PoolAttestation, error) {
	var a api.PoolAttestation
	err := q.QueryRow(ctx, `SELECT tpm_attestation, tpm_ek_roots FROM compute.pools WHERE id = $1`, poolID).Scan(&a.TPM, &a.EKRoots)
	if errors.Is(err, pgx.ErrNoRows) {
		return a, api.NotFound("pool", poolID)
	}
	return a, err
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
		att := api.PoolAttestation{}.WithDefaults()
		if in.Attestation != nil {
			att = in.Attestation.WithDefaults()
		}
		_, err := c.Tx.Exec(ctx, `INSERT INTO compute.pools (id, tenant_id, site_id, name, display_name, description, labels, tpm_attestation, tpm_ek_roots)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
			id, c.Target.TenantID, siteID, in.Name, in.DisplayName, in.Description, labelsOrEmpty(in.Labels), att.TPM, att.EKRoots)
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
			var tpm *string
			var roots []string
			if in.Attestation != nil {
				att := in.Attestation.WithDefaults()
				tpm, roots = &att.TPM, att.EKRoots
			}
			tag, err := c.Tx.Exec(ctx, `UPDATE compute.pools SET
				display_name = coalesce($3, display_name), description = coalesce($4, description),
				labels = coalesce($5, labels), tpm_attestation = coalesce($6, tpm_attestation),
				tpm_ek_roots = CASE WHEN $6::text IS NULL THEN tpm_ek_roots ELSE $7 END, updated_at = compute.compute_now()
				WHERE id = $1 AND tenant_id = $2`,
				c.Target.ResourceID, c.Target.TenantID, in.DisplayName, in.Description, in.Labels, tpm, roots)
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
