package metal

import (
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/metal/siteapi"
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
	ID       string  `json:"id"`
	TenantID string  `json:"tenantId"`
	Name     string  `json:"name"`
	BMC      BMCInfo `json:"bmc"`
	// Site is the site whose agent (bcd site) reaches its BMC and PXE-boots it; empty: the
	// control plane's workers reach its BMC themselves, and it is not PXE-booted.
	Site    string   `json:"site,omitempty"`
	Profile string   `json:"profile"` // the composition of drivers it is provisioned with (profiles.list)
	MACs    []string `json:"macs"`    // the NICs it PXE-boots from
	// State is where its provisioning is: available (wiped, free), deploying, deployed,
	// releasing (being wiped), failed (a deploy or release failed; machines.release again).
	State          string        `json:"state"`
	Image          string        `json:"image,omitempty"`  // the image deployed, or being deployed
	NodeID         string        `json:"nodeId,omitempty"` // the node its deployed system joined as
	Task           *TaskProgress `json:"task,omitempty"`   // what its ramdisk is doing, as last reported
	Facts          Facts         `json:"facts"`            // what its ramdisk reported
	SeenAt         *time.Time    `json:"seenAt,omitempty"` // when its ramdisk last said hello
	Power          string        `json:"power"`            // unknown, on or off, as last read
	PowerCheckedAt *time.Time    `json:"powerCheckedAt,omitempty"`
	CreatedBy      string        `json:"createdBy"`
	CreatedAt      time.Time     `json:"createdAt"`
}

// TaskProgress is a machine's ramdisk task as last reported: wipe, download with bytes of total,
// verify, boot, done or failed.
type TaskProgress struct {
	ID        string    `json:"id"`
	Kind      string    `json:"kind"`
	Phase     string    `json:"phase,omitempty"` // empty: not started yet
	Bytes     int64     `json:"bytes,omitempty"`
	Total     int64     `json:"total,omitempty"`
	Error     string    `json:"error,omitempty"`
	UpdatedAt time.Time `json:"updatedAt,omitzero"`
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
	Site     string   `json:"site,omitempty"`    // id or name of the site whose agent reaches it
	Profile  string   `json:"profile,omitempty"` // default: pxe-<the BMC's driver>
	MACs     []string `json:"macs,omitempty"`    // its NICs, lowercase aa:bb:cc:dd:ee:ff
}

// Validate implements the input check.
func (in CreateMachine) Validate() error {
	if err := api.ValidateName("name", in.Name); err != nil {
		return err
	}
	if err := validatePlacement(in.Site, in.Profile, in.MACs); err != nil {
		return err
	}
	return in.BMC.Validate()
}

// validatePlacement checks a machine's site, profile and MACs as given.
func validatePlacement(site, profile string, macs []string) error {
	if site != "" {
		if err := api.ValidateRef("site", site); err != nil {
			return err
		}
	}
	if profile != "" && !driverRE.MatchString(profile) {
		return api.InvalidField("profile", "%q is not a profile name (profiles.list)", profile)
	}
	if len(macs) > 64 {
		return api.InvalidField("macs", "at most 64 MAC addresses")
	}
	for _, m := range macs {
		if !siteapi.ValidMAC(m) {
			return api.InvalidField("macs", "%q is not a MAC address (aa:bb:cc:dd:ee:ff, lowercase)", m)
		}
	}
	return nil
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
	ID        string `json:"id"`
	TenantID  string `json:"tenantId"`
	Name      string `json:"name"`
	URL       string `json:"url"`
	Format    string `json:"format"` // raw, qcow2 or tar
	SizeBytes int64  `json:"sizeBytes"`
	SHA256    string `json:"sha256"`
	// KernelURL, InitrdURL and Cmdline, when set, boot the written image in place from the
	// ramdisk (kexec), with Cmdline (its root, its console) and what the deployed system needs
	// to join; without them the machine reboots into its disk.
	KernelURL string `json:"kernelUrl,omitempty"`
	InitrdURL string `json:"initrdUrl,omitempty"`
	Cmdline   string `json:"cmdline,omitempty"`
	// PullTokenSet says the image is fetched with a pull token, which no answer shows.
	PullTokenSet bool      `json:"pullTokenSet,omitempty"`
	CreatedBy    string    `json:"createdBy"`
	CreatedAt    time.Time `json:"createdAt"`
}

// RegisterImage is the input of images.register.
type RegisterImage struct {
	TenantID  string `json:"tenantId,omitempty"`
	Name      string `json:"name"`
	URL       string `json:"url"`
	Format    string `json:"format"`
	SizeBytes int64  `json:"sizeBytes" input:"int8"`
	SHA256    string `json:"sha256"`
	KernelURL string `json:"kernelUrl,omitempty"`
	InitrdURL string `json:"initrdUrl,omitempty"`
	Cmdline   string `json:"cmdline,omitempty"`
	// PullToken, if the image's URL needs one, is sent as "Authorization: Bearer <token>" by the
	// site agents that fetch it, and by nothing else: write-only, stored sealed.
	PullToken string `json:"pullToken,omitempty"`
}

func httpURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "https" || u.Scheme == "http") && u.Host != "" && len(s) <= 2048
}

var sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Validate implements the input check.
func (in RegisterImage) Validate() error {
	if err := api.ValidateName("name", in.Name); err != nil {
		return err
	}
	if !httpURL(in.URL) {
		return api.InvalidField("url", "%q is not an http or https URL", in.URL)
	}
	for field, u := range map[string]string{"kernelUrl": in.KernelURL, "initrdUrl": in.InitrdURL} {
		if u != "" && !httpURL(u) {
			return api.InvalidField(field, "%q is not an http or https URL", u)
		}
	}
	if in.InitrdURL != "" && in.KernelURL == "" {
		return api.InvalidField("kernelUrl", "an initrd needs its kernel")
	}
	if err := api.ValidateText("cmdline", in.Cmdline, 1024); err != nil {
		return err
	}
	if strings.ContainsFunc(in.Cmdline, func(r rune) bool { return r < ' ' }) {
		return api.InvalidField("cmdline", "must be one line of printable text")
	}
	if len(in.PullToken) > 4096 || strings.ContainsFunc(in.PullToken, func(r rune) bool { return r <= ' ' || r > '~' }) {
		return api.InvalidField("pullToken", "must be at most 4096 printable ASCII characters without spaces")
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
