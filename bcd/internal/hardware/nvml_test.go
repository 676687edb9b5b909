//go:build cgo

package hardware_test

import (
	"context"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/better-compute/compute/bcd/internal/hardware"
)

// dgx is go-nvml's mock of a DGX H100, with what the mock leaves out filled in: temperatures,
// power, and NVLinks that all lead to NVSwitches (switched reports whether they are up).
func dgx(switched bool) *server.Server {
	srv := dgxh100.New()
	srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
	for _, d := range srv.Devices {
		dev := d.(*server.Device)
		dev.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 41, nvml.SUCCESS }
		dev.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 95_000, nvml.SUCCESS }
		bus := dev.PciBusID
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { // the mock leaves the bus id empty
			var p nvml.PciInfo
			for i, c := range bus {
				p.BusId[i] = int8(c)
			}
			return p, nvml.SUCCESS
		}
		dev.GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) {
			if switched {
				return nvml.FEATURE_ENABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_DISABLED, nvml.SUCCESS
		}
		dev.GetNvLinkRemotePciInfoFunc = func(link int) (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			copy(p.BusId[:], []int8{'0', '0', '0', '0', '0', '0', '0', '0', ':', 'c', '0', ':', '0', '0', '.', '0'})
			return p, nvml.SUCCESS
		}
	}
	return srv
}

// TestNVMLInventory reads a simulated DGX H100 through go-nvml's own mock of NVML.
func TestNVMLInventory(t *testing.T) {
	gpus, err := hardware.OpenNVML(dgx(true))
	if err != nil {
		t.Fatal(err)
	}
	inv, why := gpus.Inventory()
	if why != "" || len(inv) != 8 {
		t.Fatalf("inventory = %d GPUs (%q), want 8", len(inv), why)
	}
	seen := map[string]bool{}
	for i, g := range inv {
		if int(g.GetIndex()) != i || g.GetUuid() == "" || seen[g.GetUuid()] || !strings.Contains(g.GetName(), "H100") {
			t.Fatalf("GPU %d = %+v", i, g)
		}
		seen[g.GetUuid()] = true
		if g.GetMemoryMib() < 80_000 || g.GetHealth() != "healthy" || g.GetTemperatureC() != 41 || g.GetPowerW() != 95 {
			t.Fatalf("GPU %d = %+v", i, g)
		}
		// Eight GPUs behind NVSwitches are one NVLink domain.
		if g.GetNvlinkDomain() == "" || g.GetNvlinkDomain() != inv[0].GetNvlinkDomain() || g.GetPciAddress() == "" {
			t.Fatalf("GPU %d domain %q, PCI %q", i, g.GetNvlinkDomain(), g.GetPciAddress())
		}
	}
	alone, _ := hardware.OpenNVML(dgx(false))
	if inv, _ := alone.Inventory(); inv[0].GetNvlinkDomain() != "" {
		t.Fatalf("a GPU without active links is in domain %q", inv[0].GetNvlinkDomain())
	}
	m := &hardware.Machine{Host: hardware.Host{}, GPUs: gpus}
	full, err := m.Inventory(context.Background())
	if err != nil || full.GetVcpus() < 1 || full.GetMemoryGib() < 1 || len(full.GetGpus()) != 8 {
		t.Fatalf("machine inventory = %+v, %v", full, err)
	}
	h, err := m.HealthCheck(context.Background())
	if err != nil || len(h["gpus"].([]any)) != 8 {
		t.Fatalf("health check = %v, %v", h, err)
	}
}

// failingInit is an NVML whose library is missing: after Init fails nothing else may be called.
type failingInit struct {
	nvml.Interface
	calls int
}

func (f *failingInit) Init() nvml.Return { f.calls++; return nvml.ERROR_LIBRARY_NOT_FOUND }

func TestNoNVMLIsReportedAndNeverTouchedAgain(t *testing.T) {
	lib := &failingInit{}
	gpus, err := hardware.OpenNVML(lib) // any further call would panic on the nil embedded interface
	if err != nil {
		t.Fatal(err)
	}
	inv, why := gpus.Inventory()
	if len(inv) != 0 || !strings.Contains(why, "NVML not found") {
		t.Fatalf("without NVML: %d GPUs, %q", len(inv), why)
	}
	if _, err := gpus.Health(); err != nil || lib.calls != 1 {
		t.Fatalf("NVML was called %d times after a failed Init", lib.calls)
	}
}

func TestHostReadsProc(t *testing.T) {
	h := hardware.Host{Disk: t.TempDir()}
	total, avail, err := h.Memory()
	if err != nil || total <= 0 || avail <= 0 || avail > total {
		t.Fatalf("memory %d/%d, %v", avail, total, err)
	}
	p := h.Pressure()
	if p.GetMemoryUsed() <= 0 || p.GetMemoryUsed() >= 1 || p.GetDiskUsed() <= 0 {
		t.Fatalf("pressure %+v", p)
	}
}
