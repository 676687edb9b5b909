// Package cdi is bcd's devices converger: for every holder of the node's desired state it keeps
// one Container Device Interface spec in the CDI spec directory, so that a container runtime given
// the device "better-compute.dev/gpu=<holder>" sees exactly the GPUs held, and nothing once the
// hold ends. Specs are written atomically (a temporary file renamed over the old one).
package cdi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	agentv1 "github.com/better-compute/compute/agent/v1"
)

// Kind is the CDI kind of the devices bcd writes.
const Kind = "better-compute.dev/gpu"

// Version is the CDI spec version written.
const Version = "0.6.0"

const prefix = "better-compute-"

// Spec is a CDI spec, the fields bcd writes.
type Spec struct {
	CDIVersion     string            `json:"cdiVersion"`
	Kind           string            `json:"kind"`
	Annotations    map[string]string `json:"annotations,omitempty"`
	Devices        []Device          `json:"devices"`
	ContainerEdits ContainerEdits    `json:"containerEdits"`
}

// Device is a named device of a spec.
type Device struct {
	Name           string         `json:"name"`
	ContainerEdits ContainerEdits `json:"containerEdits"`
}

// ContainerEdits are what a runtime changes in a container.
type ContainerEdits struct {
	Env         []string     `json:"env,omitempty"`
	DeviceNodes []DeviceNode `json:"deviceNodes,omitempty"`
}

// DeviceNode is a device file given to the container.
type DeviceNode struct {
	Path string `json:"path"`
}

// Converger writes CDI specs in Dir.
type Converger struct {
	Dir string
	// DeviceRoot is where the GPUs' device files are; default "/dev".
	DeviceRoot string
}

var nameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.:-]*$`)

// Apply implements nodeagent.Converger: a spec for each hold, none for anything else.
func (c *Converger) Apply(_ context.Context, ds *agentv1.DesiredState) error {
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return fmt.Errorf("cdi: spec directory: %w", err)
	}
	want := map[string]bool{}
	var errs []error
	for _, h := range ds.GetHolds() {
		if !nameRE.MatchString(h.GetHolder()) {
			errs = append(errs, fmt.Errorf("cdi: holder %q cannot name a CDI device", h.GetHolder()))
			continue
		}
		name := prefix + h.GetHolder() + ".json"
		want[name] = true
		b, err := json.MarshalIndent(c.spec(h), "", "  ")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := writeAtomic(filepath.Join(c.Dir, name), append(b, '\n')); err != nil {
			errs = append(errs, err)
		}
	}
	entries, err := os.ReadDir(c.Dir)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, e := range entries {
		n := e.Name()
		if strings.HasPrefix(n, prefix) && strings.HasSuffix(n, ".json") && !want[n] {
			if err := os.Remove(filepath.Join(c.Dir, n)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Holders lists the holders that have a spec in dir.
func Holders(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if n := e.Name(); strings.HasPrefix(n, prefix) && strings.HasSuffix(n, ".json") {
			out = append(out, strings.TrimSuffix(strings.TrimPrefix(n, prefix), ".json"))
		}
	}
	sort.Strings(out)
	return out, nil
}

func (c *Converger) spec(h *agentv1.DeviceHold) Spec {
	root := c.DeviceRoot
	if root == "" {
		root = "/dev"
	}
	var uuids []string
	var nodes []DeviceNode
	var parts []string
	for _, g := range h.GetGpus() {
		uuids = append(uuids, g.GetUuid())
		nodes = append(nodes, DeviceNode{Path: fmt.Sprintf("%s/nvidia%d", root, g.GetIndex())})
		switch {
		case g.GetMigProfile() != "":
			parts = append(parts, fmt.Sprintf("%s:mig=%s@%d", g.GetUuid(), g.GetMigProfile(), g.GetMigStart()))
		case g.GetShare() >= 0:
			parts = append(parts, fmt.Sprintf("%s:share=%d", g.GetUuid(), g.GetShare()))
		}
	}
	edits := ContainerEdits{DeviceNodes: nodes}
	if len(uuids) > 0 {
		edits.Env = append(edits.Env, "NVIDIA_VISIBLE_DEVICES="+strings.Join(uuids, ","))
	}
	if len(parts) > 0 {
		edits.Env = append(edits.Env, "BETTER_COMPUTE_GPU_PARTS="+strings.Join(parts, ";"))
	}
	s := Spec{
		CDIVersion: Version, Kind: Kind,
		Annotations: map[string]string{"better-compute.dev/holder": h.GetHolder()},
		Devices:     []Device{{Name: h.GetHolder(), ContainerEdits: edits}},
	}
	if h.GetCpuset() != "" {
		s.Annotations["better-compute.dev/cpuset"] = h.GetCpuset()
	}
	if h.GetMemoryGib() > 0 {
		s.Annotations["better-compute.dev/memory-gib"] = fmt.Sprint(h.GetMemoryGib())
	}
	if len(nodes) > 0 {
		// The control devices every CUDA process needs.
		s.ContainerEdits.DeviceNodes = []DeviceNode{{Path: root + "/nvidiactl"}, {Path: root + "/nvidia-uvm"}, {Path: root + "/nvidia-uvm-tools"}}
	}
	return s
}

// writeAtomic replaces path with b: a reader sees the old file or the new one, never half.
func writeAtomic(path string, b []byte) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, b) {
		return nil
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, 0o644)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("cdi: write %s: %w", path, err)
	}
	return nil
}
