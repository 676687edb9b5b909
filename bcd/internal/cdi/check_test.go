package cdi_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/bcd/internal/cdi"
)

// TestSpecPolicyAcceptsWhatBCDWritesOnly: the specs a Converger writes (whole GPUs with a
// cpuset and memory hook, a MIG slice with its capability devices, a time-slice share) pass the
// policy a root helper checks them against; the same specs with a device file, an environment
// variable, a hook or a field bcd does not write are refused.
func TestSpecPolicyAcceptsWhatBCDWritesOnly(t *testing.T) {
	dir := t.TempDir()
	minors := filepath.Join(t.TempDir(), "mig-minors")
	if err := os.WriteFile(minors, []byte("gpu2/gi1/access 21\ngpu2/gi1/ci0/access 22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, m := fakeMIG(t, 3)
	c := &cdi.Converger{Dir: dir, Devices: gpus("GPU-a", "GPU-b", "GPU-c"), MIG: m, MIGMinors: minors, Hook: "/usr/local/bin/bcd", Logger: quiet}
	ds := &agentv1.DesiredState{Generation: 1, Holds: []*agentv1.DeviceHold{
		{Holder: "r1", Gpus: []*agentv1.HeldGPU{{Index: 0, Uuid: "GPU-a", Share: -1}}, Cpuset: "0-7,16", MemoryGib: 64},
		{Holder: "r2", Gpus: []*agentv1.HeldGPU{{Index: 2, Uuid: "GPU-c", MigProfile: "3g.40gb", MigStart: 4, Share: -1}}},
		{Holder: "r3", Gpus: []*agentv1.HeldGPU{{Index: 1, Uuid: "GPU-b", Share: 2}}},
	}, Gpus: []*agentv1.GPUSetting{{Index: 2, Uuid: "GPU-c", Mode: "mig"}, {Index: 1, Uuid: "GPU-b", Mode: "timeslice", Shares: 4}}}
	if err := c.Apply(context.Background(), ds); err != nil {
		t.Fatal(err)
	}
	policy := cdi.SpecPolicy{Hook: "/usr/local/bin/bcd"}
	specs := map[string]string{}
	for _, h := range []string{"r1", "r2", "r3"} {
		b, err := os.ReadFile(filepath.Join(dir, cdi.SpecName(h)))
		if err != nil {
			t.Fatal(err)
		}
		specs[h] = string(b)
		if err := policy.Check(h, b); err != nil {
			t.Errorf("the spec bcd wrote for %s is refused: %v\n%s", h, err, b)
		}
	}
	if !strings.Contains(specs["r1"], "cgroup-hook") || !strings.Contains(specs["r2"], "nvidia-cap21") {
		t.Fatalf("the specs lack what this test means to check:\n%s\n%s", specs["r1"], specs["r2"])
	}
	for _, bad := range []struct{ what, holder, spec string }{
		{"another holder's spec", "r9", specs["r1"]},
		{"a disk for the container", "r1", strings.Replace(specs["r1"], `/dev/nvidia0"`, `/dev/sda"`, 1)},
		{"a device outside /dev", "r1", strings.Replace(specs["r1"], `/dev/nvidia0"`, `/dev/../etc/nvidia0"`, 1)},
		{"a control device that is not NVIDIA's", "r1", strings.Replace(specs["r1"], `/dev/nvidiactl"`, `/dev/mem"`, 1)},
		{"another binary as the hook", "r1", strings.Replace(specs["r1"], `/usr/local/bin/bcd"`, `/bin/sh"`, 1)},
		{"the hook with another command", "r1", strings.Replace(specs["r1"], `"cgroup-hook"`, `"ramdisk"`, 1)},
		{"the hook for another holder", "r1", regexp.MustCompile(`("--holder",\s*)"r1"`).ReplaceAllString(specs["r1"], `$1"r2"`)},
		{"an environment variable bcd does not set", "r2", strings.Replace(specs["r2"], `"NVIDIA_VISIBLE_DEVICES=`, `"LD_PRELOAD=/tmp/x.so","NVIDIA_VISIBLE_DEVICES=`, 1)},
		{"a field bcd does not write", "r3", strings.Replace(specs["r3"], `"cdiVersion"`, `"mounts": [], "cdiVersion"`, 1)},
		{"another kind", "r3", strings.Replace(specs["r3"], cdi.Kind, "nvidia.com/gpu", 1)},
		{"a holder that names a path", "../r3", specs["r3"]},
	} {
		if bad.spec == specs[bad.holder] && bad.holder != "r9" && bad.holder != "../r3" {
			t.Fatalf("%s: the replacement did not apply", bad.what)
		}
		if err := policy.Check(bad.holder, []byte(bad.spec)); err == nil {
			t.Errorf("%s was accepted", bad.what)
		}
	}
	if err := (cdi.SpecPolicy{}).Check("r1", []byte(specs["r1"])); err == nil {
		t.Error("a hook was accepted by a policy that allows none")
	}
}
