package vps

import (
	"net/url"
	"time"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/vps/hostapi"
)

// IAM resource types of the module.
const (
	ResourceFlavor   = "vps-flavor"
	ResourceImage    = "vps-image"
	ResourceInstance = "vps-instance"
)

// The module's methods, declared as the core declares its own.
var (
	FlavorsCreate = api.NewMethod[CreateFlavor, Flavor]("flavors", "create", true, ResourceFlavor, "v0.5", "Define a flavor: the vCPUs, memory, disk and GPUs of an instance.")
	FlavorsList   = api.NewMethod[ListFlavors, api.Page[Flavor]]("flavors", "list", false, ResourceFlavor, "v0.5", "List flavors.")
	FlavorsDelete = api.NewMethod[FlavorRef, Flavor]("flavors", "delete", true, ResourceFlavor, "v0.5", "Remove a flavor no live instance uses.")

	VMImagesRegister = api.NewMethod[RegisterVMImage, VMImage]("vmImages", "register", true, ResourceImage, "v0.5", "Register what instances boot: a kernel and initramfs, and/or a disk image, each by URL and SHA-256.")
	VMImagesList     = api.NewMethod[ListVMImages, api.Page[VMImage]]("vmImages", "list", false, ResourceImage, "v0.5", "List VM images.")
	VMImagesDelete   = api.NewMethod[VMImageRef, VMImage]("vmImages", "delete", true, ResourceImage, "v0.5", "Remove a VM image no live instance uses.")

	InstancesCreate  = api.NewMethod[CreateInstance, Instance]("instances", "create", true, ResourceInstance, "v0.5", "Create an instance of a flavor in a pool: its capacity is booked as a reservation, and a VM host of the pool runs it.")
	InstancesGet     = api.NewMethod[InstanceRef, Instance]("instances", "get", false, ResourceInstance, "v0.5", "Get an instance, with its status as its host last reported it.")
	InstancesList    = api.NewMethod[ListInstances, api.Page[Instance]]("instances", "list", false, ResourceInstance, "v0.5", "List instances.")
	InstancesStart   = api.NewMethod[InstanceRef, Instance]("instances", "start", true, ResourceInstance, "v0.5", "Start a stopped (or resume a paused) instance.")
	InstancesStop    = api.NewMethod[InstanceRef, Instance]("instances", "stop", true, ResourceInstance, "v0.5", "Stop an instance (a power-off); its capacity stays booked.")
	InstancesPause   = api.NewMethod[InstanceRef, Instance]("instances", "pause", true, ResourceInstance, "v0.5", "Pause an instance: its vCPUs stop, its memory stays.")
	InstancesReboot  = api.NewMethod[InstanceRef, Instance]("instances", "reboot", true, ResourceInstance, "v0.5", "Reboot an instance (a reset).")
	InstancesDelete  = api.NewMethod[InstanceRef, Instance]("instances", "delete", true, ResourceInstance, "v0.5", "Delete an instance: its VM goes and its reservation is released.")
	InstancesConsole = api.NewMethod[InstanceRef, api.TunnelTicket]("instances", "console", true, ResourceInstance, "v0.5", "A single-use ticket to the instance's serial console, over its host's session.")
)

// Methods are the module's methods.
func Methods() []api.MethodInfo {
	return []api.MethodInfo{FlavorsCreate.Info(), FlavorsList.Info(), FlavorsDelete.Info(),
		VMImagesRegister.Info(), VMImagesList.Info(), VMImagesDelete.Info(),
		InstancesCreate.Info(), InstancesGet.Info(), InstancesList.Info(), InstancesStart.Info(), InstancesStop.Info(),
		InstancesPause.Info(), InstancesReboot.Info(), InstancesDelete.Info(), InstancesConsole.Info(),
		NetworksCreate.Info(), NetworksGet.Info(), NetworksList.Info(), NetworksDelete.Info(), NetworksAddresses.Info()}
}

// Limits of a flavor.
const (
	MaxFlavorDiskGiB = 64 << 10
)

// Flavor is a shape of instance.
type Flavor struct {
	ID         string `json:"id"`
	TenantID   string `json:"tenantId"`
	Name       string `json:"name"`
	VCPUs      int    `json:"vcpus"`
	MemoryGiB  int    `json:"memoryGiB"`
	DiskGiB    int    `json:"diskGiB,omitempty"`
	GPUs       int    `json:"gpus,omitempty"`
	GPUModel   string `json:"gpuModel,omitempty"`
	MIGProfile string `json:"migProfile,omitempty"`
	// RequireLabels are the node labels its instances are placed by: the VM hosts of a pool
	// that mixes them with other nodes.
	RequireLabels map[string]string `json:"requireLabels,omitempty"`
	CreatedBy     string            `json:"createdBy"`
	CreatedAt     time.Time         `json:"createdAt"`
}

// CreateFlavor is the input of flavors.create.
type CreateFlavor struct {
	TenantID      string            `json:"tenantId,omitempty"`
	Name          string            `json:"name"`
	VCPUs         int               `json:"vcpus"`
	MemoryGiB     int               `json:"memoryGiB"`
	DiskGiB       int               `json:"diskGiB,omitempty"`
	GPUs          int               `json:"gpus,omitempty"`       // whole GPUs, passed through
	GPUModel      string            `json:"gpuModel,omitempty"`   // e.g. h100; any when empty
	MIGProfile    string            `json:"migProfile,omitempty"` // one MIG slice instead, e.g. 1g.10gb
	RequireLabels map[string]string `json:"requireLabels,omitempty"`
}

// Shape is the capacity an instance of the flavor books.
func (in CreateFlavor) Shape() api.Shape {
	return api.Shape{VCPUs: in.VCPUs, MemoryGiB: in.MemoryGiB, GPUs: in.GPUs, Model: in.GPUModel, MIGProfile: in.MIGProfile}
}

// Validate implements the input check.
func (in CreateFlavor) Validate() error {
	if err := api.ValidateName("name", in.Name); err != nil {
		return err
	}
	if in.VCPUs < 1 {
		return api.InvalidField("vcpus", "an instance needs at least one vCPU")
	}
	if in.MemoryGiB < 1 {
		return api.InvalidField("memoryGiB", "an instance needs at least 1 GiB of memory")
	}
	if in.DiskGiB < 0 || in.DiskGiB > MaxFlavorDiskGiB {
		return api.InvalidField("diskGiB", "must be between 0 and %d", MaxFlavorDiskGiB)
	}
	if err := in.Shape().Validate(); err != nil {
		return err
	}
	if err := api.ValidateText("gpuModel", in.GPUModel, 64); err != nil {
		return err
	}
	return api.ValidateLabels("requireLabels", in.RequireLabels)
}

// ListFlavors is the input of flavors.list.
type ListFlavors struct {
	TenantID string `json:"tenantId,omitempty"`
	api.PageRequest
}

// FlavorRef names a flavor.
type FlavorRef struct {
	TenantID string `json:"tenantId,omitempty"`
	Flavor   string `json:"flavor"` // id or name
}

// Validate implements the input check.
func (in FlavorRef) Validate() error { return api.ValidateRef("flavor", in.Flavor) }

// VMImage is what instances boot.
type VMImage struct {
	ID        string    `json:"id"`
	TenantID  string    `json:"tenantId"`
	Name      string    `json:"name"`
	Kernel    *Artifact `json:"kernel,omitempty"`
	Initrd    *Artifact `json:"initrd,omitempty"`
	Cmdline   string    `json:"cmdline,omitempty"`
	Disk      *Artifact `json:"disk,omitempty"`
	CreatedBy string    `json:"createdBy"`
	CreatedAt time.Time `json:"createdAt"`
}

// Artifact is a file a VM host fetches and checks before it boots an instance from it.
type Artifact struct {
	URL    string `json:"url"`    // http or https
	SHA256 string `json:"sha256"` // hex; the host refuses a file that differs
}

func (a *Artifact) validate(field string) error {
	if a == nil {
		return nil
	}
	u, err := url.Parse(a.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || len(a.URL) > 2048 {
		return api.InvalidField(field+".url", "must be an http or https URL of at most 2048 bytes")
	}
	if !hostapi.ValidSHA256(a.SHA256) {
		return api.InvalidField(field+".sha256", "must be the file's SHA-256, 64 lower-case hex digits")
	}
	return nil
}

// RegisterVMImage is the input of vmImages.register.
type RegisterVMImage struct {
	TenantID string    `json:"tenantId,omitempty"`
	Name     string    `json:"name"`
	Kernel   *Artifact `json:"kernel,omitempty"`
	Initrd   *Artifact `json:"initrd,omitempty"`
	Cmdline  string    `json:"cmdline,omitempty"`
	Disk     *Artifact `json:"disk,omitempty"`
}

// Validate implements the input check.
func (in RegisterVMImage) Validate() error {
	if err := api.ValidateName("name", in.Name); err != nil {
		return err
	}
	if in.Kernel == nil && in.Disk == nil {
		return api.InvalidField("kernel", "an image needs a kernel (direct boot) or a disk to boot from")
	}
	if in.Initrd != nil && in.Kernel == nil {
		return api.InvalidField("initrd", "an initramfs goes with a kernel")
	}
	if in.Cmdline != "" && in.Kernel == nil {
		return api.InvalidField("cmdline", "a command line goes with a kernel")
	}
	for f, a := range map[string]*Artifact{"kernel": in.Kernel, "initrd": in.Initrd, "disk": in.Disk} {
		if err := a.validate(f); err != nil {
			return err
		}
	}
	return api.ValidateText("cmdline", in.Cmdline, 4096)
}

// ListVMImages is the input of vmImages.list.
type ListVMImages struct {
	TenantID string `json:"tenantId,omitempty"`
	api.PageRequest
}

// VMImageRef names an image.
type VMImageRef struct {
	TenantID string `json:"tenantId,omitempty"`
	Image    string `json:"image"` // id or name
}

// Validate implements the input check.
func (in VMImageRef) Validate() error { return api.ValidateRef("image", in.Image) }

// Instance is a VM.
type Instance struct {
	ID            string `json:"id"`
	TenantID      string `json:"tenantId"`
	Name          string `json:"name"`
	Flavor        string `json:"flavor"` // its name
	FlavorID      string `json:"flavorId"`
	Image         string `json:"image"`
	ImageID       string `json:"imageId"`
	ReservationID string `json:"reservationId"` // what holds its capacity
	NodeID        string `json:"nodeId"`        // its host
	// Power is what it should be: running, paused or stopped. Status is what its host last
	// said it is: pending (not yet seen), running, paused, stopped, error (StatusDetail says
	// why) or deleted.
	Power         string            `json:"power"`
	Status        string            `json:"status"`
	StatusDetail  string            `json:"statusDetail,omitempty"`
	StatusAt      *time.Time        `json:"statusAt,omitempty"`
	DeletedAt     *time.Time        `json:"deletedAt,omitempty"`
	DeletedReason string            `json:"deletedReason,omitempty"` // deleted, or why its reservation ended: expired, preempted, drained
	Labels        map[string]string `json:"labels"`
	CreatedBy     string            `json:"createdBy"`
	CreatedAt     time.Time         `json:"createdAt"`
	// NICs are its network interfaces with their addresses (instances.get and sandboxes.get
	// only; lists leave them out).
	NICs []hostapi.NIC `json:"nics,omitempty"`
	kind string        // instance, sandbox or warm
}

// CreateInstance is the input of instances.create.
type CreateInstance struct {
	TenantID string `json:"tenantId,omitempty"`
	Name     string `json:"name"`
	Pool     string `json:"pool"`
	Flavor   string `json:"flavor"`
	Image    string `json:"image"`
	// Duration, if set, ends the instance then (its reservation's end); default: until deleted.
	Duration string            `json:"duration,omitempty"`
	Power    string            `json:"power,omitempty"` // running (the default), paused or stopped
	Labels   map[string]string `json:"labels,omitempty"`
	// Networks are its NICs, in order (the first is eth0, with the default route), each leasing
	// its addresses on a network of the tenant (docs/vps.md, Networking).
	Networks []InstanceNIC `json:"networks,omitempty"`
	// UserData is cloud-init's user-data (a #cloud-config document or a script), given to the
	// guest in its NoCloud seed with its network config. Write-only: never answered.
	UserData string `json:"userData,omitempty"`
}

// Validate implements the input check.
func (in CreateInstance) Validate() error {
	if err := api.ValidateName("name", in.Name); err != nil {
		return err
	}
	for f, v := range map[string]string{"pool": in.Pool, "flavor": in.Flavor, "image": in.Image} {
		if err := api.ValidateRef(f, v); err != nil {
			return err
		}
	}
	if in.Duration != "" {
		if _, err := api.ParseDuration("duration", in.Duration); err != nil {
			return err
		}
	}
	switch in.Power {
	case "", PowerRunning, PowerPaused, PowerStopped:
	default:
		return api.InvalidField("power", "is running, paused or stopped, not %q", in.Power)
	}
	if err := ValidateNICs("networks", in.Networks); err != nil {
		return err
	}
	if err := ValidateUserData("userData", in.UserData); err != nil {
		return err
	}
	return api.ValidateLabels("labels", in.Labels)
}

// Power states.
const (
	PowerRunning = "running"
	PowerPaused  = "paused"
	PowerStopped = "stopped"
)

// InstanceRef names an instance.
type InstanceRef struct {
	TenantID string `json:"tenantId,omitempty"`
	Instance string `json:"instance"` // id or name
}

// Validate implements the input check.
func (in InstanceRef) Validate() error { return api.ValidateRef("instance", in.Instance) }

// ListInstances is the input of instances.list.
type ListInstances struct {
	TenantID string `json:"tenantId,omitempty"`
	Node     string `json:"node,omitempty"`   // a host's id
	Status   string `json:"status,omitempty"` // one status
	// Deleted lists deleted instances too.
	Deleted bool `json:"deleted,omitempty"`
	api.PageRequest
}

// Validate implements the input check.
func (in ListInstances) Validate() error {
	if in.Node != "" {
		if err := api.ValidateRef("node", in.Node); err != nil {
			return err
		}
	}
	switch in.Status {
	case "", "pending", "running", "paused", "stopped", "error", "deleted":
		return in.PageRequest.Validate()
	}
	return api.InvalidField("status", "%q is not an instance status (pending, running, paused, stopped, error, deleted)", in.Status)
}
