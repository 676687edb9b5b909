package ipmi_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/metal/ipmi"
	"github.com/better-compute/compute/metal/ipmi/ipmisim"
	"github.com/better-compute/compute/metal/power"
)

// waitState waits until the BMC reads the power as want: ipmi_sim carries out a cycle's "on" a
// second after its "off", and tells no one.
func waitState(t *testing.T, b power.BMC, want power.State) {
	t.Helper()
	computetest.Eventually(t, 10*time.Second, "the power to read "+string(want), func() bool {
		got, err := (ipmi.Driver{}).State(context.Background(), b)
		return err == nil && got == want
	})
}

// TestPowerBootAndLogThroughARealBMC drives OpenIPMI's simulator over IPMI 2.0: power on, off
// and cycle, the next boot device, the event log, and refusals.
func TestPowerBootAndLogThroughARealBMC(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, dir := ipmisim.Start(t)
	d := ipmi.Driver{}
	waitState(t, b, power.Off)
	if err := d.Set(ctx, b, power.ActionOn); err != nil {
		t.Fatal(err)
	}
	waitState(t, b, power.On)
	if err := d.Set(ctx, b, power.ActionCycle); err != nil {
		t.Fatal(err)
	}
	waitState(t, b, power.On)
	if err := d.Set(ctx, b, power.ActionOff); err != nil {
		t.Fatal(err)
	}
	waitState(t, b, power.Off)
	// What the machine was told, in order: on; the cycle's off and, a second later, on; off.
	if got, want := ipmisim.Log(t, dir), []string{"power 1", "power 0", "power 1", "power 0"}; !slices.Equal(got, want) {
		t.Errorf("the chassis was told %q, want %q", got, want)
	}

	if err := d.SetBootDevice(ctx, b, power.BootPXE, false); err != nil {
		t.Fatal(err)
	}
	if dev, err := d.BootDevice(ctx, b); err != nil || dev != power.BootPXE {
		t.Errorf("boot device = %q, %v; want pxe", dev, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "boot.state")); strings.TrimSpace(string(b)) != "pxe" {
		t.Errorf("the machine boots from %q next, want pxe", b)
	}
	if err := d.SetBootDevice(ctx, b, power.BootDisk, true); err != nil {
		t.Fatal(err)
	}
	if dev, err := d.BootDevice(ctx, b); err != nil || dev != power.BootDisk {
		t.Errorf("boot device = %q, %v; want disk", dev, err)
	}

	sel, err := d.SEL(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	if len(sel) != 1 || sel[0].Sensor != 0x30 || sel[0].SensorType == "" {
		t.Fatalf("SEL = %+v, want the one record the simulator was given, of sensor 0x30", sel)
	}
	sensors, err := d.Sensors(ctx, b)
	if err != nil {
		t.Fatalf("sensors: %v", err)
	}
	if len(sensors) != 1 || sensors[0].Name != "CPU1" || sensors[0].Number != 0x30 || sensors[0].Value != 57 {
		t.Errorf("sensors = %+v, want CPU1 (0x30) reading 57", sensors)
	}

	if err := d.Set(ctx, b, "explode"); err == nil {
		t.Error("an unknown power action was accepted")
	}
	if err := d.SetBootDevice(ctx, b, "floppy", false); err == nil {
		t.Error("an unknown boot device was accepted")
	}
	wrong := b
	wrong.Password = "guess"
	if _, err := d.State(ctx, wrong); err == nil {
		t.Error("a wrong password was let in")
	}
	if _, err := d.State(ctx, power.BMC{Address: "no-port", Username: "admin"}); err == nil {
		t.Error("an address without a port was accepted")
	}
}
