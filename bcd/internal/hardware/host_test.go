package hardware_test

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/better-compute/compute/bcd/internal/hardware"
)

// FuzzHostInventory: whatever /proc/meminfo and /proc/loadavg hold, the inventory and pressure
// bcd reports are sane: memory positive and bounded, pressure fractions in 0..1, load finite.
func FuzzHostInventory(f *testing.F) {
	f.Add("MemTotal:       263856824 kB\nMemAvailable:   250000000 kB\n", "0.52 0.58 0.59 1/1234 5678\n")
	f.Add("MemTotal: -5 kB\nMemAvailable: 10 kB\n", "NaN 1 1")
	f.Add("MemTotal: 9223372036854775807 kB\n", "Inf")
	f.Add("MemTotal: 100 kB\nMemAvailable: 900 kB\n", "-3")
	f.Add("MemTotal: 100 kB\nMemAvailable: -900 kB\n", "")
	f.Add("garbage", "1e400")
	f.Fuzz(func(t *testing.T, meminfo, loadavg string) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "meminfo"), []byte(meminfo), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "loadavg"), []byte(loadavg), 0o644); err != nil {
			t.Fatal(err)
		}
		m := &hardware.Machine{Host: hardware.Host{Proc: dir}, GPUs: hardware.NoGPUs{Why: "test"}}
		inv, err := m.Inventory(context.Background())
		if err == nil && (inv.GetMemoryGib() < 0 || inv.GetVcpus() <= 0) {
			t.Fatalf("inventory %+v from meminfo %q", inv, meminfo)
		}
		p := m.Pressure()
		if p.GetMemoryUsed() < 0 || p.GetMemoryUsed() > 1 || math.IsNaN(p.GetMemoryUsed()) {
			t.Fatalf("memory used %v from meminfo %q", p.GetMemoryUsed(), meminfo)
		}
		if l := p.GetLoad1(); l < 0 || math.IsNaN(l) || math.IsInf(l, 0) {
			t.Fatalf("load %v from loadavg %q", l, loadavg)
		}
	})
}
