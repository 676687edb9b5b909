package fleet

import (
	"context"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// registerResolvers tells IAM the attributes of sites, pools and nodes (resource.site,
// resource.pool, resource.state, resource.health besides name, tenantId and labels).
func registerResolvers(r *modules.Registry) {
	r.Resolver(api.ResourceSite, resolveWith(`SELECT s.name::text, s.tenant_id, s.labels, '{}'::jsonb FROM compute.sites s WHERE s.id = $1`))
	r.Resolver(api.ResourcePool, resolveWith(`SELECT p.name::text, p.tenant_id, p.labels, jsonb_build_object('site', coalesce(s.name::text, ''))
		FROM compute.pools p LEFT JOIN compute.sites s ON s.id = p.site_id WHERE p.id = $1`))
	r.Resolver(api.ResourceNode, resolveWith(`SELECT n.name, n.tenant_id, n.labels, jsonb_build_object('pool', p.name::text, 'state', n.state, 'health', n.health)
		FROM compute.nodes n JOIN compute.pools p ON p.id = n.pool_id WHERE n.id = $1`))
}

// resolveWith is a resolver over one query of (name, tenant, labels, other attributes) by id.
func resolveWith(q string) modules.ResolveFunc {
	return func(ctx context.Context, db postgres.Querier, id string) (map[string]any, error) {
		if !IsID(id) {
			return nil, nil
		}
		return modules.ResolveRow(db.QueryRow(ctx, q, id))
	}
}
