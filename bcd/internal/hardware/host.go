// Package hardware is what bcd reads and does on its machine: GPUs through NVML (go-nvml, which
// needs cgo), CPUs, memory and disk from /proc and the file system, and GPU resets through
// nvidia-smi. Machine implements nodeagent.Hardware.
package hardware

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	agentv1 "github.com/better-compute/compute/agent/v1"
)

// maxMemoryKiB is more memory than any one machine has (1 PiB): a larger MemTotal is a bad read.
const maxMemoryKiB = 1 << 40

// Host reads the machine's CPUs, memory and pressure.
type Host struct {
	// Proc is where /proc is; default "/proc".
	Proc string
	// Disk is a path on the file system whose fullness counts as disk pressure (bcd's state
	// directory).
	Disk string
}

func (h Host) proc(name string) string {
	p := h.Proc
	if p == "" {
		p = "/proc"
	}
	return p + "/" + name
}

// VCPUs is the CPUs this process may run on (its affinity, as runtime.NumCPU reads it).
func (h Host) VCPUs() int { return runtime.NumCPU() }

// Memory returns total and available memory in KiB, from /proc/meminfo.
func (h Host) Memory() (total, available int64, err error) {
	f, err := os.Open(h.proc("meminfo"))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "MemTotal:":
			total = v
		case "MemAvailable:":
			available = v
		}
	}
	// What the file says is checked, not trusted: a total no machine has, or an available
	// figure outside 0..total, would reach the control plane as nonsense capacity.
	if total <= 0 || total > maxMemoryKiB {
		return 0, 0, fmt.Errorf("hardware: meminfo has no usable MemTotal (%d KiB)", total)
	}
	available = min(max(available, 0), total)
	return total, available, sc.Err()
}

// Pressure reports memory and disk use, as fractions, and the one-minute load.
func (h Host) Pressure() *agentv1.HostPressure {
	p := &agentv1.HostPressure{}
	if total, avail, err := h.Memory(); err == nil {
		p.MemoryUsed = 1 - float64(avail)/float64(total)
	}
	if h.Disk != "" {
		var st syscall.Statfs_t
		if err := syscall.Statfs(h.Disk, &st); err == nil && st.Blocks > 0 {
			p.DiskUsed = 1 - float64(st.Bavail)/float64(st.Blocks)
		}
	}
	if b, err := os.ReadFile(h.proc("loadavg")); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if l, err := strconv.ParseFloat(f[0], 64); err == nil && l >= 0 && !math.IsInf(l, 0) {
				p.Load1 = l
			}
		}
	}
	return p
}

// Machine is a real machine: its host and its GPUs.
type Machine struct {
	Host Host
	GPUs GPUs
	// Reset resets a GPU whose index the inventory has; nil: nvidia-smi, which needs root. An
	// unprivileged node agent resets through its root helper.
	Reset func(ctx context.Context, index int) error
}

// GPUs is the GPU half of a Machine: NVML, or nothing.
type GPUs interface {
	// Inventory returns the GPUs, or none and why.
	Inventory() ([]*agentv1.GPU, string)
	Events() <-chan *agentv1.GPUEvent
	// Health reports temperatures, power and health per GPU.
	Health() (map[string]any, error)
	// Cleared tells the backend that a GPU was reset: its faults are gone.
	Cleared(index int)
}

// Inventory implements nodeagent.Hardware.
func (m *Machine) Inventory(context.Context) (*agentv1.Inventory, error) {
	total, _, err := m.Host.Memory()
	if err != nil {
		return nil, err
	}
	inv := &agentv1.Inventory{Vcpus: int32(m.Host.VCPUs()), MemoryGib: int32(total / (1 << 20))}
	inv.Gpus, inv.GpuStatus = m.GPUs.Inventory()
	return inv, nil
}

// ResetGPU implements nodeagent.Hardware with nvidia-smi: NVML has no public call for a full GPU
// reset.
func (m *Machine) ResetGPU(ctx context.Context, index int) error {
	known := false
	gpus, _ := m.GPUs.Inventory()
	for _, g := range gpus {
		known = known || int(g.GetIndex()) == index
	}
	if !known {
		return fmt.Errorf("gpu.reset: this node has no GPU %d", index)
	}
	if m.Reset != nil {
		if err := m.Reset(ctx, index); err != nil {
			return err
		}
		m.GPUs.Cleared(index)
		return nil
	}
	path, err := exec.LookPath("nvidia-smi")
	if err != nil {
		return errors.New("gpu.reset needs nvidia-smi, which is not on PATH")
	}
	out, err := exec.CommandContext(ctx, path, "--gpu-reset", "-i", strconv.Itoa(index)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("nvidia-smi --gpu-reset -i %d: %v: %s", index, err, strings.TrimSpace(string(out)))
	}
	m.GPUs.Cleared(index)
	return nil
}

// HealthCheck implements nodeagent.Hardware.
func (m *Machine) HealthCheck(context.Context) (map[string]any, error) {
	out, err := m.GPUs.Health()
	if err != nil {
		return nil, err
	}
	p := m.Host.Pressure()
	out["memoryUsed"], out["diskUsed"], out["load1"] = p.GetMemoryUsed(), p.GetDiskUsed(), p.GetLoad1()
	return out, nil
}

// Diag implements nodeagent.Hardware with DCGM's diagnostics.
func (m *Machine) Diag(ctx context.Context, test string, _ int) (map[string]any, error) {
	path, err := exec.LookPath("dcgmi")
	if err != nil {
		return nil, errors.New("diag.run needs DCGM (dcgmi), which is not installed")
	}
	level := map[string]string{"quick": "1", "medium": "2", "long": "3"}[test]
	if level == "" {
		return nil, fmt.Errorf("diag.run: test %q is not quick, medium or long", test)
	}
	out, err := exec.CommandContext(ctx, path, "diag", "-r", level).CombinedOutput()
	res := map[string]any{"test": test, "output": string(out), "passed": err == nil}
	if err != nil {
		return res, fmt.Errorf("dcgmi diag -r %s: %v", level, err)
	}
	return res, nil
}

// Events implements nodeagent.Hardware.
func (m *Machine) Events() <-chan *agentv1.GPUEvent { return m.GPUs.Events() }

// Pressure implements nodeagent.Hardware.
func (m *Machine) Pressure() *agentv1.HostPressure { return m.Host.Pressure() }

// NoGPUs is the GPUs of a machine without them, or without NVML; Why says which.
type NoGPUs struct{ Why string }

// Inventory implements GPUs.
func (n NoGPUs) Inventory() ([]*agentv1.GPU, string) { return nil, n.Why }

// Events implements GPUs.
func (NoGPUs) Events() <-chan *agentv1.GPUEvent { return nil }

// Health implements GPUs.
func (n NoGPUs) Health() (map[string]any, error) {
	return map[string]any{"gpus": 0, "gpuStatus": n.Why}, nil
}

// Cleared implements GPUs.
func (NoGPUs) Cleared(int) {}
