// Package redfish is the Redfish power driver, through github.com/stmcginnis/gofish: power,
// the next boot device, sensors, the system event log and virtual media, on the first computer
// system a BMC's service root lists. Its tests run against a Redfish service written for them
// from the DMTF schema of the calls used: no Redfish emulator is packaged for Debian.
package redfish

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/common"
	"github.com/stmcginnis/gofish/redfish"

	"github.com/better-compute/compute/metal/power"
	"github.com/better-compute/compute/netpolicy"
)

// Timeout bounds a call to a BMC.
const Timeout = 30 * time.Second

// Driver is the Redfish power driver. A BMC's Address is its service's URL
// (https://10.0.0.5). Its zero value checks the BMC's certificate against the system's roots.
type Driver struct {
	// Insecure skips the check of the BMC's certificate: most BMCs present a self-signed one,
	// and the site network is trusted. A host that pins them sets RootCAs instead.
	Insecure bool
	// RootCAs, when set, are the certificates BMCs' are checked against.
	RootCAs *x509.CertPool
}

var _ power.Driver = Driver{}

// session runs fn with the BMC's computer system, in a Redfish session it closes after.
func (d Driver) session(ctx context.Context, b power.BMC, fn func(*gofish.APIClient, *redfish.ComputerSystem) error) error {
	if err := b.Validate(); err != nil {
		return err
	}
	u, err := url.Parse(b.Address)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return fmt.Errorf("redfish: BMC address %q is not the service's URL (https://host)", b.Address)
	}
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	hc := &http.Client{Timeout: Timeout, Transport: &http.Transport{
		Proxy:               nil, // the BMC is dialled, never a proxy from the environment
		DialContext:         b.Dial,
		TLSClientConfig:     &tls.Config{InsecureSkipVerify: d.Insecure, RootCAs: d.RootCAs, MinVersion: tls.VersionTLS12}, //nolint:gosec // a choice the host makes, see Insecure
		TLSHandshakeTimeout: 10 * time.Second,
	}}
	c, err := gofish.ConnectContext(ctx, gofish.ClientConfig{Endpoint: u.Scheme + "://" + u.Host, Username: b.Username, Password: b.Password, HTTPClient: hc})
	if err != nil {
		return fmt.Errorf("redfish: connect to %s as %s: %w", b.Address, b.Username, public(err))
	}
	defer c.Logout()
	systems, err := c.Service.Systems()
	if err != nil {
		return fmt.Errorf("redfish: %s: list the systems: %w", b.Address, public(err))
	}
	if len(systems) == 0 {
		return fmt.Errorf("redfish: %s has no computer system", b.Address)
	}
	if err := fn(c, systems[0]); err != nil {
		return fmt.Errorf("redfish: %s: %w", b.Address, public(err))
	}
	return nil
}

// public is err as the machine's tenant may read it (power.Driver): an error answer of the BMC
// as its status, a network error as what failed; the whole stays in it for the operator
// (netpolicy.Detail).
func public(err error) error {
	var answer *common.Error
	var network *url.Error
	switch {
	case errors.As(err, &answer):
		return netpolicy.Opaque(fmt.Sprintf("the BMC answered HTTP %d", answer.HTTPReturnedStatusCode), err)
	case errors.As(err, &network), errors.As(err, new(*net.OpError)), errors.As(err, new(*netpolicy.RefusedError)):
		return netpolicy.Opaque("", err)
	}
	return err
}

// State implements power.Driver.
func (d Driver) State(ctx context.Context, b power.BMC) (power.State, error) {
	var s power.State
	err := d.session(ctx, b, func(_ *gofish.APIClient, sys *redfish.ComputerSystem) error {
		switch sys.PowerState {
		case redfish.OnPowerState, redfish.PoweringOffPowerState:
			s = power.On
		case redfish.OffPowerState, redfish.PoweringOnPowerState:
			s = power.Off
		default:
			return fmt.Errorf("the system's power state is %q", sys.PowerState)
		}
		return nil
	})
	return s, err
}

// resetTypes are the Redfish reset types of each action, best first: a service lists those it
// supports.
var resetTypes = map[power.Action][]redfish.ResetType{
	power.ActionOn:    {redfish.OnResetType, redfish.ForceOnResetType},
	power.ActionOff:   {redfish.ForceOffResetType},
	power.ActionCycle: {redfish.PowerCycleResetType, redfish.ForceRestartResetType},
	power.ActionReset: {redfish.ForceRestartResetType},
	power.ActionSoft:  {redfish.GracefulShutdownResetType},
}

// Set implements power.Driver.
func (d Driver) Set(ctx context.Context, b power.BMC, a power.Action) error {
	types, ok := resetTypes[a]
	if !ok {
		return fmt.Errorf("redfish: %q is not a power action: use on, off, cycle, reset or soft", a)
	}
	return d.session(ctx, b, func(_ *gofish.APIClient, sys *redfish.ComputerSystem) error {
		t := types[0]
		if len(sys.SupportedResetTypes) > 0 {
			i := slices.IndexFunc(types, func(t redfish.ResetType) bool { return slices.Contains(sys.SupportedResetTypes, t) })
			if i < 0 {
				return fmt.Errorf("the system supports none of the reset types of %q (%v); it supports %v", a, types, sys.SupportedResetTypes)
			}
			t = types[i]
		}
		return sys.Reset(t)
	})
}

var targets = map[power.BootDevice]redfish.BootSourceOverrideTarget{
	power.BootNone:  redfish.NoneBootSourceOverrideTarget,
	power.BootPXE:   redfish.PxeBootSourceOverrideTarget,
	power.BootDisk:  redfish.HddBootSourceOverrideTarget,
	power.BootCDROM: redfish.CdBootSourceOverrideTarget,
	power.BootBIOS:  redfish.BiosSetupBootSourceOverrideTarget,
}

// SetBootDevice implements power.Driver: the boot source override, once or continuous, in UEFI
// mode.
func (d Driver) SetBootDevice(ctx context.Context, b power.BMC, dev power.BootDevice, persistent bool) error {
	target, ok := targets[dev]
	if !ok {
		return fmt.Errorf("redfish: %q is not a boot device: use pxe, disk, cdrom, bios or none", dev)
	}
	enabled := redfish.OnceBootSourceOverrideEnabled
	switch {
	case dev == power.BootNone:
		enabled = redfish.DisabledBootSourceOverrideEnabled
	case persistent:
		enabled = redfish.ContinuousBootSourceOverrideEnabled
	}
	return d.session(ctx, b, func(_ *gofish.APIClient, sys *redfish.ComputerSystem) error {
		return sys.SetBoot(redfish.Boot{BootSourceOverrideTarget: target, BootSourceOverrideEnabled: enabled,
			BootSourceOverrideMode: redfish.UEFIBootSourceOverrideMode})
	})
}

// BootDevice implements power.Driver.
func (d Driver) BootDevice(ctx context.Context, b power.BMC) (power.BootDevice, error) {
	dev := power.BootNone
	err := d.session(ctx, b, func(_ *gofish.APIClient, sys *redfish.ComputerSystem) error {
		if sys.Boot.BootSourceOverrideEnabled == redfish.DisabledBootSourceOverrideEnabled || sys.Boot.BootSourceOverrideEnabled == "" {
			return nil
		}
		for d, t := range targets {
			if t == sys.Boot.BootSourceOverrideTarget {
				dev = d
				return nil
			}
		}
		return fmt.Errorf("the boot source override is %q, which the driver does not know", sys.Boot.BootSourceOverrideTarget)
	})
	return dev, err
}

// Sensors implements power.Driver: the sensors of every chassis.
func (d Driver) Sensors(ctx context.Context, b power.BMC) ([]power.Sensor, error) {
	var out []power.Sensor
	err := d.session(ctx, b, func(c *gofish.APIClient, _ *redfish.ComputerSystem) error {
		chassis, err := c.Service.Chassis()
		if err != nil {
			return err
		}
		for _, ch := range chassis {
			ss, err := ch.Sensors()
			if err != nil {
				return fmt.Errorf("chassis %s: sensors: %w", ch.ID, err)
			}
			for _, s := range ss {
				out = append(out, power.Sensor{Name: s.Name, Type: string(s.ReadingType), Value: float64(s.Reading),
					Unit: s.ReadingUnits, Status: string(s.Status.Health)})
			}
		}
		return nil
	})
	return out, err
}

// SEL implements power.Driver: the entries of the system's SEL log service (or its first).
func (d Driver) SEL(ctx context.Context, b power.BMC) ([]power.SELEntry, error) {
	var out []power.SELEntry
	err := d.session(ctx, b, func(_ *gofish.APIClient, sys *redfish.ComputerSystem) error {
		logs, err := sys.LogServices()
		if err != nil {
			return err
		}
		if len(logs) == 0 {
			return nil
		}
		log := logs[0]
		for _, l := range logs {
			if l.ID == "SEL" || l.LogEntryType == redfish.SELLogEntryTypes {
				log = l
			}
		}
		entries, err := log.Entries()
		if err != nil {
			return fmt.Errorf("log %s: %w", log.ID, err)
		}
		for i, e := range entries {
			at, _ := time.Parse(time.RFC3339, e.Created)
			out = append(out, power.SELEntry{ID: uint16(i + 1), At: at, SensorType: string(e.SensorType), Sensor: uint8(e.SensorNumber), Description: e.Message})
		}
		return nil
	})
	return out, err
}

// InsertMedia mounts the image at imageURL in the BMC's virtual CD (or the first virtual media
// that takes CDs), for a boot from it (SetBootDevice cdrom).
func (d Driver) InsertMedia(ctx context.Context, b power.BMC, imageURL string) error {
	return d.media(ctx, b, func(m *redfish.VirtualMedia) error { return m.InsertMedia(imageURL, true, true) })
}

// EjectMedia unmounts the virtual CD.
func (d Driver) EjectMedia(ctx context.Context, b power.BMC) error {
	return d.media(ctx, b, func(m *redfish.VirtualMedia) error { return m.EjectMedia() })
}

func (d Driver) media(ctx context.Context, b power.BMC, fn func(*redfish.VirtualMedia) error) error {
	return d.session(ctx, b, func(c *gofish.APIClient, _ *redfish.ComputerSystem) error {
		managers, err := c.Service.Managers()
		if err != nil {
			return err
		}
		for _, m := range managers {
			media, err := m.VirtualMedia()
			if err != nil {
				return fmt.Errorf("manager %s: virtual media: %w", m.ID, err)
			}
			for _, vm := range media {
				if slices.Contains(vm.MediaTypes, redfish.CDMediaType) || slices.Contains(vm.MediaTypes, redfish.DVDMediaType) {
					return fn(vm)
				}
			}
		}
		return errors.New("no manager has a virtual CD")
	})
}
