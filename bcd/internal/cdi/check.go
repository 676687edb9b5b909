package cdi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
)

// SpecPolicy is what a spec may hold when a root helper writes it for an unprivileged node agent
// (bcd helper): what a Converger writes, and nothing else. A container runtime reads the spec as
// root, so a spec is a privilege: it names device files given to containers and a hook the
// runtime runs. The helper checks every spec against its policy before writing it.
type SpecPolicy struct {
	// DeviceRoot is where the GPUs' device files are; default "/dev".
	DeviceRoot string
	// Hook is the one binary a spec's hook may run (bcd, for its cgroup-hook); "" refuses hooks.
	Hook string
}

var (
	envRE    = regexp.MustCompile(`^(NVIDIA_VISIBLE_DEVICES|BETTER_COMPUTE_GPU_PARTS)=[A-Za-z0-9,:;=@.+-]*$`)
	digitsRE = regexp.MustCompile(`^[0-9]{1,6}$`)
)

// CheckHolder refuses a holder that cannot name a spec file.
func CheckHolder(holder string) error {
	if len(holder) > MaxHolderLength || !nameRE.MatchString(holder) {
		return fmt.Errorf("cdi: holder %q cannot name a CDI device (letters, digits, '_.:-', at most %d)", holder, MaxHolderLength)
	}
	return nil
}

// Check decodes b as holder's spec, refusing unknown fields, and refuses what a Converger would
// not have written: another kind or version, a device other than the holder's, device files
// other than NVIDIA's under DeviceRoot, environment other than the GPUs' visibility, a hook other
// than Hook's cgroup-hook for this holder.
func (p SpecPolicy) Check(holder string, b []byte) error {
	if err := CheckHolder(holder); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var s Spec
	if err := dec.Decode(&s); err != nil {
		return fmt.Errorf("cdi: the spec of %s is not a spec bcd writes: %w", holder, err)
	}
	if dec.More() {
		return fmt.Errorf("cdi: the spec of %s has data after it", holder)
	}
	root := p.DeviceRoot
	if root == "" {
		root = "/dev"
	}
	switch {
	case s.CDIVersion != Version || s.Kind != Kind:
		return fmt.Errorf("cdi: the spec of %s is %s %s, not %s %s", holder, s.Kind, s.CDIVersion, Kind, Version)
	case len(s.Devices) != 1 || s.Devices[0].Name != holder:
		return fmt.Errorf("cdi: the spec of %s must have one device, named %s", holder, holder)
	case len(s.ContainerEdits.Env) > 0 || len(s.ContainerEdits.Hooks) > 0:
		return fmt.Errorf("cdi: the spec of %s sets environment or hooks for every device", holder)
	}
	for k, v := range s.Annotations {
		ok := false
		switch k {
		case "better-compute.dev/holder":
			ok = v == holder
		case "better-compute.dev/cpuset":
			ok = len(v) <= 1024 && cpusetRE.MatchString(v)
		case "better-compute.dev/memory-gib":
			ok = digitsRE.MatchString(v)
		}
		if !ok {
			return fmt.Errorf("cdi: the spec of %s: annotation %s=%q is not one bcd writes", holder, k, v)
		}
	}
	control := []string{root + "/nvidiactl", root + "/nvidia-uvm", root + "/nvidia-uvm-tools"}
	for _, n := range s.ContainerEdits.DeviceNodes {
		if !slices.Contains(control, n.Path) {
			return fmt.Errorf("cdi: the spec of %s gives every device %q, not one of NVIDIA's control devices", holder, n.Path)
		}
	}
	gpu := regexp.MustCompile(`^` + regexp.QuoteMeta(root) + `/(nvidia[0-9]{1,3}|nvidia-caps/nvidia-cap[0-9]{1,6})$`)
	edits := s.Devices[0].ContainerEdits
	for _, n := range edits.DeviceNodes {
		if path.Clean(n.Path) != n.Path || !gpu.MatchString(n.Path) {
			return fmt.Errorf("cdi: the spec of %s gives %q, not a GPU's or a MIG capability's device under %s", holder, n.Path, root)
		}
	}
	for _, e := range edits.Env {
		if !envRE.MatchString(e) {
			return fmt.Errorf("cdi: the spec of %s sets %.60q, which bcd does not", holder, e)
		}
	}
	switch {
	case len(edits.Hooks) > 1:
		return fmt.Errorf("cdi: the spec of %s has %d hooks; bcd writes at most its cgroup hook", holder, len(edits.Hooks))
	case len(edits.Hooks) == 1:
		return p.checkHook(holder, edits.Hooks[0])
	}
	return nil
}

// checkHook refuses a hook that is not this bcd's cgroup-hook for holder.
func (p SpecPolicy) checkHook(holder string, h Hook) error {
	if p.Hook == "" || h.Path != p.Hook {
		return fmt.Errorf("cdi: the spec of %s runs %q as a hook; only %q's cgroup-hook may run", holder, h.Path, p.Hook)
	}
	if h.HookName != HookName || len(h.Env) > 0 || h.Timeout == nil || *h.Timeout != HookTimeout {
		return fmt.Errorf("cdi: the spec of %s has a hook at %s with environment or a timeout bcd does not write", holder, h.HookName)
	}
	want := []string{"bcd", "cgroup-hook", "--holder", holder}
	if len(h.Args) < len(want) || !slices.Equal(h.Args[:len(want)], want) {
		return fmt.Errorf("cdi: the spec of %s runs its hook with %q, not bcd cgroup-hook --holder %s", holder, strings.Join(h.Args, " "), holder)
	}
	rest := h.Args[len(want):]
	for len(rest) > 0 {
		if len(rest) < 2 {
			return fmt.Errorf("cdi: the spec of %s: hook flag %q has no value", holder, rest[0])
		}
		switch flag, v := rest[0], rest[1]; {
		case flag == "--cpuset" && len(v) <= 1024 && cpusetRE.MatchString(v):
		case flag == "--memory-gib" && digitsRE.MatchString(v):
		default:
			return fmt.Errorf("cdi: the spec of %s: hook flag %s %q is not one bcd writes", holder, flag, v)
		}
		rest = rest[2:]
	}
	return nil
}
