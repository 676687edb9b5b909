//go:build cgo

package hardware_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"

	"github.com/better-compute/compute/bcd/internal/hardware"
	"github.com/better-compute/compute/bcd/internal/hardware/nvmltest"
)

func openMIG(t *testing.T, m *nvmltest.Machine) *hardware.NVML {
	t.Helper()
	g, err := hardware.OpenNVML(m)
	if err != nil {
		t.Fatal(err)
	}
	n, ok := g.(*hardware.NVML)
	if !ok {
		t.Fatalf("OpenNVML gave %T", g)
	}
	t.Cleanup(n.Close)
	return n
}

// TestNVMLMIGInstances drives NVML's MIG calls through go-nvml's mock of a DGX H100 (with what
// nvmltest fills in): the profiles and their placements as NVML lists them, an instance made at
// the start asked for with its MIG device's UUID, refusals of a profile the GPU lacks, a start
// the profile may not take and an overlap, and destruction.
func TestNVMLMIGInstances(t *testing.T) {
	m := nvmltest.New(dgxh100.New())
	g := openMIG(t, m)
	st, err := g.MIGState(0)
	if err != nil || !st.Capable || st.Enabled || len(st.Instances) != 0 {
		t.Fatalf("a fresh GPU: %+v, %v", st, err)
	}
	p, ok := st.Profile("3g.40gb")
	if !ok || len(p.Starts) != 2 || p.Starts[0] != 0 || p.Starts[1] != 4 {
		t.Fatalf("3g.40gb = %+v (%v); profiles %s", p, ok, st.ProfileNames())
	}
	for _, name := range []string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "4g.40gb", "7g.80gb"} {
		if _, ok := st.Profile(name); !ok {
			t.Errorf("no profile %s among %s", name, st.ProfileNames())
		}
	}
	if _, err := g.CreateMIGInstance(0, "3g.40gb", 4); err == nil {
		t.Fatal("an instance was made outside MIG mode")
	}
	if err := g.SetMIGMode(0, true); err != nil {
		t.Fatal(err)
	}
	in, err := g.CreateMIGInstance(0, "3g.40gb", 4)
	if err != nil {
		t.Fatal(err)
	}
	if in.GPU != 0 || in.Profile != "3g.40gb" || in.Start != 4 || in.CI < 0 || !in.Usable() || !strings.HasPrefix(in.UUID, "MIG-") {
		t.Fatalf("made %+v", in)
	}
	st, _ = g.MIGState(0)
	if len(st.Instances) != 1 || st.Instances[0] != in {
		t.Fatalf("after the make, NVML lists %+v, want %+v", st.Instances, in)
	}
	if _, err := g.CreateMIGInstance(0, "3g.71gb", 0); !errors.Is(err, hardware.ErrNoMIGProfile) || !strings.Contains(err.Error(), "3g.40gb") {
		t.Fatalf("a profile an H100 lacks: %v", err)
	}
	if _, err := g.CreateMIGInstance(0, "3g.40gb", 2); !errors.Is(err, hardware.ErrMIGPlacement) {
		t.Fatalf("3g.40gb at 2: %v", err)
	}
	if _, err := g.CreateMIGInstance(0, "1g.10gb", 5); err == nil || !strings.Contains(err.Error(), "INSUFFICIENT_RESOURCES") {
		t.Fatalf("1g.10gb over the 3g.40gb at 4: %v", err)
	}
	if st, _ := g.MIGState(0); len(st.Instances) != 1 {
		t.Fatalf("a refused make left %+v", st.Instances)
	}
	if err := g.SetMIGMode(0, false); err == nil {
		t.Fatal("MIG mode was disabled with an instance in it")
	}
	if err := g.DestroyMIGInstance(0, in.GI); err != nil {
		t.Fatal(err)
	}
	if st, _ := g.MIGState(0); len(st.Instances) != 0 {
		t.Fatalf("after the destroy: %+v", st.Instances)
	}
	if err := g.SetMIGMode(0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := g.MIGState(8); err == nil {
		t.Fatal("GPU 8 of 8 was read")
	}
}

// TestNVMLMIGModeWaitsForAReset: where the mode change waits for a GPU reset, SetMIGMode says so
// (ErrMIGResetRequired), the state shows it pending, and the reset applies it.
func TestNVMLMIGModeWaitsForAReset(t *testing.T) {
	m := nvmltest.New(dgxh100.New())
	m.ResetRequired = true
	g := openMIG(t, m)
	err := g.SetMIGMode(3, true)
	if !errors.Is(err, hardware.ErrMIGResetRequired) || !strings.Contains(err.Error(), "GPU 3") || !strings.Contains(err.Error(), "RESET_REQUIRED") {
		t.Fatalf("a change waiting for a reset: %v", err)
	}
	if st, _ := g.MIGState(3); st.Enabled || !st.PendingEnabled {
		t.Fatalf("pending: %+v", st)
	}
	m.Reset(3)
	if st, _ := g.MIGState(3); !st.Enabled || !st.PendingEnabled {
		t.Fatalf("after the reset: %+v", st)
	}
}
