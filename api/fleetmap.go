package api

// Page sizes of devices.map, counted in nodes: a map is read in a few large pages.
const (
	DefaultMapLimit = 1000
	MaxMapLimit     = 5000
)

// MapDevices is the input of devices.map: a page of a tenant's nodes (of one pool, or all of
// them), in id order, each with every GPU's state now. It is the fleet map a console draws, in
// few bytes a GPU.
type MapDevices struct {
	TenantID string `json:"tenantId,omitempty"`
	Pool     string `json:"pool,omitempty"` // id or name of a pool of the tenant
	Cursor   string `json:"cursor,omitempty"`
	Limit    int    `json:"limit,omitempty"` // nodes: 0 means DefaultMapLimit, at most MaxMapLimit
}

// Validate implements the input check.
func (in MapDevices) Validate() error {
	if in.Limit < 0 || in.Limit > MaxMapLimit {
		return InvalidField("limit", "must be between 1 and %d (0 means %d), got %d", MaxMapLimit, DefaultMapLimit, in.Limit)
	}
	if len(in.Cursor) > 512 {
		return InvalidField("cursor", "is not a cursor returned by this API")
	}
	if in.Pool != "" {
		return ValidateRef("pool", in.Pool)
	}
	return nil
}

// MapLimit returns the effective limit.
func (in MapDevices) MapLimit() int {
	if in.Limit == 0 {
		return DefaultMapLimit
	}
	return in.Limit
}

// MapNode is one node of the fleet map: its lifecycle, session and health, and its GPUs.
type MapNode struct {
	ID     string   `json:"id"`
	Name   string   `json:"name"`
	PoolID string   `json:"poolId"`
	State  string   `json:"state"`  // active, cordoned, draining, retired
	Status string   `json:"status"` // online, offline
	Health string   `json:"health"`
	GPUs   []MapGPU `json:"gpus"`
}

// MapGPU is one GPU of the fleet map, now: its mode and health, how many of its 64 atoms are
// held (a whole GPU holds all 64, a MIG slice 8 per memory slice, a time-slice share one; see
// docs/capacity.md) and by which reservations.
type MapGPU struct {
	Index  int    `json:"index"`
	Model  string `json:"model"`
	Mode   string `json:"mode"` // whole, mig, timeslice
	Health string `json:"health"`
	Shares int    `json:"shares,omitempty"` // in timeslice mode
	Held   int    `json:"held,omitempty"`   // atoms held now, 0 to 64
	// Holders are the reservations that hold (part of) it now, in the order of their atoms.
	Holders []string `json:"holders,omitempty"`
	Spot    bool     `json:"spot,omitempty"` // every holder now is spot
}
