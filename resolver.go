package compute

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/internal/fleet"
	"github.com/better-compute/compute/postgres"
)

// resolver tells IAM what Better Compute's own resources are, so that policy conditions can use
// them: resource.name, resource.tenantId, resource.labels.<key>, and per type resource.site,
// resource.pool, resource.state, resource.spot. A resource that does not exist (yet) has no
// attributes; conditions on them then do not hold.
type resolver struct{ db *postgres.DB }

// resolveQueries read one resource by id as (name, tenant, labels, extra attributes).
var resolveQueries = map[string]string{
	api.ResourceSite: `SELECT s.name::text, s.tenant_id, s.labels, '{}'::jsonb FROM compute.sites s WHERE s.id = $1`,
	api.ResourcePool: `SELECT p.name::text, p.tenant_id, p.labels, jsonb_build_object('site', coalesce(s.name::text, ''))
		FROM compute.pools p LEFT JOIN compute.sites s ON s.id = p.site_id WHERE p.id = $1`,
	api.ResourceNode: `SELECT n.name, n.tenant_id, n.labels, jsonb_build_object('pool', p.name::text, 'state', n.state, 'health', n.health)
		FROM compute.nodes n JOIN compute.pools p ON p.id = n.pool_id WHERE n.id = $1`,
	api.ResourceReservation: `SELECT r.id::text, r.tenant_id, r.labels, jsonb_build_object('pool', p.name::text, 'state', r.state, 'spot', r.spot)
		FROM compute.reservations r JOIN compute.pools p ON p.id = r.pool_id WHERE r.id = $1`,
}

// ResolveResource implements iam.Resolver.
func (r resolver) ResolveResource(ctx context.Context, res iam.Resource) (map[string]any, error) {
	q, ok := resolveQueries[res.Type]
	if !ok || !fleet.IsID(res.ID) {
		return nil, nil
	}
	var name, tenant string
	var labels map[string]string
	var extra map[string]any
	err := r.db.Pool.QueryRow(ctx, q, res.ID).Scan(&name, &tenant, &labels, &extra)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("compute: resolve %s: %w", res, err)
	}
	attrs := map[string]any{"name": name, "tenantId": tenant}
	for k, v := range labels {
		attrs["labels."+k] = v
	}
	for k, v := range extra {
		attrs[k] = v
	}
	return attrs, nil
}
