// Package cdi is bcd's devices converger: for every holder of the node's desired state it keeps
// one Container Device Interface spec in the CDI spec directory, so that a container runtime given
// the device "better-compute.dev/gpu=<holder>" sees exactly the GPUs held (a MIG slice as its own
// MIG device, made by the MIG converger first), and nothing once the hold ends; and so that the
// hold's cpuset and memory are enforced on the container's cgroup by an OCI hook (bcd
// cgroup-hook). Specs are written atomically (a temporary file renamed over the old one).
package cdi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/bcd/internal/mig"
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
	Hooks       []Hook       `json:"hooks,omitempty"`
}

// Hook is an OCI hook a runtime runs for the container (CDI's containerEdits.hooks).
type Hook struct {
	HookName string   `json:"hookName"`
	Path     string   `json:"path"`
	Args     []string `json:"args,omitempty"`
	Env      []string `json:"env,omitempty"`
	Timeout  *int     `json:"timeout,omitempty"` // seconds
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
	// Devices returns the node's GPUs as its inventory reads them. A hold may name only these
	// (by index and UUID together); nil means the node has none.
	Devices func() []*agentv1.GPU
	// MIG sets the GPUs' MIG modes and makes the MIG slices holds name, before their specs are
	// written. Nil means this node makes none: a hold of a MIG slice is refused.
	MIG *mig.Converger
	// MIGMinors is the driver's table of MIG capability devices, which a container given a MIG
	// device needs too; default "/proc/driver/nvidia-caps/mig-minors". Where it does not exist
	// the specs name none.
	MIGMinors string
	// Hook is the path of the bcd binary whose cgroup-hook enforces a hold's cpuset and memory
	// on the container's cgroup (cgroup v2). "" means no hook: the cpuset and memory are only
	// annotations, and nothing enforces them.
	Hook string
	// Logger reports refused holds; default slog.Default().
	Logger *slog.Logger
	// Specs is where the spec files are written, listed and removed; nil means Dir itself. A
	// node agent that runs unprivileged writes through its root helper (bcd helper).
	Specs Specs
}

// Specs keeps the spec files of one directory, by file name (prefix + holder + ".json").
type Specs interface {
	Write(name string, b []byte) error
	Remove(name string) error
	List() ([]string, error)
}

// DirSpecs keeps spec files in a directory, each written atomically.
type DirSpecs string

// Write implements Specs.
func (d DirSpecs) Write(name string, b []byte) error {
	if err := os.MkdirAll(string(d), 0o755); err != nil {
		return fmt.Errorf("cdi: spec directory: %w", err)
	}
	return writeAtomic(filepath.Join(string(d), name), b)
}

// Remove implements Specs; a file that is not there is no error.
func (d DirSpecs) Remove(name string) error {
	if err := os.Remove(filepath.Join(string(d), name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// List implements Specs: the names of the files bcd wrote (prefix, .json); none when the
// directory does not exist.
func (d DirSpecs) List() ([]string, error) {
	entries, err := os.ReadDir(string(d))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if n := e.Name(); IsSpecName(n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// IsSpecName reports whether name is the name of a spec file bcd writes.
func IsSpecName(name string) bool {
	return strings.HasPrefix(name, prefix) && strings.HasSuffix(name, ".json") && !strings.ContainsRune(name, '/')
}

// SpecName is the file name of a holder's spec.
func SpecName(holder string) string { return prefix + holder + ".json" }

// HolderOf is the holder whose spec file name is, and whether it is one.
func HolderOf(name string) (string, bool) {
	if !IsSpecName(name) {
		return "", false
	}
	return strings.TrimSuffix(strings.TrimPrefix(name, prefix), ".json"), true
}

// HookName is the OCI stage at which the cgroup hook runs: createRuntime, in the runtime's
// namespaces once the container's cgroup exists and before its process starts. (createContainer
// and startContainer hooks run in the container's namespaces, where a cgroup namespace hides
// the container's cgroup path.)
const HookName = "createRuntime"

// HookTimeout is how long a runtime lets the cgroup hook run, in seconds.
const HookTimeout = 10

// MaxHolderLength bounds a holder's name, which becomes part of a file name.
const MaxHolderLength = 200

var (
	nameRE   = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.:-]*$`)
	migRE    = regexp.MustCompile(`^[0-9]+g\.[0-9]+gb(\+me|\+gfx|-me|\+me\.all)?$`)
	cpusetRE = regexp.MustCompile(`^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$`)
)

// checkHold refuses a hold whose holder cannot name a file, or that names a GPU the node does
// not have: an index out of range, a UUID that is not that GPU's (such as "all", which a
// runtime would read as every GPU), a MIG profile or share that is not one.
func checkHold(h *agentv1.DeviceHold, gpus map[int32]string) error {
	if len(h.GetHolder()) > MaxHolderLength || !nameRE.MatchString(h.GetHolder()) {
		return fmt.Errorf("cdi: holder %q cannot name a CDI device (letters, digits, '_.:-', at most %d)", h.GetHolder(), MaxHolderLength)
	}
	for i, g := range h.GetGpus() {
		uuid, ok := gpus[g.GetIndex()]
		switch {
		case !ok:
			return fmt.Errorf("cdi: holder %s: gpus[%d].index %d is not a GPU of this node", h.GetHolder(), i, g.GetIndex())
		case g.GetUuid() != uuid:
			return fmt.Errorf("cdi: holder %s: gpus[%d].uuid %q is not the UUID of GPU %d", h.GetHolder(), i, g.GetUuid(), g.GetIndex())
		case g.GetMigProfile() != "" && (!migRE.MatchString(g.GetMigProfile()) || g.GetMigStart() < 0 || g.GetMigStart() > 7):
			return fmt.Errorf("cdi: holder %s: gpus[%d]: MIG profile %q at %d is not one", h.GetHolder(), i, g.GetMigProfile(), g.GetMigStart())
		case g.GetShare() < -1 || g.GetShare() >= api.MaxTimeSliceShares:
			return fmt.Errorf("cdi: holder %s: gpus[%d].share %d is out of range", h.GetHolder(), i, g.GetShare())
		}
	}
	if h.GetCpuset() != "" && (len(h.GetCpuset()) > 1024 || !cpusetRE.MatchString(h.GetCpuset())) {
		return fmt.Errorf("cdi: holder %s: cpuset %q is not a CPU list", h.GetHolder(), h.GetCpuset())
	}
	return nil
}

func (c *Converger) known() map[int32]string {
	out := map[int32]string{}
	if c.Devices == nil {
		return out
	}
	for _, g := range c.Devices() {
		if g.GetIndex() >= 0 && g.GetUuid() != "" {
			out[g.GetIndex()] = g.GetUuid()
		}
	}
	return out
}

// Apply implements nodeagent.Converger: the GPUs' MIG modes and slices, then a spec for each
// hold, none for anything else.
func (c *Converger) Apply(ctx context.Context, ds *agentv1.DesiredState) error {
	specs := c.Specs
	if specs == nil {
		if err := os.MkdirAll(c.Dir, 0o755); err != nil {
			return fmt.Errorf("cdi: spec directory: %w", err)
		}
		specs = DirSpecs(c.Dir)
	}
	want := map[string]bool{}
	var errs []error
	gpus := c.known()
	log := c.Logger
	if log == nil {
		log = slog.Default()
	}
	var holds []*agentv1.DeviceHold
	for _, h := range ds.GetHolds() {
		if err := checkHold(h, gpus); err != nil {
			log.Warn("cdi: refused a device hold of the desired state; the others converge", "generation", ds.GetGeneration(), "error", err)
			errs = append(errs, err)
			continue
		}
		holds = append(holds, h)
	}
	slices, err := c.migSlices(ctx, ds, gpus, holds)
	if err != nil {
		log.Warn("cdi: MIG did not converge fully; the holds it did not refuse converge", "generation", ds.GetGeneration(), "error", err)
		errs = append(errs, err)
	}
	minors := readMIGMinors(c.MIGMinors)
	for _, h := range holds {
		if slices.Refused[h.GetHolder()] != nil {
			continue // its error is among errs already
		}
		name := SpecName(h.GetHolder())
		want[name] = true
		b, err := json.MarshalIndent(c.spec(h, slices, minors), "", "  ")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := specs.Write(name, append(b, '\n')); err != nil {
			errs = append(errs, err)
		}
	}
	names, err := specs.List()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, n := range names {
		if !want[n] {
			if err := specs.Remove(n); err != nil {
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

func (c *Converger) spec(h *agentv1.DeviceHold, slices mig.Result, minors map[string]int) Spec {
	root := c.DeviceRoot
	if root == "" {
		root = "/dev"
	}
	var visible []string
	var nodes []DeviceNode
	var parts []string
	seen := map[string]bool{}
	node := func(path string) {
		if !seen[path] {
			seen[path] = true
			nodes = append(nodes, DeviceNode{Path: path})
		}
	}
	for _, g := range h.GetGpus() {
		node(fmt.Sprintf("%s/nvidia%d", root, g.GetIndex()))
		if k, ok := mig.KeyOf(g); ok {
			// The MIG device, not its parent: NVIDIA's runtime and CUDA read MIG-… as that slice.
			in := slices.Devices[k]
			visible = append(visible, in.UUID)
			parts = append(parts, fmt.Sprintf("%s:mig=%s@%d", g.GetUuid(), g.GetMigProfile(), g.GetMigStart()))
			// A process opens its MIG device through the capability devices of its GPU and
			// compute instances (the driver's mig-minors table).
			for _, c := range []string{fmt.Sprintf("gpu%d/gi%d/access", k.GPU, in.GI), fmt.Sprintf("gpu%d/gi%d/ci%d/access", k.GPU, in.GI, in.CI)} {
				if m, ok := minors[c]; ok {
					node(fmt.Sprintf("%s/nvidia-caps/nvidia-cap%d", root, m))
				}
			}
			continue
		}
		visible = append(visible, g.GetUuid())
		if g.GetShare() >= 0 {
			parts = append(parts, fmt.Sprintf("%s:share=%d", g.GetUuid(), g.GetShare()))
		}
	}
	edits := ContainerEdits{DeviceNodes: nodes}
	if len(visible) > 0 {
		edits.Env = append(edits.Env, "NVIDIA_VISIBLE_DEVICES="+strings.Join(visible, ","))
	}
	if len(parts) > 0 {
		edits.Env = append(edits.Env, "BETTER_COMPUTE_GPU_PARTS="+strings.Join(parts, ";"))
	}
	if hook, ok := c.cgroupHook(h); ok {
		edits.Hooks = []Hook{hook}
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
