package cdi_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/bcd/internal/cdi"
)

func TestSpecsFollowTheHolds(t *testing.T) {
	dir := t.TempDir()
	c := &cdi.Converger{Dir: dir, Devices: gpus("GPU-a", "GPU-b", "GPU-c")}
	ctx := context.Background()
	if err := os.WriteFile(filepath.Join(dir, "someone-else.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	ds := &agentv1.DesiredState{Generation: 3, Holds: []*agentv1.DeviceHold{
		{Holder: "r1", Gpus: []*agentv1.HeldGPU{{Index: 0, Uuid: "GPU-a", Share: -1}, {Index: 1, Uuid: "GPU-b", Share: -1}}, Cpuset: "0-7"},
		{Holder: "r2", Gpus: []*agentv1.HeldGPU{{Index: 2, Uuid: "GPU-c", MigProfile: "3g.40gb", MigStart: 4, Share: -1}}},
	}}
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
	c := &cdi.Converger{Dir: dir, Devices: gpus("GPU-a", "GPU-b")}
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
