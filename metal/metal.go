// Package metal is the bare-metal module: what the control plane does with machines that are
// not (yet) nodes, through drivers registered by kind (power, boot, image). This first part is
// the power drivers it registers (IPMI through metal/ipmi, Redfish through metal/redfish; the
// contract is metal/power); sites,
// join requests, images, profiles and deploys are not built yet (docs/metal.md says what is).
package metal

import (
	"fmt"

	"github.com/better-compute/compute/metal/ipmi"
	"github.com/better-compute/compute/metal/power"
	"github.com/better-compute/compute/metal/redfish"
	"github.com/better-compute/compute/modules"
)

// DriverKindPower is the kind of drivers that implement power.Driver.
const DriverKindPower = "power"

// Options configure the module. Zero values mean the defaults.
type Options struct {
	// Power are the power drivers by name, beside the built-in ones a host adds its own with
	// (a vendor's protocol): the name is the profile's power driver.
	Power map[string]power.Driver
}

// Module is the metal module: metal.New(metal.Options{}) in compute.Options.Modules.
type Module struct{ power map[string]power.Driver }

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
	return &Module{power: drivers}, nil
}

// Name implements modules.Module.
func (*Module) Name() string { return "metal" }

// Register implements modules.Module: the power drivers, by name, for the profiles that compose
// them; machines and images, and the power workflow.
func (m *Module) Register(r *modules.Registry) error {
	for name, p := range m.power {
		r.Driver(modules.Driver{Kind: DriverKindPower, Name: name, Value: p})
	}
	m.registerMachines(r)
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
