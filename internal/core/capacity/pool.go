package capacity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// poolRef is a pool as capacity sees it: one of the tenant's own, or one of an ancestor's (a
// platform's pool shared down the tenant tree).
type poolRef struct {
	ID       string
	TenantID string
	Name     string
	Now      time.Time // compute_now(), read with it to save a round trip
}

// lookupPool resolves a pool before the call's transaction (in a target function), asking IAM
// for the tenant path.
func lookupPool(ctx context.Context, l modules.Lookup, tenant, ref string) (poolRef, error) {
	path, err := l.IAM.TenantPath(ctx, tenant)
	if err != nil {
		return poolRef{}, fmt.Errorf("capacity: tenant path: %w", err)
	}
	if !slices.Contains(path, l.Principal.TenantID) {
		// A tenant outside the caller's own and its descendants (or no tenant at all) reads as
		// "pool not found", in the very words a pool that does not exist gets, so that a caller
		// cannot learn whether another tenant has a pool.
		return poolRef{}, api.NotFound("pool", ref)
	}
	return resolvePool(ctx, l.Q, path, ref)
}

// resolvePool finds ref (an id or a name) among the pools of the tenants of path (a tenant and
// its ancestors, nearest first), the nearest tenant's first. It does not call IAM, so it may run
// inside a transaction.
func resolvePool(ctx context.Context, q postgres.Querier, path []string, ref string) (poolRef, error) {
	var p poolRef
	sql, args := resolvePoolSQL(path, ref)
	err := q.QueryRow(ctx, sql, args...).Scan(&p.ID, &p.TenantID, &p.Name, &p.Now)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, api.NotFound("pool", ref)
	}
	return p, err
}

// resolvePoolSQL is resolvePool's query.
func resolvePoolSQL(path []string, ref string) (string, []any) {
	if fleet.IsID(ref) {
		return `SELECT id::text, tenant_id, name, compute.compute_now() FROM compute.pools WHERE id = $1 AND tenant_id = ANY($2)`, []any{ref, path}
	}
	return `SELECT id::text, tenant_id, name, compute.compute_now() FROM compute.pools WHERE name = $1 AND tenant_id = ANY($2)
			ORDER BY array_position($2, tenant_id) LIMIT 1`, []any{ref, path}
}

// queueResolvePool queues resolvePool in b: the pool into out, or not_found into errOut.
func queueResolvePool(b *pgx.Batch, path []string, ref string, out *poolRef, errOut *error) {
	sql, args := resolvePoolSQL(path, ref)
	b.Queue(sql, args...).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&out.ID, &out.TenantID, &out.Name, &out.Now)
		if errors.Is(err, pgx.ErrNoRows) {
			*errOut = api.NotFound("pool", ref)
			return nil
		}
		return err
	})
}
