package cgroup_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/better-compute/compute/bcd/internal/cgroup"
)

const pid = 4242

// fakeTree is a cgroup2 hierarchy in a temporary directory, with a container's cgroup at
// /system.slice/ctr.scope and process pid in it; edit changes files (a value "-" removes one).
func fakeTree(t *testing.T, edit map[string]string) (cgroup.Tree, string) {
	t.Helper()
	dir := t.TempDir()
	root, proc := filepath.Join(dir, "cgroup"), filepath.Join(dir, "proc")
	files := map[string]string{
		"cgroup/cgroup.controllers":                           "cpuset cpu io memory pids",
		"cgroup/system.slice/cgroup.controllers":              "cpuset cpu io memory pids",
		"cgroup/system.slice/cpuset.mems.effective":           "0-1",
		"cgroup/system.slice/ctr.scope/cgroup.controllers":    "cpuset cpu memory pids",
		"cgroup/system.slice/ctr.scope/cpuset.cpus":           "",
		"cgroup/system.slice/ctr.scope/cpuset.mems":           "",
		"cgroup/system.slice/ctr.scope/cpuset.mems.effective": "0-1",
		"cgroup/system.slice/ctr.scope/memory.max":            "max",
		"proc/4242/cgroup":                                    "0::/system.slice/ctr.scope\n",
	}
	for k, v := range edit {
		files[k] = v
	}
	for name, v := range files {
		if v == "-" {
			continue
		}
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return cgroup.Tree{Root: root, Proc: proc}, filepath.Join(root, "system.slice", "ctr.scope")
}

func read(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestApplyWritesTheLimits(t *testing.T) {
	tree, ctr := fakeTree(t, nil)
	got, err := tree.Apply(pid, cgroup.Limits{CPUs: "0-3,8", MemoryGiB: 2})
	if err != nil {
		t.Fatal(err)
	}
	if got != (cgroup.Applied{Cgroup: "/system.slice/ctr.scope", CPUs: "0-3,8", MemoryMax: 2 << 30}) {
		t.Fatalf("applied %+v", got)
	}
	if read(t, ctr, "cpuset.cpus") != "0-3,8" || read(t, ctr, "memory.max") != "2147483648" || read(t, ctr, "cpuset.mems") != "" {
		t.Fatalf("cpus %q, memory %q, mems %q", read(t, ctr, "cpuset.cpus"), read(t, ctr, "memory.max"), read(t, ctr, "cpuset.mems"))
	}
	// Only what is given is written.
	tree, ctr = fakeTree(t, nil)
	if _, err := tree.Apply(pid, cgroup.Limits{MemoryGiB: 1}); err != nil || read(t, ctr, "cpuset.cpus") != "" || read(t, ctr, "memory.max") != "1073741824" {
		t.Fatalf("memory only: %v, cpus %q", err, read(t, ctr, "cpuset.cpus"))
	}
}

// TestApplyGivesMemoryNodes: a cgroup with no memory nodes to run on gets its parent's.
func TestApplyGivesMemoryNodes(t *testing.T) {
	tree, ctr := fakeTree(t, map[string]string{"cgroup/system.slice/ctr.scope/cpuset.mems.effective": ""})
	got, err := tree.Apply(pid, cgroup.Limits{CPUs: "2"})
	if err != nil || got.Mems != "0-1" || read(t, ctr, "cpuset.mems") != "0-1" {
		t.Fatalf("applied %+v, %v; mems %q", got, err, read(t, ctr, "cpuset.mems"))
	}
}

// TestApplyRefuses: cgroup v1, a process outside cgroup v2 or at its root, a controller
// missing or not enabled, bad limits: each refused, saying what is wrong, and nothing written.
func TestApplyRefuses(t *testing.T) {
	cases := []struct {
		name   string
		edit   map[string]string
		limits cgroup.Limits
		pid    int
		want   string
	}{
		{"cgroup v1", map[string]string{"cgroup/cgroup.controllers": "-"}, cgroup.Limits{CPUs: "0"}, pid, "not a cgroup v2 hierarchy"},
		{"no v2 line", map[string]string{"proc/4242/cgroup": "12:cpuset:/ctr\n1:name=systemd:/ctr\n"}, cgroup.Limits{CPUs: "0"}, pid, "in no cgroup v2 hierarchy"},
		{"root", map[string]string{"proc/4242/cgroup": "0::/\n"}, cgroup.Limits{CPUs: "0"}, pid, "refusing to limit the root"},
		{"escape", map[string]string{"proc/4242/cgroup": "0::/a/../../etc\n"}, cgroup.Limits{CPUs: "0"}, pid, "not a clean path"},
		{"no process", nil, cgroup.Limits{CPUs: "0"}, 7, "the cgroup of process 7"},
		{"cpuset not enabled", map[string]string{"cgroup/system.slice/ctr.scope/cgroup.controllers": "memory pids"}, cgroup.Limits{CPUs: "0"}, pid,
			"the cpuset controller is not enabled for cgroup /system.slice/ctr.scope: enable it in its parent's cgroup.subtree_control"},
		{"memory not available", map[string]string{"cgroup/cgroup.controllers": "cpuset pids"}, cgroup.Limits{MemoryGiB: 1}, pid, "the memory controller is not available"},
		{"bad cpus", nil, cgroup.Limits{CPUs: "0-a"}, pid, `"0-a" is not a CPU list`},
		{"backwards", nil, cgroup.Limits{CPUs: "7-3"}, pid, "not a CPU list"},
		{"no limits", nil, cgroup.Limits{}, pid, "no limit to apply"},
		{"too much memory", nil, cgroup.Limits{MemoryGiB: cgroup.MaxMemoryGiB + 1}, pid, "out of range"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tree, ctr := fakeTree(t, c.edit)
			_, err := tree.Apply(c.pid, c.limits)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want %q", err, c.want)
			}
			if c.name == "cgroup v1" && !errors.Is(err, cgroup.ErrV1) {
				t.Fatalf("not ErrV1: %v", err)
			}
			if got := read(t, ctr, "cpuset.cpus") + read(t, ctr, "memory.max"); got != "max" {
				t.Fatalf("a refusal wrote %q", got)
			}
		})
	}
}

func TestParseCPUs(t *testing.T) {
	got, err := cgroup.ParseCPUs("8,0-3,2")
	if err != nil || !slices.Equal(got, []int{0, 1, 2, 3, 8}) {
		t.Fatalf("%v, %v", got, err)
	}
	for _, bad := range []string{"", "-1", "1-", "a", "0,,1", "99999999"} {
		if _, err := cgroup.ParseCPUs(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestReadState(t *testing.T) {
	s, err := cgroup.ReadState(strings.NewReader(`{"ociVersion":"1.2.0","id":"abc","status":"created","pid":4242,"bundle":"/run/b"}`))
	if err != nil || s.Pid != 4242 || s.ID != "abc" {
		t.Fatalf("%+v, %v", s, err)
	}
	for _, bad := range []string{``, `{`, `{"id":"abc","status":"creating"}`, `{"pid":-1}`} {
		if _, err := cgroup.ReadState(strings.NewReader(bad)); err == nil {
			t.Errorf("%q read", bad)
		}
	}
}
