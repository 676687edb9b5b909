//go:build cgo

package cdi_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/bcd/internal/cdi"
	"github.com/better-compute/compute/bcd/internal/hardware"
	"github.com/better-compute/compute/bcd/internal/hardware/nvmltest"
	"github.com/better-compute/compute/bcd/internal/mig"
)

// node is bcd's devices converger over NVML opened on machine, as bcd node wires it: what a
// restart of bcd makes anew while the GPUs keep their instances.
type node struct {
	gpus *hardware.NVML
	conv *cdi.Converger
}

func startNode(t *testing.T, machine *nvmltest.Machine, dir string) node {
	t.Helper()
	g, err := hardware.OpenNVML(machine)
	if err != nil {
		t.Fatal(err)
	}
	n := g.(*hardware.NVML)
	t.Cleanup(n.Close)
	inv, why := n.Inventory()
	if len(inv) != 8 {
		t.Fatalf("inventory: %d GPUs (%s)", len(inv), why)
	}
	m, err := mig.New(n, quiet)
	if err != nil {
		t.Fatal(err)
	}
	return node{gpus: n, conv: &cdi.Converger{Dir: dir, Devices: func() []*agentv1.GPU { return inv }, MIG: m, Logger: quiet}}
}

func visible(t *testing.T, dir, holder string) string {
	t.Helper()
	for _, e := range readSpec(t, dir, holder).Devices[0].ContainerEdits.Env {
		if v, ok := strings.CutPrefix(e, "NVIDIA_VISIBLE_DEVICES="); ok {
			return v
		}
	}
	return ""
}

// instanceAt is the UUID of the MIG device NVML lists at start on gpu ("" if none).
func instanceAt(t *testing.T, g *hardware.NVML, gpu int, profile string, start int) hardware.MIGInstance {
	t.Helper()
	st, err := g.MIGState(gpu)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range st.Instances {
		if in.Profile == profile && in.Start == start {
			return in
		}
	}
	return hardware.MIGInstance{}
}

// TestMIGOnMockNVML is the MIG half of issue 19 against go-nvml's mock of a DGX H100 (not a GPU;
// see nvmltest for what the mock does not do): slices made at the starts the holds name, their
// MIG devices' UUIDs in the specs; after a restart of bcd, what NVML reports is kept where a
// hold names it, an orphan destroyed and a missing slice made again; a release destroys the
// slice; a profile the GPU lacks is refused naming the GPU and the holder; mode whole disables
// MIG.
func TestMIGOnMockNVML(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	machine := nvmltest.New(dgxh100.New())
	n := startNode(t, machine, dir)
	inv, _ := n.gpus.Inventory()
	uuid := func(i int) string { return inv[i].GetUuid() }
	held := func(holder string, gpu int, profile string, start int) *agentv1.DeviceHold {
		g := &agentv1.HeldGPU{Index: int32(gpu), Uuid: uuid(gpu), MigProfile: profile, MigStart: int32(start), Share: -1}
		return &agentv1.DeviceHold{Holder: holder, Gpus: []*agentv1.HeldGPU{g}}
	}
	modes := func(m map[int]string) []*agentv1.GPUSetting {
		var out []*agentv1.GPUSetting
		for i := range 8 {
			mode := m[i]
			if mode == "" {
				mode = "whole"
			}
			out = append(out, &agentv1.GPUSetting{Index: int32(i), Uuid: uuid(i), Mode: mode})
		}
		return out
	}
	ds := &agentv1.DesiredState{Generation: 1, Gpus: modes(map[int]string{0: "mig", 1: "mig"}), Holds: []*agentv1.DeviceHold{
		held("r1", 0, "3g.40gb", 4),
		held("r2", 0, "1g.10gb", 0),
		held("r3", 2, "", 0),
	}}
	if err := n.conv.Apply(ctx, ds); err != nil {
		t.Fatal(err)
	}
	r1 := instanceAt(t, n.gpus, 0, "3g.40gb", 4)
	r2 := instanceAt(t, n.gpus, 0, "1g.10gb", 0)
	if !r1.Usable() || !r2.Usable() || visible(t, dir, "r1") != r1.UUID || visible(t, dir, "r2") != r2.UUID {
		t.Fatalf("r1 sees %q, NVML lists %+v; r2 sees %q, NVML lists %+v", visible(t, dir, "r1"), r1, visible(t, dir, "r2"), r2)
	}
	if visible(t, dir, "r3") != uuid(2) || strings.Contains(visible(t, dir, "r1"), uuid(0)) {
		t.Fatalf("r3 sees %q, r1 %q", visible(t, dir, "r3"), visible(t, dir, "r1"))
	}
	for gpu, want := range map[int]bool{0: true, 1: true, 2: false} {
		if st, _ := n.gpus.MIGState(gpu); st.Enabled != want {
			t.Fatalf("GPU %d MIG mode %v, want %v", gpu, st.Enabled, want)
		}
	}

	// bcd restarts. Meanwhile r2's slice was destroyed behind its back, and someone made a
	// slice on GPU 1, which no hold names.
	if err := n.gpus.DestroyMIGInstance(0, r2.GI); err != nil {
		t.Fatal(err)
	}
	orphan, err := n.gpus.CreateMIGInstance(1, "2g.20gb", 2)
	if err != nil {
		t.Fatal(err)
	}
	creates := machine.Calls("create")
	n = startNode(t, machine, dir)
	if err := n.conv.Apply(ctx, ds); err != nil {
		t.Fatal(err)
	}
	if got := instanceAt(t, n.gpus, 0, "3g.40gb", 4); got != r1 || visible(t, dir, "r1") != r1.UUID {
		t.Fatalf("after the restart r1's slice is %+v (spec %q), want it kept: %+v", got, visible(t, dir, "r1"), r1)
	}
	again := instanceAt(t, n.gpus, 0, "1g.10gb", 0)
	if !again.Usable() || again.UUID == r2.UUID || visible(t, dir, "r2") != again.UUID {
		t.Fatalf("r2's slice made again: %+v, spec %q (before %q)", again, visible(t, dir, "r2"), r2.UUID)
	}
	if machine.Calls("create") != creates+1 {
		t.Fatalf("the restart made %d GPU instances, want 1 (r2's)", machine.Calls("create")-creates)
	}
	if got := instanceAt(t, n.gpus, 1, orphan.Profile, orphan.Start); got.UUID != "" {
		t.Fatalf("the orphan on GPU 1 survived: %+v", got)
	}

	// r2 is released, and r4 asks for a profile an H100 does not have.
	ds = &agentv1.DesiredState{Generation: 2, Gpus: ds.Gpus, Holds: []*agentv1.DeviceHold{ds.Holds[0], held("r4", 0, "3g.71gb", 0), ds.Holds[2]}}
	err = n.conv.Apply(ctx, ds)
	if err == nil || !strings.Contains(err.Error(), "GPU 0 ("+uuid(0)+"): holder r4: no such MIG profile") || !strings.Contains(err.Error(), "3g.40gb") {
		t.Fatalf("a profile the GPU lacks: %v", err)
	}
	if holders, _ := cdi.Holders(dir); !slices.Equal(holders, []string{"r1", "r3"}) {
		t.Fatalf("specs for %v", holders)
	}
	if st, _ := n.gpus.MIGState(0); len(st.Instances) != 1 || st.Instances[0] != r1 {
		t.Fatalf("after r2's release GPU 0 has %+v", st.Instances)
	}

	// Everything released; GPU 0 back to whole: no instance and no MIG mode.
	if err := n.conv.Apply(ctx, &agentv1.DesiredState{Generation: 3, Gpus: modes(map[int]string{1: "mig"})}); err != nil {
		t.Fatal(err)
	}
	if st, _ := n.gpus.MIGState(0); st.Enabled || len(st.Instances) != 0 {
		t.Fatalf("GPU 0 after the switch to whole: %+v", st)
	}
	if holders, _ := cdi.Holders(dir); len(holders) != 0 {
		t.Fatalf("specs left: %v", holders)
	}
}

// TestMIGSliceOverAnOrphanOnMockNVML: an orphan in the way of a new slice is destroyed before
// the slice is made (NVML refuses overlapping instances).
func TestMIGSliceOverAnOrphanOnMockNVML(t *testing.T) {
	machine := nvmltest.New(dgxh100.New())
	n := startNode(t, machine, t.TempDir())
	if err := n.gpus.SetMIGMode(5, true); err != nil {
		t.Fatal(err)
	}
	if _, err := n.gpus.CreateMIGInstance(5, "1g.10gb", 5); err != nil {
		t.Fatal(err)
	}
	inv, _ := n.gpus.Inventory()
	ds := &agentv1.DesiredState{Gpus: []*agentv1.GPUSetting{{Index: 5, Uuid: inv[5].GetUuid(), Mode: "mig"}},
		Holds: []*agentv1.DeviceHold{{Holder: "big", Gpus: []*agentv1.HeldGPU{{Index: 5, Uuid: inv[5].GetUuid(), MigProfile: "3g.40gb", MigStart: 4, Share: -1}}}}}
	if err := n.conv.Apply(context.Background(), ds); err != nil {
		t.Fatal(err)
	}
	if st, _ := n.gpus.MIGState(5); len(st.Instances) != 1 || st.Instances[0].Profile != "3g.40gb" {
		t.Fatalf("GPU 5: %+v", st.Instances)
	}
}
