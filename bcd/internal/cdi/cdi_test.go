package cdi_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/bcd/internal/cdi"
)

func TestSpecsFollowTheHolds(t *testing.T) {
	dir := t.TempDir()
	c := &cdi.Converger{Dir: dir}
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
