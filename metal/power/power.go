// Package power is the contract of power drivers: the BMC protocols (IPMI, Redfish) that turn
// machines on and off, choose their next boot device and read their sensors and event log. The
// metal module registers them by name; metal/ipmi is one.
package power

import (
	"context"
	"errors"
	"net"
	"time"
)

// BMC is how a machine's baseboard management controller is reached. Password is a secret: a
// caller keeps it sealed and hands it to a driver only for the call.
type BMC struct {
	Address  string // host:port, e.g. 10.0.0.5:623
	Username string
	Password string
	// Dial, when set, opens every connection a driver makes to the BMC: the control plane's
	// outbound policy (netpolicy), which checks each address, dials the BMC of a machine with
	// no site. nil dials directly (a site agent, on its own site's network).
	Dial func(ctx context.Context, network, address string) (net.Conn, error) `json:"-"`
}

// Validate checks that a BMC can be dialled.
func (b BMC) Validate() error {
	if b.Address == "" {
		return errors.New("power: a BMC needs an address (host:port)")
	}
	if b.Username == "" {
		return errors.New("power: a BMC needs a user name")
	}
	return nil
}

// State is a machine's power as its BMC reports it.
type State string

// The power states.
const (
	On  State = "on"
	Off State = "off"
)

// Action is what a power driver is asked to do.
type Action string

// The power actions.
const (
	ActionOn    Action = "on"
	ActionOff   Action = "off"   // hard off
	ActionCycle Action = "cycle" // off, then on
	ActionReset Action = "reset" // a hard reset, power staying on
	ActionSoft  Action = "soft"  // ask the operating system to shut down (ACPI)
)

// BootDevice is where a machine boots from next.
type BootDevice string

// The boot devices.
const (
	BootPXE   BootDevice = "pxe"
	BootDisk  BootDevice = "disk"
	BootCDROM BootDevice = "cdrom"
	BootBIOS  BootDevice = "bios"
	BootNone  BootDevice = "none" // no override: the machine's own order
)

// Sensor is one reading of a BMC's sensors.
type Sensor struct {
	Number uint8
	Name   string
	Type   string  // e.g. Temperature, Fan, Processor
	Value  float64 // the reading, for an analog sensor
	Unit   string  // e.g. degrees C; empty for a discrete sensor
	Status string  // the BMC's status of the reading (ok, cr, nr, …)
}

// SELEntry is one record of a BMC's system event log.
type SELEntry struct {
	ID          uint16
	At          time.Time
	SensorType  string
	Sensor      uint8
	Description string
}

// Driver is a power driver: the BMC protocol (IPMI, Redfish) that turns machines on and off,
// chooses their next boot device and reads their health. Every call dials the BMC (through
// BMC.Dial when set); none keeps a session across calls. Its errors reach the machine's tenant
// (workflows.get): they summarise what the BMC answered (a status), never repeat it, and say
// what failed on the network (netpolicy.Describe) rather than the network's error, which may
// name an address the tenant must not learn.
type Driver interface {
	State(ctx context.Context, b BMC) (State, error)
	Set(ctx context.Context, b BMC, a Action) error
	// SetBootDevice chooses the next boot's device; persistent keeps it for every boot after.
	SetBootDevice(ctx context.Context, b BMC, d BootDevice, persistent bool) error
	BootDevice(ctx context.Context, b BMC) (BootDevice, error)
	Sensors(ctx context.Context, b BMC) ([]Sensor, error)
	SEL(ctx context.Context, b BMC) ([]SELEntry, error)
}
