// Package ipmi is the IPMI power driver: IPMI 2.0 over the LAN (RMCP+, "lanplus") through
// github.com/bougou/go-ipmi, for power, the next boot device, sensors and the system event log.
// Its tests run against OpenIPMI's BMC simulator, ipmi_sim.
package ipmi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/bougou/go-ipmi/pkg/client"
	"github.com/bougou/go-ipmi/pkg/command/chassis"
	"github.com/bougou/go-ipmi/pkg/types"

	"github.com/better-compute/compute/metal/power"
	"github.com/better-compute/compute/netpolicy"
)

// Timeout bounds one exchange with a BMC (go-ipmi retries it twice).
const Timeout = 5 * time.Second

// Driver is the IPMI power driver. Its zero value is ready; every call opens a session of its
// own and closes it.
type Driver struct{}

var _ power.Driver = Driver{}

// session runs fn in an authenticated session with b.
func session(ctx context.Context, b power.BMC, fn func(*client.Client) error) error {
	if err := b.Validate(); err != nil {
		return err
	}
	host, portText, err := net.SplitHostPort(b.Address)
	if err != nil {
		return fmt.Errorf("ipmi: BMC address %q: %w", b.Address, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 1 || port > 65535 {
		return fmt.Errorf("ipmi: BMC address %q: the port is not a number from 1 to 65535", b.Address)
	}
	c, err := client.NewClient(host, port, b.Username, b.Password)
	if err != nil {
		return fmt.Errorf("ipmi: %w", err)
	}
	// RAKP-HMAC-SHA256 with AES-128 first, then the SHA-1 suite every BMC has; naming them spares
	// the discovery of cipher suites, which some BMCs (ipmi_sim) never answer.
	c.WithTimeout(Timeout).WithCipherSuiteID(types.CipherSuiteID17, types.CipherSuiteID3)
	if b.Dial != nil {
		c.WithUDPProxy(dialer{ctx, b.Dial})
	}
	if err := c.Connect(ctx); err != nil {
		return fmt.Errorf("ipmi: connect to %s as %s: %w", b.Address, b.Username, public(err))
	}
	defer c.Close(context.WithoutCancel(ctx))
	if err := fn(c); err != nil {
		return fmt.Errorf("ipmi: %s: %w", b.Address, public(err))
	}
	return nil
}

// dialer is power.BMC.Dial as go-ipmi's proxy.Dialer, which opens its UDP "connection".
type dialer struct {
	ctx  context.Context
	dial func(ctx context.Context, network, address string) (net.Conn, error)
}

func (d dialer) Dial(network, address string) (net.Conn, error) {
	return d.dial(d.ctx, network, address)
}

// public is err as the machine's tenant may read it (power.Driver): a network error as what
// failed (it may name the resolver's address), the whole staying in it for the operator
// (netpolicy.Detail). IPMI's own errors (completion codes, a refused session) are go-ipmi's
// descriptions of a binary answer, kept.
func public(err error) error {
	if errors.As(err, new(*net.OpError)) || errors.As(err, new(*net.DNSError)) || errors.As(err, new(*netpolicy.RefusedError)) {
		return netpolicy.Opaque("", err)
	}
	return err
}

// State implements power.Driver.
func (Driver) State(ctx context.Context, b power.BMC) (power.State, error) {
	var s power.State
	err := session(ctx, b, func(c *client.Client) error {
		st, err := c.GetChassisStatus(ctx)
		if err != nil {
			return err
		}
		s = power.Off
		if st.PowerIsOn {
			s = power.On
		}
		return nil
	})
	return s, err
}

var controls = map[power.Action]chassis.ChassisControl{
	power.ActionOn:    chassis.ChassisControlPowerUp,
	power.ActionOff:   chassis.ChassisControlPowerDown,
	power.ActionCycle: chassis.ChassisControlPowerCycle,
	power.ActionReset: chassis.ChassisControlHardReset,
	power.ActionSoft:  chassis.ChassisControlSoftShutdown,
}

// Set implements power.Driver.
func (Driver) Set(ctx context.Context, b power.BMC, a power.Action) error {
	control, ok := controls[a]
	if !ok {
		return fmt.Errorf("ipmi: %q is not a power action: use on, off, cycle, reset or soft", a)
	}
	return session(ctx, b, func(c *client.Client) error {
		_, err := c.ChassisControl(ctx, control)
		return err
	})
}

var devices = map[power.BootDevice]types.BootDeviceSelector{
	power.BootNone:  types.BootDeviceSelectorNoOverride,
	power.BootPXE:   types.BootDeviceSelectorForcePXE,
	power.BootDisk:  types.BootDeviceSelectorForceHardDrive,
	power.BootCDROM: types.BootDeviceSelectorForceCDROM,
	power.BootBIOS:  types.BootDeviceSelectorForceBIOSSetup,
}

// SetBootDevice implements power.Driver. Machines are booted the EFI way.
func (Driver) SetBootDevice(ctx context.Context, b power.BMC, d power.BootDevice, persistent bool) error {
	sel, ok := devices[d]
	if !ok {
		return fmt.Errorf("ipmi: %q is not a boot device: use pxe, disk, cdrom, bios or none", d)
	}
	return session(ctx, b, func(c *client.Client) error {
		return c.SetBootDevice(ctx, sel, types.BIOSBootTypeEFI, persistent)
	})
}

// BootDevice implements power.Driver: the override the boot flags hold. A BMC that clears the
// flags' valid bit after the boot they were for answers none; one that never sets it (ipmi_sim)
// is read by its device selector alone.
func (Driver) BootDevice(ctx context.Context, b power.BMC) (power.BootDevice, error) {
	dev := power.BootNone
	err := session(ctx, b, func(c *client.Client) error {
		flags := &types.BootOptionParam_BootFlags{}
		if err := c.GetSystemBootOptionsParamFor(ctx, flags); err != nil {
			return err
		}
		if !flags.BootFlagsValid && flags.BootDeviceSelector == types.BootDeviceSelectorNoOverride {
			return nil
		}
		for d, sel := range devices {
			if sel == flags.BootDeviceSelector {
				dev = d
				return nil
			}
		}
		return fmt.Errorf("boot flags name device selector %#x, which the driver does not know", uint8(flags.BootDeviceSelector))
	})
	return dev, err
}

// Sensors implements power.Driver.
func (Driver) Sensors(ctx context.Context, b power.BMC) ([]power.Sensor, error) {
	var out []power.Sensor
	err := session(ctx, b, func(c *client.Client) error {
		ss, err := c.GetSensors(ctx)
		if empty(err) {
			return nil // no sensor records
		}
		if err != nil {
			return err
		}
		for _, s := range ss {
			r := power.Sensor{Number: s.Number, Name: s.Name, Type: s.SensorType.String(), Status: s.Status()}
			if s.HasAnalogReading {
				r.Value, r.Unit = s.Value, s.SensorUnit.String()
			}
			out = append(out, r)
		}
		return nil
	})
	return out, err
}

// SEL implements power.Driver: every record of the system event log, oldest first.
func (Driver) SEL(ctx context.Context, b power.BMC) ([]power.SELEntry, error) {
	var out []power.SELEntry
	err := session(ctx, b, func(c *client.Client) error {
		sels, err := c.GetSELEntries(ctx, 0)
		if empty(err) {
			return nil // an empty log
		}
		if err != nil {
			return err
		}
		for _, s := range sels {
			e := power.SELEntry{ID: s.RecordID}
			if st := s.Standard; st != nil {
				e.At, e.SensorType, e.Sensor = st.Timestamp, st.SensorType.String(), uint8(st.SensorNumber)
				e.Description = st.EventString()
			}
			out = append(out, e)
		}
		return nil
	})
	return out, err
}

// empty reports whether err is a BMC's "requested data not present": what a repository without
// records (an empty SEL, no SDRs) answers for its first.
func empty(err error) bool {
	var re *types.ResponseError
	return errors.As(err, &re) && re.CompletionCode() == types.CodeRequestedDataNotPresent
}
