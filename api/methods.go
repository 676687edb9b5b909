package api

import "slices"

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

// Methods returns the core method table: every method served without optional modules.
func Methods() []MethodInfo { return infos(Table()) }

// Table returns the core methods with their types, for code generators.
func Table() []Describer {
	return slices.Concat(fleetTable(), capacityTable(), joinTokenTable(), nodeTable(), eventTable(), webhookTable(), auditTable(), workflowTable(), accessTable(), fleetConfigTable(), quorumTable(), releaseTable(), rolloutTable())
}

// FleetMethods returns the fleet part of the method table.
func FleetMethods() []MethodInfo { return infos(fleetTable()) }

func fleetTable() []Describer {
	return []Describer{
		SitesCreate, SitesGet, SitesList, SitesUpdate, SitesDelete,
		PoolsCreate, PoolsGet, PoolsList, PoolsUpdate, PoolsDelete,
		NodesGet, NodesList,
	}
}

func infos(ds []Describer) []MethodInfo {
	out := make([]MethodInfo, len(ds))
	for i, d := range ds {
		out[i] = d.Info()
	}
	return out
}

// The capacity groups.
var (
	ReservationsCreate       = NewMethod[CreateReservation, Reservation]("reservations", "create", true, ResourceReservation, "v0.1", "Reserve capacity in a pool: now or in a future window, whole GPUs, a MIG slice, a time-slice share or vCPUs and memory; a gang of members; spot.")
	ReservationsGet          = NewMethod[GetReservation, Reservation]("reservations", "get", false, ResourceReservation, "v0.1", "Get a reservation and what it holds.")
	ReservationsList         = NewMethod[ListReservations, Page[Reservation]]("reservations", "list", false, ResourceReservation, "v0.1", "List a tenant's reservations.")
	ReservationsCancel       = NewMethod[CancelReservation, Reservation]("reservations", "cancel", true, ResourceReservation, "v0.1", "Cancel a reservation that has not started.")
	ReservationsRelease      = NewMethod[ReleaseReservation, Reservation]("reservations", "release", true, ResourceReservation, "v0.1", "End an active reservation now.")
	ReservationsExtend       = NewMethod[ExtendReservation, Reservation]("reservations", "extend", true, ResourceReservation, "v0.1", "Move a reservation's end later.")
	ReservationsAvailability = NewMethod[Availability, AvailabilityAnswer]("reservations", "availability", false, ResourceReservation, "v0.5", "Find the earliest window in which a shape is free.")

	CapacitySummary = NewMethod[SummarizeCapacity, PoolCapacity]("capacity", "summary", false, ResourcePool, "v0.1", "Free and used capacity of a pool now, by model.")
	CapacitySearch  = NewMethod[SearchCapacity, CapacityWindow]("capacity", "search", false, ResourcePool, "v0.5", "What is free in a pool for the whole of a window.")

	QuotasSet    = NewMethod[SetQuota, Quota]("quotas", "set", true, ResourceQuota, "v0.1", "Set a tenant's quota in a pool.")
	QuotasList   = NewMethod[ListQuotas, Page[Quota]]("quotas", "list", false, ResourceQuota, "v0.1", "List the quotas that limit a tenant.")
	QuotasDelete = NewMethod[DeleteQuota, Quota]("quotas", "delete", true, ResourceQuota, "v0.1", "Remove a quota.")

	DevicesList    = NewMethod[ListDevices, []Device]("devices", "list", false, ResourceDevice, "v0.1", "List a node's GPUs.")
	DevicesSetMode = NewMethod[SetGPUMode, Device]("devices", "setMode", true, ResourceDevice, "v0.5", "Switch a GPU between whole, MIG and time-slice mode while nothing holds it.")
	DevicesMap     = NewMethod[MapDevices, Page[MapNode]]("devices", "map", false, ResourceDevice, "v0.5", "The fleet map: a page of nodes with every GPU's mode, health and holders now.")
)

// CapacityMethods returns the capacity part of the method table.
func CapacityMethods() []MethodInfo { return infos(capacityTable()) }

func capacityTable() []Describer {
	return []Describer{
		ReservationsCreate, ReservationsGet, ReservationsList, ReservationsCancel,
		ReservationsRelease, ReservationsExtend, ReservationsAvailability,
		CapacitySummary, CapacitySearch,
		QuotasSet, QuotasList, QuotasDelete,
		DevicesList, DevicesSetMode, DevicesMap,
	}
}

// The node groups: joining, lifecycle and commands.
var (
	JoinTokensCreate = NewMethod[CreateJoinToken, JoinToken]("joinTokens", "create", true, ResourceJoinToken, "v0.1", "Make a token that admits machines into a pool, shown once.")
	JoinTokensList   = NewMethod[ListJoinTokens, Page[JoinToken]]("joinTokens", "list", false, ResourceJoinToken, "v0.1", "List join tokens.")
	JoinTokensRevoke = NewMethod[RevokeJoinToken, JoinToken]("joinTokens", "revoke", true, ResourceJoinToken, "v0.1", "Revoke a join token.")

	NodesCordon    = NewMethod[CordonNode, Node]("nodes", "cordon", true, ResourceNode, "v0.1", "Stop new bookings on a node.")
	NodesUncordon  = NewMethod[UncordonNode, Node]("nodes", "uncordon", true, ResourceNode, "v0.1", "Let a cordoned or draining node be booked again.")
	NodesDrain     = NewMethod[DrainNode, Node]("nodes", "drain", true, ResourceNode, "v0.1", "Stop new bookings and end the existing ones, or let them run out.")
	NodesRetire    = NewMethod[RetireNode, Node]("nodes", "retire", true, ResourceNode, "v0.1", "Retire a node that holds nothing; its certificates are revoked.")
	NodesSetLabels = NewMethod[SetNodeLabels, Node]("nodes", "setLabels", true, ResourceNode, "v0.1", "Replace a node's labels.")
	// The batch forms: all or none, and over a tenant's quorum policy only with an approval.
	NodesDrainMany  = NewMethod[DrainNodes, NodeBatch]("nodes", "drainMany", true, ResourceNode, "v1.0", "Drain several nodes of a pool at once; a batch over the tenant's quorum policy needs others' approval.")
	NodesRetireMany = NewMethod[RetireNodes, NodeBatch]("nodes", "retireMany", true, ResourceNode, "v1.0", "Retire several nodes of a pool at once; a batch over the tenant's quorum policy needs others' approval.")

	CommandsCreate = NewMethod[CreateCommand, Command]("commands", "create", true, ResourceCommand, "v0.1", "Send one-shot work to a node.")
	CommandsGet    = NewMethod[GetCommand, Command]("commands", "get", false, ResourceCommand, "v0.1", "Get a command and its result.")
	CommandsList   = NewMethod[ListCommands, Page[Command]]("commands", "list", false, ResourceCommand, "v0.1", "List commands.")
	CommandsCancel = NewMethod[CancelCommand, Command]("commands", "cancel", true, ResourceCommand, "v0.1", "Cancel a command that has not finished.")
)

// NodeMethods returns the node part of the method table: lifecycle and commands.
func NodeMethods() []MethodInfo { return infos(nodeTable()) }

// JoinTokenMethods returns the join token group (served by the jointokens module).
func JoinTokenMethods() []MethodInfo { return infos(joinTokenTable()) }

func joinTokenTable() []Describer {
	return []Describer{JoinTokensCreate, JoinTokensList, JoinTokensRevoke}
}

func nodeTable() []Describer {
	return []Describer{
		NodesCordon, NodesUncordon, NodesDrain, NodesRetire, NodesSetLabels, NodesDrainMany, NodesRetireMany,
		CommandsCreate, CommandsGet, CommandsList, CommandsCancel,
	}
}
