package metal

import (
	"net/url"
	"regexp"
	"time"

	"github.com/better-compute/compute/api"
)

// IAM resource types of the module.
const (
	ResourceMachine = "metal-machine"
	ResourceImage   = "metal-image"
)

// The module's methods, declared as the core declares its own.
var (
	MachinesCreate = api.NewMethod[CreateMachine, Machine]("machines", "create", true, ResourceMachine, "v0.4", "Register a machine by its BMC; the BMC password is write-only.")
	MachinesGet    = api.NewMethod[MachineRef, Machine]("machines", "get", false, ResourceMachine, "v0.4", "Get a machine (never its BMC password).")
	MachinesList   = api.NewMethod[ListMachines, api.Page[Machine]]("machines", "list", false, ResourceMachine, "v0.4", "List machines.")
	MachinesSetBMC = api.NewMethod[SetMachineBMC, Machine]("machines", "setBMC", true, ResourceMachine, "v0.4", "Replace a machine's BMC address and credentials.")
	MachinesPower  = api.NewMethod[PowerMachine, PowerRun]("machines", "power", true, ResourceMachine, "v0.4", "Power a machine on, off, cycle or reset it through its BMC, as a workflow.")
	MachinesDelete = api.NewMethod[MachineRef, Machine]("machines", "delete", true, ResourceMachine, "v0.4", "Forget a machine and its BMC credentials.")

	ImagesRegister = api.NewMethod[RegisterImage, Image]("images", "register", true, ResourceImage, "v0.4", "Register an image machines can be deployed with: URL, format, size and SHA-256.")
	ImagesList     = api.NewMethod[ListImages, api.Page[Image]]("images", "list", false, ResourceImage, "v0.4", "List images.")
	ImagesDelete   = api.NewMethod[ImageRef, Image]("images", "delete", true, ResourceImage, "v0.4", "Remove an image.")
)

// Methods are the module's methods.
func Methods() []api.MethodInfo {
	return []api.MethodInfo{MachinesCreate.Info(), MachinesGet.Info(), MachinesList.Info(), MachinesSetBMC.Info(), MachinesPower.Info(),
		MachinesDelete.Info(), ImagesRegister.Info(), ImagesList.Info(), ImagesDelete.Info()}
}

// Machine is a machine the module reaches through its BMC.
type Machine struct {
	ID             string     `json:"id"`
	TenantID       string     `json:"tenantId"`
	Name           string     `json:"name"`
	BMC            BMCInfo    `json:"bmc"`
	Facts          Facts      `json:"facts"` // what its ramdisk reported, for a machine that asked to join
	Power          string     `json:"power"` // unknown, on or off, as last read
	PowerCheckedAt *time.Time `json:"powerCheckedAt,omitempty"`
	CreatedBy      string     `json:"createdBy"`
	CreatedAt      time.Time  `json:"createdAt"`
}

// BMCInfo is a machine's BMC as the API shows it: never the password.
type BMCInfo struct {
	Driver      string `json:"driver"`
	Address     string `json:"address"`
	Username    string `json:"username"`
	PasswordSet bool   `json:"passwordSet"`
}

// BMCInput is a BMC as a caller gives it.
type BMCInput struct {
	Driver   string `json:"driver"`  // a registered power driver: ipmi, redfish, …
	Address  string `json:"address"` // ipmi: host:port; redfish: https://host
	Username string `json:"username"`
	Password string `json:"password"` // write-only
}

var driverRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)

// Validate implements the input check of a BMC (whether the driver is registered is the
// server's to say).
func (b BMCInput) Validate() error {
	switch {
	case !driverRE.MatchString(b.Driver):
		return api.InvalidField("bmc.driver", "%q is not a driver name (e.g. ipmi, redfish)", b.Driver)
	case b.Address == "" || len(b.Address) > 2048:
		return api.InvalidField("bmc.address", "is required: host:port for IPMI, the service's URL for Redfish")
	case b.Username == "" || len(b.Username) > 64:
		return api.InvalidField("bmc.username", "is required, at most 64 characters")
	case b.Password == "" || len(b.Password) > 256:
		return api.InvalidField("bmc.password", "is required, at most 256 characters")
	}
	return nil
}

// CreateMachine is the input of machines.create.
type CreateMachine struct {
	TenantID string   `json:"tenantId,omitempty"`
	Name     string   `json:"name"`
	BMC      BMCInput `json:"bmc"`
}

// Validate implements the input check.
func (in CreateMachine) Validate() error {
	if err := api.ValidateName("name", in.Name); err != nil {
		return err
	}
	return in.BMC.Validate()
}

// MachineRef names a machine by id or name.
type MachineRef struct {
	TenantID string `json:"tenantId,omitempty"`
	Machine  string `json:"machine"`
}

// Validate implements the input check.
func (in MachineRef) Validate() error { return api.ValidateRef("machine", in.Machine) }

// ListMachines is the input of machines.list.
type ListMachines struct {
	TenantID string `json:"tenantId,omitempty"`
	api.PageRequest
}

// Validate implements the input check.
func (in ListMachines) Validate() error { return in.PageRequest.Validate() }

// SetMachineBMC is the input of machines.setBMC.
type SetMachineBMC struct {
	TenantID string   `json:"tenantId,omitempty"`
	Machine  string   `json:"machine"`
	BMC      BMCInput `json:"bmc"`
}

// Validate implements the input check.
func (in SetMachineBMC) Validate() error {
	if err := api.ValidateRef("machine", in.Machine); err != nil {
		return err
	}
	return in.BMC.Validate()
}

// PowerMachine is the input of machines.power.
type PowerMachine struct {
	TenantID string `json:"tenantId,omitempty"`
	Machine  string `json:"machine"`
	Action   string `json:"action"` // on, off, cycle, reset, soft
}

// Validate implements the input check.
func (in PowerMachine) Validate() error {
	if err := api.ValidateRef("machine", in.Machine); err != nil {
		return err
	}
	if in.Action == "" {
		return api.InvalidField("action", "is required: on, off, cycle, reset or soft")
	}
	return api.ValidateEnum("action", in.Action, "on", "off", "cycle", "reset", "soft")
}

// PowerRun is the answer of machines.power: the workflow run that carries it out
// (workflows.get), and the machine.
type PowerRun struct {
	Run     string  `json:"run"`
	Machine Machine `json:"machine"`
}

// Image is an image machines are deployed with.
type Image struct {
	ID        string    `json:"id"`
	TenantID  string    `json:"tenantId"`
	Name      string    `json:"name"`
	URL       string    `json:"url"`
	Format    string    `json:"format"` // raw, qcow2 or tar
	SizeBytes int64     `json:"sizeBytes"`
	SHA256    string    `json:"sha256"`
	CreatedBy string    `json:"createdBy"`
	CreatedAt time.Time `json:"createdAt"`
}

// RegisterImage is the input of images.register.
type RegisterImage struct {
	TenantID  string `json:"tenantId,omitempty"`
	Name      string `json:"name"`
	URL       string `json:"url"`
	Format    string `json:"format"`
	SizeBytes int64  `json:"sizeBytes" input:"int8"`
	SHA256    string `json:"sha256"`
}

var sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Validate implements the input check.
func (in RegisterImage) Validate() error {
	if err := api.ValidateName("name", in.Name); err != nil {
		return err
	}
	if u, err := url.Parse(in.URL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || len(in.URL) > 2048 {
		return api.InvalidField("url", "%q is not an http or https URL", in.URL)
	}
	if in.Format == "" {
		return api.InvalidField("format", "is required: raw, qcow2 or tar")
	}
	if err := api.ValidateEnum("format", in.Format, "raw", "qcow2", "tar"); err != nil {
		return err
	}
	if in.SizeBytes <= 0 {
		return api.InvalidField("sizeBytes", "must be the image's size in bytes, got %d", in.SizeBytes)
	}
	if !sha256RE.MatchString(in.SHA256) {
		return api.InvalidField("sha256", "must be the image's SHA-256 as 64 lowercase hex digits")
	}
	return nil
}

// ListImages is the input of images.list.
type ListImages struct {
	TenantID string `json:"tenantId,omitempty"`
	api.PageRequest
}

// Validate implements the input check.
func (in ListImages) Validate() error { return in.PageRequest.Validate() }

// ImageRef names an image by id or name.
type ImageRef struct {
	TenantID string `json:"tenantId,omitempty"`
	Image    string `json:"image"`
}

// Validate implements the input check.
func (in ImageRef) Validate() error { return api.ValidateRef("image", in.Image) }
