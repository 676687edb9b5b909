package power

import (
	"context"
	"fmt"
	"slices"
)

// Media is a driver that can mount an image in a machine's virtual CD (Redfish virtual media).
type Media interface {
	InsertMedia(ctx context.Context, b BMC, imageURL string) error
	EjectMedia(ctx context.Context, b BMC) error
}

// Op is one BMC operation of a sequence the metal module asks for: the same sequence runs in the
// control plane's worker (a machine with no site) or on the machine's site agent (bcd site),
// which reaches BMCs the control plane cannot.
type Op struct {
	Op         string     `json:"op"`                   // power, state, bootdev, media.insert, media.eject
	Action     Action     `json:"action,omitempty"`     // power
	Device     BootDevice `json:"device,omitempty"`     // bootdev
	Persistent bool       `json:"persistent,omitempty"` // bootdev
	URL        string     `json:"url,omitempty"`        // media.insert
}

// The operations.
const (
	OpPower       = "power"
	OpState       = "state"
	OpBootDevice  = "bootdev"
	OpMediaInsert = "media.insert"
	OpMediaEject  = "media.eject"
)

// Validate checks an operation's form.
func (o Op) Validate() error {
	switch o.Op {
	case OpPower:
		if !slices.Contains([]Action{ActionOn, ActionOff, ActionCycle, ActionReset, ActionSoft}, o.Action) {
			return fmt.Errorf("power: %q is not a power action", o.Action)
		}
	case OpBootDevice:
		if !slices.Contains([]BootDevice{BootPXE, BootDisk, BootCDROM, BootBIOS, BootNone}, o.Device) {
			return fmt.Errorf("power: %q is not a boot device", o.Device)
		}
	case OpMediaInsert:
		if o.URL == "" {
			return fmt.Errorf("power: media.insert needs the image's URL")
		}
	case OpState, OpMediaEject:
	default:
		return fmt.Errorf("power: %q is not a BMC operation", o.Op)
	}
	return nil
}

// Outcome is what a sequence of operations found: the power state, when an operation read it.
type Outcome struct {
	Power State `json:"power,omitempty"`
}

// Run carries out ops in order through d, stopping at the first that fails.
func Run(ctx context.Context, d Driver, b BMC, ops []Op) (Outcome, error) {
	var out Outcome
	for i, o := range ops {
		if err := o.Validate(); err != nil {
			return out, fmt.Errorf("operation %d: %w", i, err)
		}
		var err error
		switch o.Op {
		case OpPower:
			err = d.Set(ctx, b, o.Action)
		case OpState:
			out.Power, err = d.State(ctx, b)
		case OpBootDevice:
			err = d.SetBootDevice(ctx, b, o.Device, o.Persistent)
		case OpMediaInsert, OpMediaEject:
			m, ok := d.(Media)
			if !ok {
				return out, fmt.Errorf("operation %d: this BMC's driver has no virtual media", i)
			}
			if o.Op == OpMediaInsert {
				err = m.InsertMedia(ctx, b, o.URL)
			} else {
				err = m.EjectMedia(ctx, b)
			}
		}
		if err != nil {
			return out, fmt.Errorf("operation %d (%s): %w", i, o.Op, err)
		}
	}
	return out, nil
}
