package metal

import (
	"context"
	"fmt"
	"sort"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/metal/power"
	"github.com/better-compute/compute/metal/siteapi"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/provision"
)

// A profile composes one driver of each kind a provisioning path needs: power (how the BMC is
// spoken to), boot (how the machine is made to boot the ramdisk, and its disk after) and image
// (how an image reaches the disk). Drivers and profiles (provision.Driver, provision.Profile)
// are registered through the seam (modules.Registry.Driver, Profile): a host adds its own in
// metal.Options, no core edit.

// The kinds of driver a profile composes, besides DriverKindPower.
const (
	DriverKindBoot  = "boot"
	DriverKindImage = "image"
)

// BootDriver makes a machine boot its site's ramdisk: the BMC operations that do it (run by
// the site agent, or by the control plane for a machine without a site).
type BootDriver interface {
	// RamdiskOps boot the ramdisk now; ramdiskISO is the site's ramdisk as an ISO image, for
	// drivers that mount one ("" when the site serves none).
	RamdiskOps(ramdiskISO string) ([]power.Op, error)
}

// PXEBoot boots the ramdisk over the network: PXE for the next boot, then a cold start. The
// site's DHCP and iPXE do the rest; after a deploy the plan says BootDisk, and iPXE hands the
// machine to its disk.
type PXEBoot struct{}

// RamdiskOps implements BootDriver.
func (PXEBoot) RamdiskOps(string) ([]power.Op, error) {
	return []power.Op{{Op: power.OpBootDevice, Device: power.BootPXE}, {Op: power.OpPower, Action: power.ActionOff}, {Op: power.OpPower, Action: power.ActionOn}}, nil
}

// VirtualMediaBoot boots the ramdisk from an ISO mounted in the BMC's virtual CD (Redfish).
type VirtualMediaBoot struct{}

// RamdiskOps implements BootDriver.
func (VirtualMediaBoot) RamdiskOps(iso string) ([]power.Op, error) {
	if iso == "" {
		return nil, fmt.Errorf("virtual-media boot needs the site's ramdisk ISO (metal.Options.RamdiskISO)")
	}
	return []power.Op{{Op: power.OpMediaInsert, URL: iso}, {Op: power.OpBootDevice, Device: power.BootCDROM},
		{Op: power.OpPower, Action: power.ActionOff}, {Op: power.OpPower, Action: power.ActionOn}}, nil
}

// ImageDriver turns an image into the ramdisk's task that puts it on the disk.
type ImageDriver interface {
	// Formats are the image formats it writes.
	Formats() []string
	// Task is the deploy task of img, then followed by then.
	Task(id string, img Image, then siteapi.Task) siteapi.Task
}

// StreamImage has the ramdisk stream the image from its site's cache to the disk, verifying
// its SHA-256 on the way (bcd ramdisk). Raw images only, for now.
type StreamImage struct{}

// Formats implements ImageDriver.
func (StreamImage) Formats() []string { return []string{"raw"} }

// Task implements ImageDriver.
func (StreamImage) Task(id string, img Image, then siteapi.Task) siteapi.Task {
	then.ID, then.Kind = id, siteapi.TaskDeploy
	then.Image = &siteapi.Image{ID: img.ID, URL: img.URL, Format: img.Format, SizeBytes: img.SizeBytes, SHA256: img.SHA256}
	return then
}

// builtinProfiles are the profiles the module registers: PXE and a stream with either BMC
// protocol, and Redfish virtual media.
func builtinProfiles() []provision.Profile {
	return []provision.Profile{
		{Name: "pxe-ipmi", Drivers: map[string]string{DriverKindPower: "ipmi", DriverKindBoot: "pxe", DriverKindImage: "stream"}},
		{Name: "pxe-redfish", Drivers: map[string]string{DriverKindPower: "redfish", DriverKindBoot: "pxe", DriverKindImage: "stream"}},
		{Name: "vmedia-redfish", Drivers: map[string]string{DriverKindPower: "redfish", DriverKindBoot: "vmedia", DriverKindImage: "stream"}},
	}
}

// Profile is a profile as profiles.list shows it.
type Profile struct {
	Name    string            `json:"name"`
	Drivers map[string]string `json:"drivers"` // kind → driver
}

// ListProfiles is the input of profiles.list.
type ListProfiles struct {
	TenantID string `json:"tenantId,omitempty"`
}

// Validate implements the input check.
func (ListProfiles) Validate() error { return nil }

// ProfilesList lists the registered profiles.
var ProfilesList = api.NewMethod[ListProfiles, []Profile]("profiles", "list", false, ResourceMachine, "v0.4", "List the provisioning profiles: compositions of power, boot and image drivers.")

func (m *Module) registerProfiles(r *modules.Registry) {
	r.Driver(
		provision.Driver{Kind: DriverKindBoot, Name: "pxe", Value: BootDriver(PXEBoot{})},
		provision.Driver{Kind: DriverKindBoot, Name: "vmedia", Value: BootDriver(VirtualMediaBoot{})},
		provision.Driver{Kind: DriverKindImage, Name: "stream", Value: ImageDriver(StreamImage{})},
	)
	for _, d := range m.drivers {
		r.Driver(d)
	}
	r.Profile(m.profiles...)
	r.Actions(modules.ActionsFor(ProfilesList.Info())...)
	modules.Handle(r, ProfilesList, nil, func(_ context.Context, c *modules.Call, _ ListProfiles) ([]Profile, error) {
		out := []Profile{}
		for _, p := range m.profiles {
			out = append(out, Profile{Name: p.Name, Drivers: p.Drivers})
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
		return out, nil
	})
}

// composition is a profile's drivers, looked up.
type composition struct {
	name  string
	power power.Driver
	boot  BootDriver
	image ImageDriver
}

// compose looks up a profile's drivers.
func compose(reg *modules.Registry, profile string) (composition, error) {
	p, ok := reg.LookupProfile(profile)
	if !ok {
		return composition{}, fmt.Errorf("no profile %q is registered", profile)
	}
	c := composition{name: profile}
	var err error
	if c.power, err = PowerDriver(reg, p.Drivers[DriverKindPower]); err != nil {
		return c, err
	}
	d, ok := reg.LookupDriver(DriverKindBoot, p.Drivers[DriverKindBoot])
	if c.boot, _ = d.Value.(BootDriver); !ok || c.boot == nil {
		return c, fmt.Errorf("profile %s: boot driver %q is not a metal.BootDriver", profile, p.Drivers[DriverKindBoot])
	}
	d, ok = reg.LookupDriver(DriverKindImage, p.Drivers[DriverKindImage])
	if c.image, _ = d.Value.(ImageDriver); !ok || c.image == nil {
		return c, fmt.Errorf("profile %s: image driver %q is not a metal.ImageDriver", profile, p.Drivers[DriverKindImage])
	}
	return c, nil
}

// profileFor is the profile a machine is given: the one named, which must be registered and
// use the BMC's driver for power, or pxe-<driver>.
func profileFor(reg *modules.Registry, named, bmcDriver string) (string, error) {
	name := named
	if name == "" {
		name = "pxe-" + bmcDriver
	}
	p, ok := reg.LookupProfile(name)
	switch {
	case !ok && named == "":
		return "", api.InvalidField("profile", "there is no default profile for BMC driver %q (pxe-%s): name one (profiles.list)", bmcDriver, bmcDriver)
	case !ok:
		return "", api.InvalidField("profile", "no profile %q is registered (profiles.list)", named)
	case p.Drivers[DriverKindPower] != bmcDriver:
		return "", api.InvalidField("profile", "profile %s powers machines with %s, and this machine's BMC is %s", name, p.Drivers[DriverKindPower], bmcDriver)
	}
	return name, nil
}
