// Package metal is the bare-metal module: what the control plane does with machines that are
// not (yet) nodes, through drivers registered by kind (power, boot, image) and composed by
// profiles. Machines are reached through their BMCs (IPMI through metal/ipmi, Redfish through
// metal/redfish; the contract is metal/power), by the site agent of their site (bcd site) or by
// the control plane itself; they PXE-boot into bcd ramdisk at their site, which reports them
// (join requests), wipes them and streams images to them (machines.deploy, machines.release,
// leases). The contract with bcd site and bcd ramdisk is metal/siteapi; docs/metal.md has it all.
package metal

import (
	"cmp"
	"fmt"
	"net/url"

	"github.com/better-compute/compute/metal/ipmi"
	"github.com/better-compute/compute/metal/power"
	"github.com/better-compute/compute/metal/redfish"
	"github.com/better-compute/compute/metal/siteapi"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/provision"
)

// DriverKindPower is the kind of drivers that implement power.Driver.
const DriverKindPower = "power"

// Options configure the module. Zero values mean the defaults.
type Options struct {
	// Power are the power drivers by name, beside the built-in ones a host adds its own with
	// (a vendor's protocol): the name is the profile's power driver.
	Power map[string]power.Driver
	// Drivers are more drivers of the other kinds (boot: a BootDriver; image: an ImageDriver),
	// and Profiles more compositions, beside the built-in pxe-ipmi, pxe-redfish and
	// vmedia-redfish.
	Drivers  []provision.Driver
	Profiles []provision.Profile
	// UnknownMachines is what a site does with a machine it does not know that PXE-boots:
	// siteapi.UnknownInspect (the default: boot the ramdisk, which reports it as a join
	// request) or siteapi.UnknownIgnore.
	UnknownMachines string
	// JoinURL is the control plane's URL the deployed systems join at (JoinService: the API's
	// base URL), given to them on their kernel command line. Deploys that join a pool need it.
	JoinURL string
	// RamdiskISO is the URL of the ramdisk as an ISO image, for virtual-media boot.
	RamdiskISO string
}

// Module is the metal module: metal.New(metal.Options{}) in compute.Options.Modules.
type Module struct {
	power      map[string]power.Driver
	drivers    []provision.Driver
	profiles   []provision.Profile
	unknown    string
	joinURL    string
	ramdiskISO string
	secrets    modules.SecretBox // the runtime's, from Initialize: the plan opens pull tokens
}

// New returns the module, with the power drivers "ipmi" (metal/ipmi) and "redfish"
// (metal/redfish, checking BMCs' certificates) registered unless opts names them itself, e.g.
// "redfish": redfish.Driver{Insecure: true} for BMCs with self-signed certificates.
func New(opts Options) (*Module, error) {
	drivers := map[string]power.Driver{"ipmi": ipmi.Driver{}, "redfish": redfish.Driver{}}
	for n, p := range opts.Power {
		if n == "" || p == nil {
			return nil, fmt.Errorf("metal: a power driver needs a name and an implementation (%q)", n)
		}
		drivers[n] = p
	}
	unknown := cmp.Or(opts.UnknownMachines, siteapi.UnknownInspect)
	if unknown != siteapi.UnknownInspect && unknown != siteapi.UnknownIgnore {
		return nil, fmt.Errorf("metal: UnknownMachines is %q: %s or %s", unknown, siteapi.UnknownInspect, siteapi.UnknownIgnore)
	}
	if opts.JoinURL != "" {
		if u, err := url.Parse(opts.JoinURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("metal: JoinURL %q is not an http(s) URL", opts.JoinURL)
		}
	}
	return &Module{power: drivers, drivers: opts.Drivers, profiles: append(builtinProfiles(), opts.Profiles...), unknown: unknown,
		joinURL: opts.JoinURL, ramdiskISO: opts.RamdiskISO}, nil
}

// Name implements modules.Module.
func (*Module) Name() string { return "metal" }

// Register implements modules.Module: the power drivers, by name, for the profiles that compose
// them; machines and images, and the power workflow.
func (m *Module) Register(r *modules.Registry) error {
	for name, p := range m.power {
		r.Driver(provision.Driver{Kind: DriverKindPower, Name: name, Value: p})
	}
	m.registerMachines(r)
	m.registerProfiles(r)
	m.registerSites(r)
	m.registerDeploys(r)
	m.registerBatches(r)
	m.registerLeases(r)
	return nil
}

// PowerDriver finds a registered power driver.
func PowerDriver(reg *modules.Registry, name string) (power.Driver, error) {
	d, ok := reg.LookupDriver(DriverKindPower, name)
	if !ok {
		return nil, fmt.Errorf("metal: no power driver %q is registered", name)
	}
	p, ok := d.Value.(power.Driver)
	if !ok {
		return nil, fmt.Errorf("metal: the power driver %q is a %T, not a power.Driver", name, d.Value)
	}
	return p, nil
}
