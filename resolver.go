package compute

import (
	"context"
	"fmt"

	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// resolver tells IAM what Better Compute's resources are, so that policy conditions can use
// them (resource.name, resource.tenantId, resource.labels.<key>, and per type resource.site,
// resource.pool, resource.state, …): each type's owner registered how (Registry.Resolver). A
// resource that does not exist (yet), or of a type nobody resolves, has no attributes;
// conditions on them then do not hold.
type resolver struct {
	db  *postgres.DB
	reg *modules.Registry
}

// ResolveResource implements iam.Resolver.
func (r resolver) ResolveResource(ctx context.Context, res iam.Resource) (map[string]any, error) {
	fn, ok := r.reg.LookupResolver(res.Type)
	if !ok {
		return nil, nil
	}
	attrs, err := fn(ctx, r.db.Pool, res.ID)
	if err != nil {
		return nil, fmt.Errorf("compute: resolve %s: %w", res, err)
	}
	return attrs, nil
}
