package api

// The core method table: the groups of the foundation. Modules declare their own methods with
// NewMethod and register them; Methods lists only these.
var (
	SitesCreate = NewMethod[CreateSite, Site]("sites", "create", true, ResourceSite, "v0.1", "Create a site.")
	SitesGet    = NewMethod[GetSite, Site]("sites", "get", false, ResourceSite, "v0.1", "Get a site by id or name.")
	SitesList   = NewMethod[ListSites, Page[Site]]("sites", "list", false, ResourceSite, "v0.1", "List the sites of a tenant.")
	SitesUpdate = NewMethod[UpdateSite, Site]("sites", "update", true, ResourceSite, "v0.1", "Change a site's display name or labels.")
	SitesDelete = NewMethod[DeleteSite, Site]("sites", "delete", true, ResourceSite, "v0.1", "Delete a site that has no pools.")

	PoolsCreate = NewMethod[CreatePool, Pool]("pools", "create", true, ResourcePool, "v0.1", "Create a pool.")
	PoolsGet    = NewMethod[GetPool, Pool]("pools", "get", false, ResourcePool, "v0.1", "Get a pool by id or name.")
	PoolsList   = NewMethod[ListPools, Page[Pool]]("pools", "list", false, ResourcePool, "v0.1", "List the pools of a tenant.")
	PoolsUpdate = NewMethod[UpdatePool, Pool]("pools", "update", true, ResourcePool, "v0.1", "Change a pool's display name, description or labels.")
	PoolsDelete = NewMethod[DeletePool, Pool]("pools", "delete", true, ResourcePool, "v0.1", "Delete a pool that has no nodes.")

	NodesGet  = NewMethod[GetNode, Node]("nodes", "get", false, ResourceNode, "v0.1", "Get a node.")
	NodesList = NewMethod[ListNodes, Page[Node]]("nodes", "list", false, ResourceNode, "v0.1", "List nodes, by pool and state.")
)

// Methods returns the core method table.
func Methods() []MethodInfo {
	return []MethodInfo{
		SitesCreate.Info(), SitesGet.Info(), SitesList.Info(), SitesUpdate.Info(), SitesDelete.Info(),
		PoolsCreate.Info(), PoolsGet.Info(), PoolsList.Info(), PoolsUpdate.Info(), PoolsDelete.Info(),
		NodesGet.Info(), NodesList.Info(),
	}
}
