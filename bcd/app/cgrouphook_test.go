package app

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/bcd/internal/cdi"
)

// hookTree is a cgroup2 hierarchy in a directory with a container's cgroup /ctr and process 77
// in it.
func hookTree(t *testing.T, controllers string) (root, proc string) {
	t.Helper()
	dir := t.TempDir()
	root, proc = filepath.Join(dir, "cgroup"), filepath.Join(dir, "proc")
	for name, v := range map[string]string{
		"cgroup/cgroup.controllers":        "cpuset memory",
		"cgroup/ctr/cgroup.controllers":    controllers,
		"cgroup/ctr/cpuset.cpus":           "",
		"cgroup/ctr/cpuset.mems.effective": "0",
		"cgroup/ctr/memory.max":            "max",
		"proc/77/cgroup":                   "0::/ctr\n",
	} {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root, proc
}

func runBCD(stdin string, args ...string) (string, error) {
	root := newRoot(nil)
	var out bytes.Buffer
	root.SetArgs(args)
	root.SetIn(strings.NewReader(stdin))
	root.SetOut(&out)
	root.SetErr(&out)
	err := root.Execute()
	return out.String(), err
}

// TestCgroupHookRunsFromTheCDISpec: the hook entry the devices converger writes into a hold's
// CDI spec, run as a runtime runs it (its args, the OCI state on stdin), enforces the hold's
// cpuset and memory on the container's cgroup.
func TestCgroupHookRunsFromTheCDISpec(t *testing.T) {
	dir := t.TempDir()
	conv := &cdi.Converger{Dir: dir, Hook: "/usr/bin/bcd"}
	if err := conv.Apply(context.Background(), &agentv1.DesiredState{Holds: []*agentv1.DeviceHold{{Holder: "r7", Cpuset: "2-3", MemoryGib: 3}}}); err != nil {
		t.Fatal(err)
	}
	var spec cdi.Spec
	b, _ := os.ReadFile(filepath.Join(dir, "better-compute-r7.json"))
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	hook := spec.Devices[0].ContainerEdits.Hooks[0]
	root, proc := hookTree(t, "cpuset memory")
	args := append(hook.Args[1:], "--cgroup-root", root, "--proc", proc) // Args[0] is argv[0]
	out, err := runBCD(`{"ociVersion":"1.2.0","id":"c1","status":"creating","pid":77,"bundle":"/b"}`, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	cpus, _ := os.ReadFile(filepath.Join(root, "ctr", "cpuset.cpus"))
	mem, _ := os.ReadFile(filepath.Join(root, "ctr", "memory.max"))
	if string(cpus) != "2-3" || string(mem) != "3221225472" || !strings.Contains(out, "holder r7: container c1 (pid 77) in /ctr") {
		t.Fatalf("cpus %q, memory %q; said %q", cpus, mem, out)
	}
}

// TestCgroupHookRefuses: a missing controller or a state without a process fails the hook (the
// runtime then does not start the container), saying which holder and container.
func TestCgroupHookRefuses(t *testing.T) {
	root, proc := hookTree(t, "memory")
	_, err := runBCD(`{"id":"c2","pid":77}`, "cgroup-hook", "--holder", "r8", "--cpuset", "0", "--cgroup-root", root, "--proc", proc)
	if err == nil || !strings.Contains(err.Error(), "holder r8: container c2 (pid 77): cgroup: the cpuset controller is not enabled") {
		t.Fatalf("without cpuset: %v", err)
	}
	_, err = runBCD(`{"id":"c3"}`, "cgroup-hook", "--holder", "r8", "--memory-gib", "1", "--cgroup-root", root, "--proc", proc)
	if err == nil || !strings.Contains(err.Error(), "names no process") {
		t.Fatalf("no pid: %v", err)
	}
	if _, err := runBCD(`{"id":"c4","pid":77}`, "cgroup-hook", "--cpuset", "0"); err == nil || !strings.Contains(err.Error(), "--holder") {
		t.Fatalf("no holder: %v", err)
	}
}
