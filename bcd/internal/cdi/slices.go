package cdi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/bcd/internal/hardware"
	"github.com/better-compute/compute/bcd/internal/mig"
)

// cgroupHook is the OCI hook that enforces a hold's cpuset and memory, when it has either and
// the converger has a bcd to run.
func (c *Converger) cgroupHook(h *agentv1.DeviceHold) (Hook, bool) {
	if c.Hook == "" || (h.GetCpuset() == "" && h.GetMemoryGib() <= 0) {
		return Hook{}, false
	}
	args := []string{"bcd", "cgroup-hook", "--holder", h.GetHolder()}
	if h.GetCpuset() != "" {
		args = append(args, "--cpuset", h.GetCpuset())
	}
	if h.GetMemoryGib() > 0 {
		args = append(args, "--memory-gib", fmt.Sprint(h.GetMemoryGib()))
	}
	timeout := HookTimeout
	return Hook{HookName: HookName, Path: c.Hook, Args: args, Timeout: &timeout}, true
}

// migSlices runs the MIG converger over the GPU settings that name GPUs of this node and the
// holds that passed their checks, and refuses every hold whose slices it did not all make.
// Without a MIG converger a hold of a MIG slice is refused.
func (c *Converger) migSlices(ctx context.Context, ds *agentv1.DesiredState, gpus map[int32]string, holds []*agentv1.DeviceHold) (mig.Result, error) {
	var errs []error
	var settings []*agentv1.GPUSetting
	for _, s := range ds.GetGpus() {
		if uuid, ok := gpus[s.GetIndex()]; !ok || uuid != s.GetUuid() {
			errs = append(errs, fmt.Errorf("cdi: the mode of GPU %d (%q) names no GPU of this node: ignored", s.GetIndex(), s.GetUuid()))
			continue
		}
		settings = append(settings, s)
	}
	res := mig.Result{Devices: map[mig.Key]hardware.MIGInstance{}, Refused: map[string]error{}}
	if c.MIG != nil {
		var err error
		if res, err = c.MIG.Apply(ctx, settings, holds); err != nil {
			errs = append(errs, err)
		}
	}
	for _, h := range holds {
		if res.Refused[h.GetHolder()] != nil {
			continue
		}
		for i, g := range h.GetGpus() {
			k, ok := mig.KeyOf(g)
			if !ok || res.Devices[k].UUID != "" {
				continue
			}
			why := "this node makes no MIG slices (no NVML)"
			if c.MIG != nil {
				why = "the MIG converger made no MIG device of it"
			}
			err := fmt.Errorf("cdi: holder %s: gpus[%d]: GPU %d (%s): a %s slice at %d, but %s", h.GetHolder(), i, k.GPU, g.GetUuid(), k.Profile, k.Start, why)
			res.Refused[h.GetHolder()] = err
			errs = append(errs, err)
			break
		}
	}
	return res, errors.Join(errs...)
}

// readMIGMinors reads the driver's table of MIG capability minors ("gpu0/gi1/access 12"); a
// machine without it (no driver, no MIG) has none.
func readMIGMinors(path string) map[string]int {
	if path == "" {
		path = "/proc/driver/nvidia-caps/mig-minors"
	}
	out := map[string]int{}
	b, err := os.ReadFile(path)
	if err != nil {
		return out
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		if n, err := strconv.Atoi(f[1]); err == nil && n >= 0 {
			out[f[0]] = n
		}
	}
	return out
}
