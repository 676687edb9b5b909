package mig_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/bcd/internal/hardware"
	"github.com/better-compute/compute/bcd/internal/mig"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newConverger(t *testing.T, gpus hardware.MIG) *mig.Converger {
	t.Helper()
	c, err := mig.New(gpus, quiet)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func setting(index int, mode string) *agentv1.GPUSetting {
	return &agentv1.GPUSetting{Index: int32(index), Uuid: "GPU-" + string(rune('a'+index)), Mode: mode}
}

func slice(holder string, gpu int, profile string, start int) *agentv1.DeviceHold {
	return &agentv1.DeviceHold{Holder: holder, Gpus: []*agentv1.HeldGPU{
		{Index: int32(gpu), Uuid: "GPU-" + string(rune('a'+gpu)), MigProfile: profile, MigStart: int32(start), Share: -1}}}
}

func TestNewNeedsGPUs(t *testing.T) {
	if _, err := mig.New(nil, nil); err == nil {
		t.Fatal("a converger without GPUs was made")
	}
}

// TestSlicesFollowTheHolds: a hold's slice is made once and kept while held (the same MIG
// device), destroyed when released while the GPU stays in MIG mode, and mode whole then
// disables MIG.
func TestSlicesFollowTheHolds(t *testing.T) {
	ctx := context.Background()
	f := hardware.NewFakeMIG(2)
	c := newConverger(t, f)
	settings := []*agentv1.GPUSetting{setting(0, "mig"), setting(1, "whole")}
	holds := []*agentv1.DeviceHold{slice("r1", 0, "3g.40gb", 4), slice("r2", 0, "1g.10gb", 0)}
	res, err := c.Apply(ctx, settings, holds)
	if err != nil {
		t.Fatal(err)
	}
	r1 := res.Devices[mig.Key{GPU: 0, Profile: "3g.40gb", Start: 4}]
	r2 := res.Devices[mig.Key{GPU: 0, Profile: "1g.10gb", Start: 0}]
	if !strings.HasPrefix(r1.UUID, "MIG-") || !strings.HasPrefix(r2.UUID, "MIG-") || r1.UUID == r2.UUID || len(res.Refused) != 0 {
		t.Fatalf("devices %+v, refused %v", res.Devices, res.Refused)
	}
	if st, _ := f.MIGState(1); st.Enabled {
		t.Fatal("GPU 1, whole, was put in MIG mode")
	}
	again, err := c.Apply(ctx, settings, holds)
	if err != nil || again.Devices[mig.Key{GPU: 0, Profile: "3g.40gb", Start: 4}] != r1 || f.Calls("create") != 2 {
		t.Fatalf("a second apply: %+v, %v, %d creates", again.Devices, err, f.Calls("create"))
	}
	// r2 is released: its slice goes, r1's stays, MIG mode stays.
	if _, err := c.Apply(ctx, settings, holds[:1]); err != nil {
		t.Fatal(err)
	}
	st, _ := f.MIGState(0)
	if !st.Enabled || len(st.Instances) != 1 || st.Instances[0] != r1 {
		t.Fatalf("after r2's release: %+v", st)
	}
	// Everything released and the GPU back to whole: no instance, no MIG mode.
	if _, err := c.Apply(ctx, []*agentv1.GPUSetting{setting(0, "whole")}, nil); err != nil {
		t.Fatal(err)
	}
	if st, _ := f.MIGState(0); st.Enabled || len(st.Instances) != 0 {
		t.Fatalf("after the switch to whole: %+v", st)
	}
}

// TestModeChangeDestroysInstances: a GPU switched to whole or timeslice loses its instances,
// whoever made them, then MIG mode; a GPU without a setting and without a held slice is left
// alone; one without a setting whose slice a hold names is taken to be in mode mig.
func TestModeChangeDestroysInstances(t *testing.T) {
	ctx := context.Background()
	f := hardware.NewFakeMIG(3)
	for gpu := range 3 {
		if err := f.SetMIGMode(gpu, true); err != nil {
			t.Fatal(err)
		}
		if _, err := f.CreateMIGInstance(gpu, "2g.20gb", 2); err != nil {
			t.Fatal(err)
		}
	}
	c := newConverger(t, f)
	res, err := c.Apply(ctx, []*agentv1.GPUSetting{setting(0, "timeslice")}, []*agentv1.DeviceHold{slice("r", 2, "4g.40gb", 0)})
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := f.MIGState(0); st.Enabled || len(st.Instances) != 0 {
		t.Fatalf("GPU 0, timeslice: %+v", st)
	}
	if st, _ := f.MIGState(1); !st.Enabled || len(st.Instances) != 1 {
		t.Fatalf("GPU 1, of no setting and no hold, was touched: %+v", st)
	}
	st, _ := f.MIGState(2)
	if !st.Enabled || len(st.Instances) != 1 || st.Instances[0].Profile != "4g.40gb" || res.Devices[mig.Key{GPU: 2, Profile: "4g.40gb"}].UUID == "" {
		t.Fatalf("GPU 2, a held slice and no setting: %+v", st)
	}
}

// TestRefusedHoldsNameTheirGPUAndHolder: what cannot be made refuses its hold, with an error
// naming the GPU and the holder; the other holds of the GPU still get their slices.
func TestRefusedHoldsNameTheirGPUAndHolder(t *testing.T) {
	ctx := context.Background()
	f := hardware.NewFakeMIG(3)
	f.SetCapable(2, false)
	c := newConverger(t, f)
	settings := []*agentv1.GPUSetting{setting(0, "mig"), setting(1, "whole"), setting(2, "mig")}
	holds := []*agentv1.DeviceHold{
		slice("good", 0, "3g.40gb", 0),
		slice("noprofile", 0, "3g.71gb", 4),
		slice("badstart", 0, "3g.40gb", 2),
		slice("twice", 0, "3g.40gb", 0),
		slice("whole", 1, "1g.10gb", 0),
		slice("incapable", 2, "1g.10gb", 0),
	}
	res, err := c.Apply(ctx, settings, holds)
	if err == nil {
		t.Fatal("no error")
	}
	want := map[string]string{
		"noprofile": "GPU 0 (GPU-a): holder noprofile: no such MIG profile",
		"badstart":  "GPU 0 (GPU-a): holder badstart: the MIG profile cannot start there: 3g.40gb may start at [0 4], not 2",
		"twice":     "GPU 0 (GPU-a): holder twice: 3g.40gb at 0 is held by good too",
		"whole":     "GPU 1 (GPU-b): holder whole: the GPU is in mode whole, not mig",
		"incapable": "GPU 2 (GPU-c): holder incapable: no MIG slice can be made: the GPU cannot do MIG",
	}
	for holder, msg := range want {
		if res.Refused[holder] == nil || !strings.Contains(res.Refused[holder].Error(), msg) || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: refused with %v, want %q", holder, res.Refused[holder], msg)
		}
	}
	if len(res.Refused) != len(want) || res.Devices[mig.Key{GPU: 0, Profile: "3g.40gb", Start: 0}].UUID == "" {
		t.Fatalf("refused %v, devices %+v", res.Refused, res.Devices)
	}
	if !errors.Is(res.Refused["noprofile"], hardware.ErrNoMIGProfile) {
		t.Fatalf("not ErrNoMIGProfile: %v", res.Refused["noprofile"])
	}
}

// TestModeWaitingForAReset: a GPU whose MIG mode waits for a reset makes no slice, and each
// hold on it is refused, saying so.
func TestModeWaitingForAReset(t *testing.T) {
	f := hardware.NewFakeMIG(1)
	f.ResetRequired = true
	res, err := newConverger(t, f).Apply(context.Background(), []*agentv1.GPUSetting{setting(0, "mig")},
		[]*agentv1.DeviceHold{slice("r", 0, "7g.80gb", 0)})
	if !errors.Is(err, hardware.ErrMIGResetRequired) || !strings.Contains(err.Error(), "GPU 0 (GPU-a): holder r:") || res.Refused["r"] == nil {
		t.Fatalf("err %v, refused %v", err, res.Refused)
	}
	if f.Calls("create") != 0 {
		t.Fatal("a slice was made on a GPU not in MIG mode")
	}
}

// TestUnknownModeLeavesTheGPU: a mode bcd does not know changes nothing and says so.
func TestUnknownModeLeavesTheGPU(t *testing.T) {
	f := hardware.NewFakeMIG(1)
	_, err := newConverger(t, f).Apply(context.Background(), []*agentv1.GPUSetting{setting(0, "exclusive")}, nil)
	if err == nil || !strings.Contains(err.Error(), `GPU 0 (GPU-a): mode "exclusive"`) || f.Calls("mode") != 0 {
		t.Fatalf("err %v, %d mode changes", err, f.Calls("mode"))
	}
}
