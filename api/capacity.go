package api

import (
	"regexp"
	"time"
)

// IAM resource types of the capacity groups.
const (
	ResourceReservation = "compute-reservation"
	ResourceQuota       = "compute-quota"
	ResourceDevice      = "compute-device"
)

// Reservation states. pending → active → released | expired | preempted; pending → cancelled |
// preempted. The database refuses any other transition.
const (
	ReservationPending   = "pending"   // booked; the window starts in the future
	ReservationActive    = "active"    // the window has started
	ReservationReleased  = "released"  // ended early by its holder
	ReservationCancelled = "cancelled" // ended before it started
	ReservationExpired   = "expired"   // its window closed
	ReservationPreempted = "preempted" // a spot reservation displaced by a normal one
)

// GPU modes.
const (
	GPUModeWhole     = "whole"     // booked as a whole GPU
	GPUModeMIG       = "mig"       // partitioned into MIG slices
	GPUModeTimeSlice = "timeslice" // shared by N holders in turn
)

// Limits of a request's shape.
const (
	MaxGPUsPerMember   = 64
	MaxMembers         = 256
	MaxVCPUsPerMember  = 4096
	MaxMemoryGiB       = 1 << 20
	MaxTimeSliceShares = 64
)

var migProfileRE = regexp.MustCompile(`^[1-7]g\.[0-9]+gb$`)

// Shape is what one member of a reservation holds on one node: whole GPUs, one MIG slice or one
// time-slice share, plus optional vCPUs and memory.
type Shape struct {
	GPUs       int    `json:"gpus,omitempty"`
	Model      string `json:"model,omitempty"`      // GPU model, e.g. h100; any model when empty
	NVLink     bool   `json:"nvlink,omitempty"`     // all of a member's GPUs in one NVLink domain
	MIGProfile string `json:"migProfile,omitempty"` // one MIG slice of this profile, e.g. 3g.40gb
	TimeSlice  bool   `json:"timeSlice,omitempty"`  // one share of a GPU in time-slice mode
	VCPUs      int    `json:"vcpus,omitempty"`
	MemoryGiB  int    `json:"memoryGiB,omitempty"`
}

// Validate checks a shape.
func (s Shape) Validate() error {
	kinds := 0
	if s.GPUs != 0 {
		kinds++
	}
	if s.MIGProfile != "" {
		kinds++
	}
	if s.TimeSlice {
		kinds++
	}
	switch {
	case s.GPUs < 0 || s.GPUs > MaxGPUsPerMember:
		return InvalidField("gpus", "must be between 1 and %d, got %d", MaxGPUsPerMember, s.GPUs)
	case s.VCPUs < 0 || s.VCPUs > MaxVCPUsPerMember:
		return InvalidField("vcpus", "must be between 1 and %d, got %d", MaxVCPUsPerMember, s.VCPUs)
	case s.MemoryGiB < 0 || s.MemoryGiB > MaxMemoryGiB:
		return InvalidField("memoryGiB", "must be between 1 and %d, got %d", MaxMemoryGiB, s.MemoryGiB)
	case kinds > 1:
		return InvalidField("gpus", "ask for whole GPUs, a MIG profile or a time-slice share, not several")
	case kinds == 0 && s.VCPUs == 0 && s.MemoryGiB == 0:
		return InvalidField("gpus", "the request asks for nothing: give gpus, migProfile, timeSlice, vcpus or memoryGiB")
	case s.MIGProfile != "" && !migProfileRE.MatchString(s.MIGProfile):
		return InvalidField("migProfile", "%q is not a MIG profile name such as 1g.10gb or 3g.40gb", s.MIGProfile)
	case s.NVLink && s.GPUs == 0:
		return InvalidField("nvlink", "applies to whole GPUs only")
	case (s.MIGProfile != "" || s.TimeSlice) && s.Model == "":
		// A slice or a share of an unspecified model would be any size at all.
		return InvalidField("model", "is required with a MIG profile or a time-slice share")
	}
	return ValidateText("model", s.Model, 64)
}

// CreateReservation is the input of reservations.create.
type CreateReservation struct {
	TenantID string `json:"tenantId,omitempty"`
	Pool     string `json:"pool"` // id or name; a pool of the tenant or of one of its ancestors
	Shape
	Members       int               `json:"members,omitempty"` // a gang: this many members on distinct nodes, all or none; default 1
	RequireLabels map[string]string `json:"requireLabels,omitempty"`
	AvoidLabels   map[string]string `json:"avoidLabels,omitempty"`
	// The window: from Start (default now) for Duration, or until End; with neither, until released.
	Start    *time.Time        `json:"start,omitempty"`
	Duration string            `json:"duration,omitempty"` // e.g. "8h", "90m"
	End      *time.Time        `json:"end,omitempty"`
	Spot     bool              `json:"spot,omitempty"` // preemptible: uses idle capacity, displaced by normal bookings
	Labels   map[string]string `json:"labels,omitempty"`
}

// Validate implements the input check of reservations.create.
func (in CreateReservation) Validate() error {
	if err := ValidateRef("pool", in.Pool); err != nil {
		return err
	}
	if err := in.Shape.Validate(); err != nil {
		return err
	}
	if in.Members < 0 || in.Members > MaxMembers {
		return InvalidField("members", "must be between 1 and %d, got %d", MaxMembers, in.Members)
	}
	if in.Duration != "" && in.End != nil {
		return InvalidField("end", "give a duration or an end, not both")
	}
	if in.Duration != "" {
		if _, err := ParseDuration("duration", in.Duration); err != nil {
			return err
		}
	}
	if in.End != nil && in.Start != nil && !in.End.After(*in.Start) {
		return InvalidField("end", "%s is not after the start %s", in.End.Format(time.RFC3339), in.Start.Format(time.RFC3339))
	}
	return first(ValidateLabels("requireLabels", in.RequireLabels), ValidateLabels("avoidLabels", in.AvoidLabels),
		ValidateLabels("labels", in.Labels))
}

// MemberCount is Members with its default.
func (in CreateReservation) MemberCount() int { return max(in.Members, 1) }

// ParseDuration parses a positive Go duration ("8h", "90m", "1h30m") for field.
func ParseDuration(field, s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, InvalidField(field, "%q is not a duration such as 8h or 90m", s)
	}
	if d <= 0 {
		return 0, InvalidField(field, "must be positive, got %s", s)
	}
	if d > 100*365*24*time.Hour {
		return 0, InvalidField(field, "%s is longer than a hundred years", s)
	}
	return d, nil
}

// Reservation is a claim on capacity: one or more bookings over a window.
type Reservation struct {
	ID       string     `json:"id"`
	TenantID string     `json:"tenantId"`
	PoolID   string     `json:"poolId"`
	State    string     `json:"state"`
	Spot     bool       `json:"spot,omitempty"`
	Shape    Shape      `json:"shape"`
	Members  int        `json:"members"`
	StartsAt time.Time  `json:"startsAt"`
	EndsAt   *time.Time `json:"endsAt,omitempty"` // nil: until released
	EndedAt  *time.Time `json:"endedAt,omitempty"`
	// EndReason is why it ended: released, cancelled, expired, preempted or drained (a node it
	// held was drained with end: true). A live reservation shows preempted when a normal booking
	// has already decided to take its capacity at EndsAt.
	EndReason string `json:"endReason,omitempty"`
	// EndedBy is, for preempted, the reservation that took its capacity; for drained, the node.
	EndedBy     string            `json:"endedBy,omitempty"`
	Allocations []Allocation      `json:"allocations"`
	Labels      map[string]string `json:"labels"`
	CreatedBy   string            `json:"createdBy"`
	CreatedAt   time.Time         `json:"createdAt"`
	UpdatedAt   time.Time         `json:"updatedAt"`
}

// Allocation is what one member holds on one node.
type Allocation struct {
	NodeID    string         `json:"nodeId"`
	Node      string         `json:"node"`
	GPUs      []AllocatedGPU `json:"gpus,omitempty"`
	CPUSet    string         `json:"cpuset,omitempty"` // the vCPUs, e.g. "0-7,16-23"
	VCPUs     int            `json:"vcpus,omitempty"`
	MemoryGiB int            `json:"memoryGiB,omitempty"`
}

// AllocatedGPU is a GPU, or the part of one, that an allocation holds.
type AllocatedGPU struct {
	Index      int    `json:"index"`
	UUID       string `json:"uuid"`
	Model      string `json:"model"`
	MIGProfile string `json:"migProfile,omitempty"` // with the slice's first memory slice
	MIGStart   int    `json:"migStart,omitempty"`
	Share      *int   `json:"share,omitempty"` // the time-slice share held
}

// GetReservation is the input of reservations.get.
type GetReservation struct {
	Reservation string `json:"reservation"` // id
}

// Validate implements the input check.
func (in GetReservation) Validate() error { return ValidateRef("reservation", in.Reservation) }

// ListReservations is the input of reservations.list.
type ListReservations struct {
	TenantID string `json:"tenantId,omitempty"`
	Pool     string `json:"pool,omitempty"`
	State    string `json:"state,omitempty"`
	Node     string `json:"node,omitempty"` // id or name: only reservations that hold (or held) something on it
	PageRequest
}

// Validate implements the input check.
func (in ListReservations) Validate() error {
	var node error
	if in.Node != "" {
		node = ValidateRef("node", in.Node)
	}
	return first(node, ValidateEnum("state", in.State, ReservationPending, ReservationActive, ReservationReleased,
		ReservationCancelled, ReservationExpired, ReservationPreempted), in.PageRequest.Validate())
}

// CancelReservation is the input of reservations.cancel: a pending reservation ends before it starts.
type CancelReservation struct {
	Reservation string `json:"reservation"`
}

// Validate implements the input check.
func (in CancelReservation) Validate() error { return ValidateRef("reservation", in.Reservation) }

// ReleaseReservation is the input of reservations.release: an active reservation ends now.
type ReleaseReservation struct {
	Reservation string `json:"reservation"`
}

// Validate implements the input check.
func (in ReleaseReservation) Validate() error { return ValidateRef("reservation", in.Reservation) }

// ExtendReservation is the input of reservations.extend: the window ends later.
type ExtendReservation struct {
	Reservation string     `json:"reservation"`
	By          string     `json:"by,omitempty"` // a duration added to the end
	End         *time.Time `json:"end,omitempty"`
}

// Validate implements the input check.
func (in ExtendReservation) Validate() error {
	if err := ValidateRef("reservation", in.Reservation); err != nil {
		return err
	}
	if (in.By == "") == (in.End == nil) {
		return InvalidField("by", "give by (a duration) or end, one of them")
	}
	if in.By != "" {
		_, err := ParseDuration("by", in.By)
		return err
	}
	return nil
}

// Availability is the input of reservations.availability: the earliest window of Duration, at or
// after After, in which the pool has the shape free for every member.
type Availability struct {
	TenantID string `json:"tenantId,omitempty"`
	Pool     string `json:"pool"`
	Shape
	Members  int        `json:"members,omitempty"`
	Duration string     `json:"duration"`
	After    *time.Time `json:"after,omitempty"`   // default now
	Horizon  string     `json:"horizon,omitempty"` // how far to look; default 30 days (720h)
}

// Validate implements the input check.
func (in Availability) Validate() error {
	if err := ValidateRef("pool", in.Pool); err != nil {
		return err
	}
	if err := in.Shape.Validate(); err != nil {
		return err
	}
	if in.Members < 0 || in.Members > MaxMembers {
		return InvalidField("members", "must be between 1 and %d, got %d", MaxMembers, in.Members)
	}
	if in.Duration == "" {
		return InvalidField("duration", "is required")
	}
	if _, err := ParseDuration("duration", in.Duration); err != nil {
		return err
	}
	if in.Horizon != "" {
		if _, err := ParseDuration("horizon", in.Horizon); err != nil {
			return err
		}
	}
	return nil
}

// AvailabilityAnswer answers reservations.availability.
type AvailabilityAnswer struct {
	Found bool       `json:"found"`
	Start *time.Time `json:"start,omitempty"`
	End   *time.Time `json:"end,omitempty"`
	Nodes []string   `json:"nodes,omitempty"` // the nodes that would hold it, one per member
}

// SearchCapacity is the input of capacity.search: what is free in a pool over a window.
type SearchCapacity struct {
	TenantID string    `json:"tenantId,omitempty"`
	Pool     string    `json:"pool"`
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"`
}

// Validate implements the input check.
func (in SearchCapacity) Validate() error {
	if err := ValidateRef("pool", in.Pool); err != nil {
		return err
	}
	if in.Start.IsZero() || in.End.IsZero() {
		return InvalidField("start", "start and end are required")
	}
	if !in.End.After(in.Start) {
		return InvalidField("end", "%s is not after the start %s", in.End.Format(time.RFC3339), in.Start.Format(time.RFC3339))
	}
	return nil
}

// CapacityWindow answers capacity.search: what is free for the whole of the window.
type CapacityWindow struct {
	PoolID        string        `json:"poolId"`
	Start         time.Time     `json:"start"`
	End           time.Time     `json:"end"`
	Models        []ModelWindow `json:"models"`
	VCPUsFree     int           `json:"vcpusFree"`
	MemoryGiBFree int           `json:"memoryGiBFree"`
}

// ModelWindow is the free whole GPUs of one model over a window.
type ModelWindow struct {
	Model        string `json:"model"`
	GPUs         int    `json:"gpus"`         // schedulable GPUs in whole mode
	Free         int    `json:"free"`         // free for the whole window (spot holders count as free)
	LargestBlock int    `json:"largestBlock"` // the most free on one node
}

// SummarizeCapacity is the input of capacity.summary.
type SummarizeCapacity struct {
	TenantID string `json:"tenantId,omitempty"`
	Pool     string `json:"pool"`
}

// Validate implements the input check.
func (in SummarizeCapacity) Validate() error { return ValidateRef("pool", in.Pool) }

// PoolCapacity is capacity now, from the maintained rollups.
type PoolCapacity struct {
	PoolID      string          `json:"poolId"`
	Nodes       int             `json:"nodes"`
	Schedulable int             `json:"schedulable"` // active, online, not unhealthy
	Models      []ModelCapacity `json:"models"`
	VCPUs       ResourceCount   `json:"vcpus"`
	MemoryGiB   ResourceCount   `json:"memoryGiB"`
}

// ModelCapacity is the whole GPUs of one model, now.
type ModelCapacity struct {
	Model string `json:"model"`
	ResourceCount
}

// ResourceCount counts a resource now: Used by normal bookings, Spot by spot ones, Free by none.
type ResourceCount struct {
	Total int `json:"total"`
	Used  int `json:"used"`
	Spot  int `json:"spot"`
	Free  int `json:"free"`
}

// Quota resources.
const (
	QuotaGPUs      = "gpus"
	QuotaVCPUs     = "vcpus"
	QuotaMemoryGiB = "memoryGiB"
)

// Quota limits what a tenant may hold at once in a pool: whole GPUs (of one model, or of all),
// vCPUs or GiB of memory, counted over its pending and active reservations.
type Quota struct {
	TenantID string `json:"tenantId"`
	PoolID   string `json:"poolId"`
	Resource string `json:"resource"`
	Model    string `json:"model,omitempty"` // for gpus: one model; empty: all models
	Limit    int    `json:"limit"`
	Used     int    `json:"used"`
}

// SetQuota is the input of quotas.set. It is decided in the pool's tenant: a tenant does not raise
// its own quota.
type SetQuota struct {
	TenantID string `json:"tenantId"` // the tenant limited
	Pool     string `json:"pool"`
	Resource string `json:"resource"`
	Model    string `json:"model,omitempty"`
	Limit    int    `json:"limit"`
}

// Validate implements the input check.
func (in SetQuota) Validate() error {
	if in.TenantID == "" {
		return InvalidField("tenantId", "is required: the tenant the quota limits")
	}
	if err := ValidateRef("pool", in.Pool); err != nil {
		return err
	}
	if err := validateQuotaResource(in.Resource, in.Model); err != nil {
		return err
	}
	if in.Limit < 0 {
		return InvalidField("limit", "must not be negative, got %d", in.Limit)
	}
	return nil
}

func validateQuotaResource(resource, model string) error {
	switch resource {
	case QuotaGPUs:
		return ValidateText("model", model, 64)
	case QuotaVCPUs, QuotaMemoryGiB:
		if model != "" {
			return InvalidField("model", "applies to gpus only")
		}
		return nil
	default:
		return InvalidField("resource", "%q is not a quota resource: use gpus, vcpus or memoryGiB", resource)
	}
}

// ListQuotas is the input of quotas.list: the quotas that limit a tenant.
type ListQuotas struct {
	TenantID string `json:"tenantId,omitempty"`
	PageRequest
}

// DeleteQuota is the input of quotas.delete.
type DeleteQuota struct {
	TenantID string `json:"tenantId"`
	Pool     string `json:"pool"`
	Resource string `json:"resource"`
	Model    string `json:"model,omitempty"`
}

// Validate implements the input check.
func (in DeleteQuota) Validate() error {
	if in.TenantID == "" {
		return InvalidField("tenantId", "is required: the tenant the quota limits")
	}
	if err := ValidateRef("pool", in.Pool); err != nil {
		return err
	}
	return validateQuotaResource(in.Resource, in.Model)
}

// Device is a GPU of a node.
type Device struct {
	ID           string    `json:"id"`
	NodeID       string    `json:"nodeId"`
	Index        int       `json:"index"`
	UUID         string    `json:"uuid"`
	Model        string    `json:"model"` // the model key, e.g. h100
	Name         string    `json:"name"`  // the name the hardware reports
	MemoryMiB    int64     `json:"memoryMiB"`
	NVLinkDomain string    `json:"nvlinkDomain,omitempty"`
	Health       string    `json:"health"`
	Mode         string    `json:"mode"`             // whole, mig, timeslice
	Shares       int       `json:"shares,omitempty"` // in timeslice mode
	MIGProfiles  []string  `json:"migProfiles,omitempty"`
	UpdatedAt    time.Time `json:"updatedAt"`
	// Holders are the bookings on the GPU that have not ended, now or later, soonest first.
	Holders []DeviceHolder `json:"holders"`
}

// DeviceHolder is one booking of (part of) a GPU: who holds which atoms, from when until when.
type DeviceHolder struct {
	Reservation string     `json:"reservation"`
	TenantID    string     `json:"tenantId"`
	State       string     `json:"state"`           // the reservation's
	Kind        string     `json:"kind"`            // gpu (the whole GPU), mig (a slice) or share (a time-slice share)
	Atoms       string     `json:"atoms"`           // the node's atoms held on this GPU, e.g. [64,128) (see docs/capacity.md)
	Spot        bool       `json:"spot,omitempty"`  // preemptible
	From        time.Time  `json:"from"`            // when the booking starts
	Until       *time.Time `json:"until,omitempty"` // nil: until released
}

// ListDevices is the input of devices.list.
type ListDevices struct {
	TenantID string `json:"tenantId,omitempty"`
	Node     string `json:"node"` // id
}

// Validate implements the input check.
func (in ListDevices) Validate() error { return ValidateRef("node", in.Node) }

// SetGPUMode is the input of devices.setMode. The mode changes only while nothing holds the GPU.
type SetGPUMode struct {
	Device string `json:"device"` // id or UUID
	Mode   string `json:"mode"`
	Shares int    `json:"shares,omitempty"` // timeslice: 2 to 64
}

// Validate implements the input check.
func (in SetGPUMode) Validate() error {
	if err := ValidateRef("device", in.Device); err != nil {
		return err
	}
	switch in.Mode {
	case GPUModeWhole, GPUModeMIG:
		if in.Shares != 0 {
			return InvalidField("shares", "applies to timeslice mode only")
		}
	case GPUModeTimeSlice:
		if in.Shares < 2 || in.Shares > MaxTimeSliceShares {
			return InvalidField("shares", "must be between 2 and %d in timeslice mode, got %d", MaxTimeSliceShares, in.Shares)
		}
	default:
		return InvalidField("mode", "%q is not a GPU mode: use whole, mig or timeslice", in.Mode)
	}
	return nil
}
