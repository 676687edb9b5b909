package metal_test

import (
	"context"
	"testing"

	"github.com/better-compute/compute/metal"
	"github.com/better-compute/compute/metal/ipmi"
	"github.com/better-compute/compute/metal/power"
	"github.com/better-compute/compute/metal/redfish"
	"github.com/better-compute/compute/modules"
)

// vendor is a host's own power driver.
type vendor struct{ power.Driver }

// TestPowerDriversAreRegisteredByName: the module registers IPMI and a host's drivers through
// the seam, and the lookup finds them, or says which is missing.
func TestPowerDriversAreRegisteredByName(t *testing.T) {
	t.Parallel()
	m, err := metal.New(metal.Options{Power: map[string]power.Driver{"acme": vendor{}}})
	if err != nil {
		t.Fatal(err)
	}
	reg := modules.NewRegistry()
	if err := reg.Add(m); err != nil {
		t.Fatal(err)
	}
	if p, err := metal.PowerDriver(reg, "ipmi"); err != nil || p != (ipmi.Driver{}) {
		t.Errorf("ipmi = %v, %v", p, err)
	}
	if _, err := metal.PowerDriver(reg, "acme"); err != nil {
		t.Errorf("acme: %v", err)
	}
	if p, err := metal.PowerDriver(reg, "redfish"); err != nil || p != (redfish.Driver{}) {
		t.Errorf("redfish = %v, %v", p, err)
	}
	if _, err := metal.PowerDriver(reg, "smash"); err == nil {
		t.Error("a driver nobody registered was found")
	}
	if _, err := metal.New(metal.Options{Power: map[string]power.Driver{"": vendor{}}}); err == nil {
		t.Error("a driver without a name was accepted")
	}
	if _, err := (ipmi.Driver{}).State(context.Background(), power.BMC{}); err == nil {
		t.Error("a BMC without an address was dialled")
	}
}
