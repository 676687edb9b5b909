// Package cgroup enforces a hold's cpuset and memory on a container's cgroup, on cgroup v2. A
// runtime runs `bcd cgroup-hook` as an OCI hook (the CDI spec of the hold names it): the hook
// reads the container's state on stdin, finds the cgroup of its process and writes
// cpuset.cpus and memory.max there. On cgroup v1, or where a controller is not enabled for the
// container's cgroup, it refuses, saying what is missing, and the runtime does not start the
// container: a hold's limits are enforced or the container does not run.
package cgroup

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// DefaultRoot is where the machine's cgroup v2 hierarchy is mounted.
const DefaultRoot = "/sys/fs/cgroup"

// MaxMemoryGiB bounds a memory limit (1 PiB), as a sanity check of the argument.
const MaxMemoryGiB = 1 << 20

// maxCPU bounds a CPU number in a list (the kernel's NR_CPUS is at most 8192).
const maxCPU = 1 << 16

// Limits are what a hold allows a container.
type Limits struct {
	// CPUs is a CPU list ("0-7,16"); "" leaves the cpuset alone.
	CPUs string
	// MemoryGiB is the memory limit; 0 leaves memory alone.
	MemoryGiB int
}

// Validate checks the limits before anything is written.
func (l Limits) Validate() error {
	if l.CPUs != "" {
		if _, err := ParseCPUs(l.CPUs); err != nil {
			return err
		}
	}
	if l.MemoryGiB < 0 || l.MemoryGiB > MaxMemoryGiB {
		return fmt.Errorf("cgroup: memory %d GiB is out of range (0 to %d)", l.MemoryGiB, MaxMemoryGiB)
	}
	if l.CPUs == "" && l.MemoryGiB == 0 {
		return errors.New("cgroup: no limit to apply: give a cpuset, a memory limit or both")
	}
	return nil
}

// ParseCPUs reads a Linux CPU list ("0-3,8") as the CPUs it names, in order.
func ParseCPUs(list string) ([]int, error) {
	var out []int
	seen := map[int]bool{}
	for part := range strings.SplitSeq(strings.TrimSpace(list), ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err1 := strconv.Atoi(lo)
		b, err2 := a, error(nil)
		if isRange {
			b, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || a < 0 || b < a || b >= maxCPU {
			return nil, fmt.Errorf("cgroup: %q is not a CPU list (like 0-7,16)", list)
		}
		for c := a; c <= b; c++ {
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// Tree is a cgroup v2 hierarchy and the processes in it. The zero value is the machine's:
// DefaultRoot and /proc.
type Tree struct {
	// Root is where the cgroup2 file system is mounted; default DefaultRoot.
	Root string
	// Proc is where /proc is; default "/proc".
	Proc string
}

func (t Tree) root() string {
	if t.Root == "" {
		return DefaultRoot
	}
	return t.Root
}

func (t Tree) proc() string {
	if t.Proc == "" {
		return "/proc"
	}
	return t.Proc
}

// ErrV1 is a machine whose cgroup hierarchy is not v2 at Root (cgroup v1, or the hybrid layout
// in which v1 owns the controllers).
var ErrV1 = errors.New("not a cgroup v2 hierarchy")

// Controllers returns the controllers the hierarchy's root offers (its cgroup.controllers), or
// an error wrapping ErrV1 where Root is not cgroup v2.
func (t Tree) Controllers() ([]string, error) {
	b, err := os.ReadFile(filepath.Join(t.root(), "cgroup.controllers"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("cgroup: %s is %w (it has no cgroup.controllers: this machine runs cgroup v1 or the hybrid layout): "+
			"bcd enforces a hold's cpuset and memory on cgroup v2 only; boot with systemd.unified_cgroup_hierarchy=1", t.root(), ErrV1)
	}
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	return strings.Fields(string(b)), nil
}

// CgroupOf returns the cgroup v2 path of process pid, relative to Root ("/system.slice/…").
func (t Tree) CgroupOf(pid int) (string, error) {
	if pid <= 0 {
		return "", fmt.Errorf("cgroup: process id %d is not one", pid)
	}
	f, err := os.Open(filepath.Join(t.proc(), strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return "", fmt.Errorf("cgroup: the cgroup of process %d: %w", pid, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		p, ok := strings.CutPrefix(sc.Text(), "0::")
		if !ok {
			continue
		}
		if !strings.HasPrefix(p, "/") || path.Clean(p) != p {
			return "", fmt.Errorf("cgroup: process %d is in cgroup %q, which is not a clean path", pid, p)
		}
		if p == "/" {
			// Either the root (no limit may go there) or, seen from inside a cgroup namespace,
			// the namespace's root, whose real path cannot be known from here.
			return "", fmt.Errorf("cgroup: process %d reads as in the root cgroup: refusing to limit the root "+
				"(a hook run inside the container's cgroup namespace, as createContainer hooks are, sees its own cgroup as /: run it as createRuntime)", pid)
		}
		return p, nil
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("cgroup: the cgroup of process %d: %w", pid, err)
	}
	return "", fmt.Errorf("cgroup: process %d is in no cgroup v2 hierarchy (no 0:: line in its cgroup file)", pid)
}

// Applied is what Apply wrote.
type Applied struct {
	Cgroup    string `json:"cgroup"` // relative to Root
	CPUs      string `json:"cpus,omitempty"`
	Mems      string `json:"mems,omitempty"` // written only where the cgroup had none
	MemoryMax int64  `json:"memoryMax,omitempty"`
}

// Apply enforces l on the cgroup of process pid: cpuset.cpus (and cpuset.mems, where the cgroup
// has no memory nodes of its own to run on), then memory.max, each read back.
func (t Tree) Apply(pid int, l Limits) (Applied, error) {
	if err := l.Validate(); err != nil {
		return Applied{}, err
	}
	if _, err := t.Controllers(); err != nil {
		return Applied{}, err
	}
	rel, err := t.CgroupOf(pid)
	if err != nil {
		return Applied{}, err
	}
	out, err := t.ApplyTo(rel, l)
	if err != nil {
		return out, fmt.Errorf("%w (the cgroup of process %d)", err, pid)
	}
	return out, nil
}

// ApplyTo enforces l on the cgroup rel (relative to Root, "/a/b"), as Apply does.
func (t Tree) ApplyTo(rel string, l Limits) (Applied, error) {
	if err := l.Validate(); err != nil {
		return Applied{}, err
	}
	available, err := t.Controllers()
	if err != nil {
		return Applied{}, err
	}
	dir := filepath.Join(t.root(), filepath.FromSlash(rel))
	out := Applied{Cgroup: rel}
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return out, fmt.Errorf("cgroup: the cgroup %s: %w", rel, err)
	}
	enabled := strings.Fields(string(b))
	need := func(ctl string) error {
		switch {
		case !slices.Contains(available, ctl):
			return fmt.Errorf("cgroup: the %s controller is not available on %s (cgroup v1 holds it, or the kernel lacks it)", ctl, t.root())
		case !slices.Contains(enabled, ctl):
			return fmt.Errorf("cgroup: the %s controller is not enabled for cgroup %s: enable it in its parent's cgroup.subtree_control (echo +%s > %s)",
				ctl, rel, ctl, filepath.Join(filepath.Dir(dir), "cgroup.subtree_control"))
		}
		return nil
	}
	if l.CPUs != "" {
		if err := need("cpuset"); err != nil {
			return out, err
		}
		if err := writeBack(dir, "cpuset.cpus", l.CPUs, sameCPUs); err != nil {
			return out, err
		}
		out.CPUs = l.CPUs
		mems, err := os.ReadFile(filepath.Join(dir, "cpuset.mems.effective"))
		if err == nil && strings.TrimSpace(string(mems)) == "" {
			// No memory node to run on: take the parent's, as cgroup v1 needed always.
			parent, err := os.ReadFile(filepath.Join(filepath.Dir(dir), "cpuset.mems.effective"))
			if err != nil || strings.TrimSpace(string(parent)) == "" {
				return out, fmt.Errorf("cgroup: cgroup %s has no memory nodes and its parent names none either", rel)
			}
			if err := writeBack(dir, "cpuset.mems", strings.TrimSpace(string(parent)), sameCPUs); err != nil {
				return out, err
			}
			out.Mems = strings.TrimSpace(string(parent))
		}
	}
	if l.MemoryGiB > 0 {
		if err := need("memory"); err != nil {
			return out, err
		}
		limit := int64(l.MemoryGiB) << 30
		if err := writeBack(dir, "memory.max", strconv.FormatInt(limit, 10), func(a, b string) bool { return a == b }); err != nil {
			return out, err
		}
		out.MemoryMax = limit
	}
	return out, nil
}

// sameCPUs compares two CPU lists by the CPUs they name (the kernel rewrites "0,1,2" as "0-2").
func sameCPUs(a, b string) bool {
	x, err1 := ParseCPUs(a)
	y, err2 := ParseCPUs(b)
	return err1 == nil && err2 == nil && slices.Equal(x, y)
}

// writeBack writes v to the cgroup's file name (which must exist: a missing file is a missing
// controller, not a file to create) and checks that it reads back as v.
func writeBack(dir, name, v string, same func(a, b string) bool) error {
	p := filepath.Join(dir, name)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return fmt.Errorf("cgroup: write %s: %w", p, err)
	}
	_, err = io.WriteString(f, v)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("cgroup: write %s=%s: %w", p, v, err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("cgroup: read %s back: %w", p, err)
	}
	if got := strings.TrimSpace(string(b)); !same(got, v) {
		return fmt.Errorf("cgroup: %s reads %q after writing %q", p, got, v)
	}
	return nil
}

// State is the part of the OCI state (runtime-spec's state.json) a hook reads on its stdin.
type State struct {
	OCIVersion string `json:"ociVersion"`
	ID         string `json:"id"`
	Status     string `json:"status"`
	Pid        int    `json:"pid"`
	Bundle     string `json:"bundle"`
}

// ReadState reads the OCI state from r; it must name the container's process.
func ReadState(r io.Reader) (State, error) {
	var s State
	if err := json.NewDecoder(io.LimitReader(r, 1<<20)).Decode(&s); err != nil {
		return s, fmt.Errorf("cgroup: the OCI state on stdin does not read: %w (run as an OCI hook, the runtime writes it)", err)
	}
	if s.Pid <= 0 {
		return s, fmt.Errorf("cgroup: the OCI state of container %q names no process (pid %d)", s.ID, s.Pid)
	}
	return s, nil
}
