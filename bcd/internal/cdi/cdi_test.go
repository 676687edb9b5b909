package cdi_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/bcd/internal/cdi"
	"github.com/better-compute/compute/bcd/internal/hardware"
	"github.com/better-compute/compute/bcd/internal/mig"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func fakeMIG(t *testing.T, n int) (*hardware.FakeMIG, *mig.Converger) {
	t.Helper()
	f := hardware.NewFakeMIG(n)
	c, err := mig.New(f, quiet)
	if err != nil {
		t.Fatal(err)
	}
	return f, c
}

func readSpec(t *testing.T, dir, holder string) cdi.Spec {
	t.Helper()
	var s cdi.Spec
	b, err := os.ReadFile(filepath.Join(dir, "better-compute-"+holder+".json"))
	if err != nil {
		t.Fatalf("the spec of %s: %v", holder, err)
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSpecsFollowTheHolds(t *testing.T) {
	dir := t.TempDir()
	_, m := fakeMIG(t, 3)
	c := &cdi.Converger{Dir: dir, Devices: gpus("GPU-a", "GPU-b", "GPU-c"), MIG: m, Logger: quiet}
	ctx := context.Background()
	if err := os.WriteFile(filepath.Join(dir, "someone-else.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	ds := &agentv1.DesiredState{Generation: 3, Holds: []*agentv1.DeviceHold{
		{Holder: "r1", Gpus: []*agentv1.HeldGPU{{Index: 0, Uuid: "GPU-a", Share: -1}, {Index: 1, Uuid: "GPU-b", Share: -1}}, Cpuset: "0-7"},
		{Holder: "r2", Gpus: []*agentv1.HeldGPU{{Index: 2, Uuid: "GPU-c", MigProfile: "3g.40gb", MigStart: 4, Share: -1}}},
	}, Gpus: []*agentv1.GPUSetting{{Index: 2, Uuid: "GPU-c", Mode: "mig"}}}
	if err := c.Apply(ctx, ds); err != nil {
		t.Fatal(err)
	}
	holders, _ := cdi.Holders(dir)
	if !slices.Equal(holders, []string{"r1", "r2"}) {
		t.Fatalf("holders %v", holders)
	}
	var s cdi.Spec
	b, _ := os.ReadFile(filepath.Join(dir, "better-compute-r1.json"))
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	d := s.Devices[0]
	if s.Kind != cdi.Kind || d.Name != "r1" || len(d.ContainerEdits.DeviceNodes) != 2 ||
		d.ContainerEdits.DeviceNodes[1].Path != "/dev/nvidia1" || !slices.Contains(d.ContainerEdits.Env, "NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b") ||
		s.Annotations["better-compute.dev/cpuset"] != "0-7" {
		t.Fatalf("spec of r1 = %+v", s)
	}
	// r2 holds a MIG slice: the container sees that MIG device, not its parent GPU.
	r2 := readSpec(t, dir, "r2").Devices[0].ContainerEdits
	if !slices.Contains(r2.Env, "NVIDIA_VISIBLE_DEVICES=MIG-fake-2-1") || !slices.Contains(r2.Env, "BETTER_COMPUTE_GPU_PARTS=GPU-c:mig=3g.40gb@4") ||
		len(r2.DeviceNodes) != 1 || r2.DeviceNodes[0].Path != "/dev/nvidia2" {
		t.Fatalf("spec of r2 = %+v", r2)
	}
	// The hold of r1 ends: its spec goes; r2's stays; what is not ours stays.
	ds.Holds = ds.Holds[1:]
	if err := c.Apply(ctx, ds); err != nil {
		t.Fatal(err)
	}
	holders, _ = cdi.Holders(dir)
	if !slices.Equal(holders, []string{"r2"}) {
		t.Fatalf("holders after r1 ended: %v", holders)
	}
	if _, err := os.Stat(filepath.Join(dir, "someone-else.json")); err != nil {
		t.Fatal("a spec that is not bcd's was removed")
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.Name()[0] == '.' {
			t.Fatalf("a temporary file was left behind: %s", e.Name())
		}
	}
	if err := c.Apply(ctx, &agentv1.DesiredState{Holds: []*agentv1.DeviceHold{{Holder: "bad/name"}}}); err == nil {
		t.Fatal("a holder that cannot name a CDI device was accepted")
	}
}

func gpus(uuids ...string) func() []*agentv1.GPU {
	var out []*agentv1.GPU
	for i, u := range uuids {
		out = append(out, &agentv1.GPU{Index: int32(i), Uuid: u})
	}
	return func() []*agentv1.GPU { return out }
}

// TestBadHoldsAreRefusedTheRestConverge: a hold naming a GPU the node does not have (a negative
// index, an index past the inventory, "all" or another GPU's UUID), a bad MIG profile or share,
// or a holder that cannot name a file gets no spec and an error; good holds still get theirs.
func TestBadHoldsAreRefusedTheRestConverge(t *testing.T) {
	dir := t.TempDir()
	c := &cdi.Converger{Dir: dir, Devices: gpus("GPU-a", "GPU-b"), Logger: quiet}
	good := &agentv1.DeviceHold{Holder: "good", Gpus: []*agentv1.HeldGPU{{Index: 1, Uuid: "GPU-b", Share: -1}}}
	bad := map[string]*agentv1.HeldGPU{
		"negative":  {Index: -1, Uuid: "GPU-a", Share: -1},
		"past":      {Index: 2, Uuid: "GPU-c", Share: -1},
		"all":       {Index: 0, Uuid: "all", Share: -1},
		"swapped":   {Index: 0, Uuid: "GPU-b", Share: -1},
		"mig":       {Index: 0, Uuid: "GPU-a", MigProfile: "1g.10gb;x=y", Share: -1},
		"migstart":  {Index: 0, Uuid: "GPU-a", MigProfile: "1g.10gb", MigStart: -3, Share: -1},
		"share":     {Index: 0, Uuid: "GPU-a", Share: 1000},
		"neg-share": {Index: 0, Uuid: "GPU-a", Share: -2},
	}
	ds := &agentv1.DesiredState{Holds: []*agentv1.DeviceHold{good,
		{Holder: "../escape", Gpus: []*agentv1.HeldGPU{{Index: 0, Uuid: "GPU-a", Share: -1}}},
		{Holder: "cpus", Cpuset: "0-3;rm"}}}
	for name, g := range bad {
		ds.Holds = append(ds.Holds, &agentv1.DeviceHold{Holder: name, Gpus: []*agentv1.HeldGPU{g}})
	}
	err := c.Apply(context.Background(), ds)
	if err == nil {
		t.Fatal("bad holds were accepted")
	}
	for name := range bad {
		if !strings.Contains(err.Error(), "holder "+name) {
			t.Errorf("the error does not report the hold of %s: %v", name, err)
		}
	}
	holders, _ := cdi.Holders(dir)
	if !slices.Equal(holders, []string{"good"}) {
		t.Fatalf("specs for %v, want only good", holders)
	}
}

// TestHookEnforcesCPUsAndMemory: a hold with a cpuset or memory gets the OCI hook that runs bcd
// cgroup-hook with them at createRuntime; one with neither, or a converger without a bcd to
// run, gets none.
func TestHookEnforcesCPUsAndMemory(t *testing.T) {
	dir := t.TempDir()
	c := &cdi.Converger{Dir: dir, Devices: gpus("GPU-a"), Hook: "/usr/local/bin/bcd", Logger: quiet}
	ds := &agentv1.DesiredState{Holds: []*agentv1.DeviceHold{
		{Holder: "both", Gpus: []*agentv1.HeldGPU{{Index: 0, Uuid: "GPU-a", Share: -1}}, Cpuset: "0-3,8", MemoryGib: 64},
		{Holder: "cpus", Cpuset: "4-7"},
		{Holder: "gpu", Gpus: []*agentv1.HeldGPU{{Index: 0, Uuid: "GPU-a", Share: -1}}},
	}}
	if err := c.Apply(context.Background(), ds); err != nil {
		t.Fatal(err)
	}
	hooks := readSpec(t, dir, "both").Devices[0].ContainerEdits.Hooks
	want := []string{"bcd", "cgroup-hook", "--holder", "both", "--cpuset", "0-3,8", "--memory-gib", "64"}
	if len(hooks) != 1 || hooks[0].HookName != "createRuntime" || hooks[0].Path != "/usr/local/bin/bcd" ||
		!slices.Equal(hooks[0].Args, want) || hooks[0].Timeout == nil || *hooks[0].Timeout != cdi.HookTimeout {
		t.Fatalf("hooks of both = %+v", hooks)
	}
	if h := readSpec(t, dir, "cpus").Devices[0].ContainerEdits.Hooks; len(h) != 1 || !slices.Equal(h[0].Args, []string{"bcd", "cgroup-hook", "--holder", "cpus", "--cpuset", "4-7"}) {
		t.Fatalf("hooks of cpus = %+v", h)
	}
	if h := readSpec(t, dir, "gpu").Devices[0].ContainerEdits.Hooks; len(h) != 0 {
		t.Fatalf("a hold without cpuset or memory got hooks %+v", h)
	}
	c.Hook = ""
	if err := c.Apply(context.Background(), ds); err != nil {
		t.Fatal(err)
	}
	if h := readSpec(t, dir, "both").Devices[0].ContainerEdits.Hooks; len(h) != 0 {
		t.Fatalf("without a bcd to run, hooks %+v", h)
	}
}

// TestMIGCapabilityDevices: a MIG device's spec names the capability devices of its GPU and
// compute instances, from the driver's mig-minors table.
func TestMIGCapabilityDevices(t *testing.T) {
	dir := t.TempDir()
	minors := filepath.Join(t.TempDir(), "mig-minors")
	// The fake's first instance is GPU instance 1, compute instance 0.
	if err := os.WriteFile(minors, []byte("config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngpu0/gi2/access 21\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	_, m := fakeMIG(t, 1)
	c := &cdi.Converger{Dir: dir, Devices: gpus("GPU-a"), MIG: m, MIGMinors: minors, Logger: quiet}
	if err := c.Apply(context.Background(), &agentv1.DesiredState{Holds: []*agentv1.DeviceHold{
		{Holder: "r", Gpus: []*agentv1.HeldGPU{{Index: 0, Uuid: "GPU-a", MigProfile: "1g.10gb", MigStart: 3, Share: -1}}}}}); err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, n := range readSpec(t, dir, "r").Devices[0].ContainerEdits.DeviceNodes {
		paths = append(paths, n.Path)
	}
	if !slices.Equal(paths, []string{"/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13"}) {
		t.Fatalf("device nodes %v", paths)
	}
}

// TestMIGHoldNeedsAMIGConverger: a node that makes no MIG slices (no NVML) refuses a hold of
// one, rather than give the whole GPU; its other holds converge.
func TestMIGHoldNeedsAMIGConverger(t *testing.T) {
	dir := t.TempDir()
	c := &cdi.Converger{Dir: dir, Devices: gpus("GPU-a", "GPU-b"), Logger: quiet}
	err := c.Apply(context.Background(), &agentv1.DesiredState{Holds: []*agentv1.DeviceHold{
		{Holder: "slice", Gpus: []*agentv1.HeldGPU{{Index: 1, Uuid: "GPU-b", MigProfile: "3g.40gb", MigStart: 0, Share: -1}}},
		{Holder: "whole", Gpus: []*agentv1.HeldGPU{{Index: 0, Uuid: "GPU-a", Share: -1}}},
	}, Gpus: []*agentv1.GPUSetting{{Index: 7, Uuid: "GPU-x", Mode: "mig"}}})
	if err == nil || !strings.Contains(err.Error(), "holder slice: gpus[0]: GPU 1 (GPU-b): a 3g.40gb slice at 0, but this node makes no MIG slices") ||
		!strings.Contains(err.Error(), "the mode of GPU 7") {
		t.Fatalf("err %v", err)
	}
	if holders, _ := cdi.Holders(dir); !slices.Equal(holders, []string{"whole"}) {
		t.Fatalf("specs for %v", holders)
	}
}
