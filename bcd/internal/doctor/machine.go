package doctor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/bcd/internal/cgroup"
	"github.com/better-compute/compute/bcd/internal/hardware"
)

// MIGGPU is what the mig check read of one GPU.
type MIGGPU struct {
	Index          int           `json:"index"`
	UUID           string        `json:"uuid"`
	Capable        bool          `json:"capable"`
	Enabled        bool          `json:"enabled"`
	PendingEnabled bool          `json:"pendingEnabled"`
	Instances      []MIGInstance `json:"instances"`
	Error          string        `json:"error,omitempty"`
}

// MIGInstance is one MIG instance the mig check found.
type MIGInstance struct {
	Profile string `json:"profile"`
	Start   int    `json:"start"`
	GI      int    `json:"gi"`
	CI      int    `json:"ci"`
	UUID    string `json:"uuid,omitempty"`
}

// Cgroup is what the cgroup check read.
type Cgroup struct {
	Root           string   `json:"root"`
	V2             bool     `json:"v2"`
	Controllers    []string `json:"controllers"`
	SubtreeControl []string `json:"subtreeControl"`
}

// gpus is the nvml and mig checks, over the GPUs open opens.
func gpus(open func() (hardware.GPUs, error)) []Check {
	c := Check{Name: "nvml"}
	if open == nil {
		open = hardware.OpenSystemGPUs
	}
	g, err := open()
	if err != nil {
		c.Status, c.Detail, c.Fix = Fail, err.Error(), "check the NVIDIA driver (nvidia-smi should list the GPUs)"
		return []Check{c, {Name: "mig", Status: Skip, Detail: "NVML did not open"}}
	}
	if cl, ok := g.(interface{ Close() }); ok {
		defer cl.Close()
	}
	inv, why := g.Inventory()
	if len(inv) == 0 {
		c.Status, c.Detail, c.Fix = Warn, why, "install the NVIDIA driver on a GPU machine; without it the node offers CPUs and memory only"
		return []Check{c, {Name: "mig", Status: Skip, Detail: "no GPUs"}}
	}
	c.Status, c.Detail = OK, fmt.Sprintf("%d GPUs (%s)", len(inv), inv[0].GetName())
	m, ok := g.(hardware.MIG)
	if !ok {
		return []Check{c, {Name: "mig", Status: Skip, Detail: "these GPUs are not read through NVML"}}
	}
	return []Check{c, migCheck(m, inv)}
}

// migCheck reads each GPU's MIG mode and instances.
func migCheck(m hardware.MIG, inv []*agentv1.GPU) Check {
	c := Check{Name: "mig", Status: OK}
	var gpus []MIGGPU
	capable, enabled, instances := 0, 0, 0
	var problems []string
	for _, g := range inv {
		i := int(g.GetIndex())
		st, err := m.MIGState(i)
		r := MIGGPU{Index: i, UUID: g.GetUuid(), Capable: st.Capable, Enabled: st.Enabled, PendingEnabled: st.PendingEnabled, Instances: []MIGInstance{}}
		if err != nil {
			r.Error = err.Error()
			problems = append(problems, fmt.Sprintf("GPU %d: %v", i, err))
		}
		if st.Capable {
			capable++
		}
		if st.Enabled {
			enabled++
		}
		if st.Enabled != st.PendingEnabled {
			problems = append(problems, fmt.Sprintf("GPU %d: a MIG mode change waits for a GPU reset", i))
		}
		for _, in := range st.Instances {
			instances++
			r.Instances = append(r.Instances, MIGInstance{Profile: in.Profile, Start: in.Start, GI: in.GI, CI: in.CI, UUID: in.UUID})
			if !in.Usable() {
				problems = append(problems, fmt.Sprintf("GPU %d: %s is no MIG device (%d compute instances)", i, in, in.ComputeInstances))
			}
		}
		gpus = append(gpus, r)
	}
	c.Data = gpus
	c.Detail = fmt.Sprintf("%d of %d GPUs can do MIG, %d in MIG mode, %d MIG instances", capable, len(inv), enabled, instances)
	if len(problems) > 0 {
		c.Status = Warn
		c.Detail += "; " + strings.Join(problems, "; ")
		c.Fix = "a pending mode needs a GPU reset (the gpu.reset command, or nvidia-smi -r) or a reboot; bcd node destroys instances no hold names and makes the missing ones"
	}
	return c
}

// cgroupCheck says whether the hold's cpuset and memory can be enforced: cgroup v2 with the
// cpuset and memory controllers.
func cgroupCheck(t cgroup.Tree) Check {
	c := Check{Name: "cgroup"}
	root := t.Root
	if root == "" {
		root = cgroup.DefaultRoot
	}
	data := Cgroup{Root: root, Controllers: []string{}, SubtreeControl: []string{}}
	c.Data = &data
	ctls, err := t.Controllers()
	if err != nil {
		c.Status, c.Detail = Warn, err.Error()
		if errors.Is(err, cgroup.ErrV1) {
			c.Detail = "cgroup v1: " + root + " is not a cgroup v2 hierarchy"
		}
		c.Detail += "; a container given a hold with a cpuset or a memory limit will not start (bcd cgroup-hook refuses)"
		c.Fix = "boot with systemd.unified_cgroup_hierarchy=1 (cgroup v2), or give such holds to workloads that do not run through CDI"
		return c
	}
	data.V2, data.Controllers = true, ctls
	if b, err := os.ReadFile(filepath.Join(root, "cgroup.subtree_control")); err == nil {
		data.SubtreeControl = strings.Fields(string(b))
	}
	var missing []string
	for _, ctl := range []string{"cpuset", "memory"} {
		if !slices.Contains(data.Controllers, ctl) || !slices.Contains(data.SubtreeControl, ctl) {
			missing = append(missing, ctl)
		}
	}
	if len(missing) > 0 {
		c.Status = Warn
		c.Detail = fmt.Sprintf("cgroup v2 at %s, but %s not enabled for its children: bcd cgroup-hook refuses a container whose cgroup lacks them",
			root, strings.Join(missing, " and "))
		c.Fix = "enable them: echo '+cpuset +memory' > " + filepath.Join(root, "cgroup.subtree_control") + " (and in the slices your runtime's cgroups live in)"
		return c
	}
	c.Status, c.Detail = OK, "cgroup v2 at "+root+" with cpuset and memory: holds' cpusets and memory limits are enforced on containers"
	return c
}
