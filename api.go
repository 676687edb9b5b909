package compute

import (
	"context"

	"github.com/better-compute/compute/api"
)

// API is the typed in-process API. Each group has one call per method of the method table
// (package api); a test checks that the two match.
type API struct {
	Sites SitesAPI
	Pools PoolsAPI
	Nodes NodesAPI
}

func newAPI(c *Compute) *API {
	return &API{Sites: SitesAPI{c}, Pools: PoolsAPI{c}, Nodes: NodesAPI{c}}
}

// SitesAPI is the sites group.
type SitesAPI struct{ c *Compute }

// Create calls sites.create.
func (g SitesAPI) Create(ctx context.Context, cred string, in api.CreateSite) (api.Site, error) {
	return Invoke(ctx, g.c, cred, api.SitesCreate, in)
}

// Get calls sites.get.
func (g SitesAPI) Get(ctx context.Context, cred string, in api.GetSite) (api.Site, error) {
	return Invoke(ctx, g.c, cred, api.SitesGet, in)
}

// List calls sites.list.
func (g SitesAPI) List(ctx context.Context, cred string, in api.ListSites) (api.Page[api.Site], error) {
	return Invoke(ctx, g.c, cred, api.SitesList, in)
}

// Update calls sites.update.
func (g SitesAPI) Update(ctx context.Context, cred string, in api.UpdateSite) (api.Site, error) {
	return Invoke(ctx, g.c, cred, api.SitesUpdate, in)
}

// Delete calls sites.delete.
func (g SitesAPI) Delete(ctx context.Context, cred string, in api.DeleteSite) (api.Site, error) {
	return Invoke(ctx, g.c, cred, api.SitesDelete, in)
}

// PoolsAPI is the pools group.
type PoolsAPI struct{ c *Compute }

// Create calls pools.create.
func (g PoolsAPI) Create(ctx context.Context, cred string, in api.CreatePool) (api.Pool, error) {
	return Invoke(ctx, g.c, cred, api.PoolsCreate, in)
}

// Get calls pools.get.
func (g PoolsAPI) Get(ctx context.Context, cred string, in api.GetPool) (api.Pool, error) {
	return Invoke(ctx, g.c, cred, api.PoolsGet, in)
}

// List calls pools.list.
func (g PoolsAPI) List(ctx context.Context, cred string, in api.ListPools) (api.Page[api.Pool], error) {
	return Invoke(ctx, g.c, cred, api.PoolsList, in)
}

// Update calls pools.update.
func (g PoolsAPI) Update(ctx context.Context, cred string, in api.UpdatePool) (api.Pool, error) {
	return Invoke(ctx, g.c, cred, api.PoolsUpdate, in)
}

// Delete calls pools.delete.
func (g PoolsAPI) Delete(ctx context.Context, cred string, in api.DeletePool) (api.Pool, error) {
	return Invoke(ctx, g.c, cred, api.PoolsDelete, in)
}

// NodesAPI is the nodes group.
type NodesAPI struct{ c *Compute }

// Get calls nodes.get.
func (g NodesAPI) Get(ctx context.Context, cred string, in api.GetNode) (api.Node, error) {
	return Invoke(ctx, g.c, cred, api.NodesGet, in)
}

// List calls nodes.list.
func (g NodesAPI) List(ctx context.Context, cred string, in api.ListNodes) (api.Page[api.Node], error) {
	return Invoke(ctx, g.c, cred, api.NodesList, in)
}
