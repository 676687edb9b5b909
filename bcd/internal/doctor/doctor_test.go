package doctor_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/better-compute/compute/bcd/internal/cgroup"
	"github.com/better-compute/compute/bcd/internal/doctor"
	"github.com/better-compute/compute/bcd/internal/hardware"
)

// cgroupRoot is a cgroup2 root in a directory: controllers and subtree_control as given ("-":
// no such file, as on cgroup v1).
func cgroupRoot(t *testing.T, controllers, subtree string) cgroup.Tree {
	t.Helper()
	dir := t.TempDir()
	for name, v := range map[string]string{"cgroup.controllers": controllers, "cgroup.subtree_control": subtree} {
		if v == "-" {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return cgroup.Tree{Root: dir}
}

func find(t *testing.T, r doctor.Report, name string) doctor.Check {
	t.Helper()
	for _, c := range r.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %s in %+v", name, r.Checks)
	return doctor.Check{}
}

func noGPUs() (hardware.GPUs, error) { return hardware.NoGPUs{Why: "NVML not found"}, nil }

// TestReportIsStable: bcd doctor --json has one shape whatever the machine: a version, ok, and
// every check in the same order, each with a name, a status of four and a detail.
func TestReportIsStable(t *testing.T) {
	r := doctor.NewReport(doctor.Run(context.Background(), doctor.Options{StateDir: t.TempDir(), CDIDir: t.TempDir(),
		OpenGPUs: noGPUs, Cgroup: cgroupRoot(t, "cpuset memory pids", "cpuset memory")}))
	var names []string
	for _, c := range r.Checks {
		names = append(names, c.Name)
		if !slices.Contains([]string{doctor.OK, doctor.Warn, doctor.Fail, doctor.Skip}, c.Status) || c.Detail == "" {
			t.Errorf("check %+v", c)
		}
	}
	want := []string{"identity", "certificate", "clock", "gateway", "nvml", "mig", "cgroup", "cdi", "disk"}
	if !slices.Equal(names, want) {
		t.Fatalf("checks %v, want %v", names, want)
	}
	if r.OK || r.Version != doctor.ReportVersion || find(t, r, "identity").Status != doctor.Fail {
		t.Fatalf("a node that has not joined: %+v", r)
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var generic map[string]any
	if err := json.Unmarshal(b, &generic); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 0, len(generic))
	for k := range generic {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if !slices.Equal(keys, []string{"checks", "ok", "version"}) {
		t.Fatalf("report keys %v", keys)
	}
	cg := generic["checks"].([]any)[6].(map[string]any)
	if cg["name"] != "cgroup" || cg["status"] != "ok" || cg["data"].(map[string]any)["v2"] != true {
		t.Fatalf("the cgroup check in JSON: %v", cg)
	}
	// Fake hardware: NVML is not read, and the checks say so.
	r = doctor.NewReport(doctor.Run(context.Background(), doctor.Options{StateDir: t.TempDir(), CDIDir: t.TempDir(), SkipGPUs: true,
		OpenGPUs: func() (hardware.GPUs, error) { t.Fatal("NVML opened for fake hardware"); return nil, nil }}))
	if find(t, r, "nvml").Status != doctor.Skip || find(t, r, "mig").Status != doctor.Skip {
		t.Fatalf("fake hardware: %+v", r.Checks)
	}
}

// TestCgroupCheck: cgroup v2 with cpuset and memory for its children is ok; v1, or v2 without
// them, warns that holds' limits cannot be enforced, and says what to do.
func TestCgroupCheck(t *testing.T) {
	for _, c := range []struct {
		name, controllers, subtree, status, detail string
	}{
		{"v2", "cpuset cpu memory", "cpu cpuset memory", doctor.OK, "cgroup v2 at"},
		{"v1", "-", "-", doctor.Warn, "cgroup v1: "},
		{"no cpuset for children", "cpuset memory", "memory", doctor.Warn, "but cpuset not enabled for its children"},
		{"no controllers", "hugetlb", "", doctor.Warn, "but cpuset and memory not enabled"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := doctor.NewReport(doctor.Run(context.Background(), doctor.Options{StateDir: t.TempDir(), CDIDir: t.TempDir(),
				OpenGPUs: noGPUs, Cgroup: cgroupRoot(t, c.controllers, c.subtree)}))
			got := find(t, r, "cgroup")
			if got.Status != c.status || !strings.Contains(got.Detail, c.detail) || (c.status != doctor.OK && got.Fix == "") {
				t.Fatalf("%+v", got)
			}
		})
	}
}
