//go:build cgo

package doctor_test

import (
	"context"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"

	"github.com/better-compute/compute/bcd/internal/doctor"
	"github.com/better-compute/compute/bcd/internal/hardware"
	"github.com/better-compute/compute/bcd/internal/hardware/nvmltest"
)

// TestMIGCheck reads MIG modes and instances through go-nvml's DGX H100 mock: GPU 0 in MIG mode
// with a slice, GPU 1 waiting for a reset to enter it; the check lists both and warns of the
// reset.
func TestMIGCheck(t *testing.T) {
	m := nvmltest.New(dgxh100.New())
	setup, err := hardware.OpenNVML(m)
	if err != nil {
		t.Fatal(err)
	}
	g := setup.(*hardware.NVML)
	if err := g.SetMIGMode(0, true); err != nil {
		t.Fatal(err)
	}
	in, err := g.CreateMIGInstance(0, "3g.40gb", 4)
	if err != nil {
		t.Fatal(err)
	}
	m.ResetRequired = true
	_ = g.SetMIGMode(1, true)
	g.Close()

	r := doctor.NewReport(doctor.Run(context.Background(), doctor.Options{StateDir: t.TempDir(), CDIDir: t.TempDir(),
		OpenGPUs: func() (hardware.GPUs, error) { return hardware.OpenNVML(m) }, Cgroup: cgroupRoot(t, "-", "-")}))
	if c := find(t, r, "nvml"); c.Status != doctor.OK || !strings.Contains(c.Detail, "8 GPUs (NVIDIA H100") {
		t.Fatalf("nvml: %+v", c)
	}
	c := find(t, r, "mig")
	if c.Status != doctor.Warn || !strings.Contains(c.Detail, "8 of 8 GPUs can do MIG, 1 in MIG mode, 1 MIG instances") ||
		!strings.Contains(c.Detail, "GPU 1: a MIG mode change waits for a GPU reset") || c.Fix == "" {
		t.Fatalf("mig: %+v", c)
	}
	gpus := c.Data.([]doctor.MIGGPU)
	if len(gpus) != 8 || !gpus[0].Enabled || len(gpus[0].Instances) != 1 || gpus[1].Enabled || !gpus[1].PendingEnabled {
		t.Fatalf("mig data %+v", gpus)
	}
	if got := gpus[0].Instances[0]; got.Profile != "3g.40gb" || got.Start != 4 || got.UUID != in.UUID {
		t.Fatalf("instance %+v, made %+v", got, in)
	}
}
