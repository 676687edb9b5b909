package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/better-compute/compute/agent/v1"
)

// Hardware is what the agent reads and does on the machine.
type Hardware interface {
	// Inventory reports GPUs, vCPUs and memory. A machine without GPUs (or without NVML) reports
	// none and says why in GpuStatus.
	Inventory(ctx context.Context) (*agentv1.Inventory, error)
	// ResetGPU resets one GPU.
	ResetGPU(ctx context.Context, index int) error
	// HealthCheck runs a quick check and reports what it found.
	HealthCheck(ctx context.Context) (map[string]any, error)
	// Diag runs a named diagnostic for about seconds.
	Diag(ctx context.Context, test string, seconds int) (map[string]any, error)
	// Events delivers GPU events (XIDs, ECC, thermal) as they happen; nil when there are none.
	Events() <-chan *agentv1.GPUEvent
	// Pressure reports host memory and disk pressure.
	Pressure() *agentv1.HostPressure
}

// FakeGPU is one GPU of FakeHardware.
type FakeGPU struct {
	Name         string
	MemoryMiB    int64
	NVLinkDomain string
}

// FakeHardware is simulated hardware: GPUs that answer, XIDs injected on demand, commands made
// slow or failing at will.
type FakeHardware struct {
	Host      string
	GPUs      []FakeGPU
	VCPUs     int
	MemoryGiB int

	mu       sync.Mutex
	events   chan *agentv1.GPUEvent
	delay    time.Duration
	fail     error
	resets   map[int]int
	pressure *agentv1.HostPressure
	health   map[int]string
}

// NewFakeHardware returns a machine with n GPUs of one model, all in one NVLink domain.
func NewFakeHardware(host string, n int, model string) *FakeHardware {
	h := &FakeHardware{Host: host, VCPUs: 64, MemoryGiB: 512, events: make(chan *agentv1.GPUEvent, 64),
		resets: map[int]int{}, health: map[int]string{}}
	for range n {
		h.GPUs = append(h.GPUs, FakeGPU{Name: model, MemoryMiB: 81559, NVLinkDomain: host + "-nvl"})
	}
	return h
}

// Inventory implements Hardware.
func (h *FakeHardware) Inventory(context.Context) (*agentv1.Inventory, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	inv := &agentv1.Inventory{Vcpus: int32(h.VCPUs), MemoryGib: int32(h.MemoryGiB)}
	for i, g := range h.GPUs {
		health := h.health[i]
		if health == "" {
			health = "healthy"
		}
		inv.Gpus = append(inv.Gpus, &agentv1.GPU{Index: int32(i), Uuid: h.uuid(i), Name: g.Name, MemoryMib: g.MemoryMiB,
			PciAddress: fmt.Sprintf("0000:%02x:00.0", 0x10+i), NvlinkDomain: g.NVLinkDomain, Health: health, TemperatureC: 40, PowerW: 90})
	}
	if len(h.GPUs) == 0 {
		inv.GpuStatus = "no GPUs"
	}
	return inv, nil
}

func (h *FakeHardware) uuid(i int) string { return fmt.Sprintf("GPU-fake-%s-%d", h.Host, i) }

// ResetGPU implements Hardware: it clears the GPU's injected faults.
func (h *FakeHardware) ResetGPU(ctx context.Context, index int) error {
	if err := h.work(ctx); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if index < 0 || index >= len(h.GPUs) {
		return fmt.Errorf("no GPU %d", index)
	}
	h.resets[index]++
	delete(h.health, index)
	return nil
}

// Resets is how many times GPU index was reset.
func (h *FakeHardware) Resets(index int) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.resets[index]
}

// HealthCheck implements Hardware.
func (h *FakeHardware) HealthCheck(ctx context.Context) (map[string]any, error) {
	if err := h.work(ctx); err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return map[string]any{"gpus": len(h.GPUs), "unhealthy": len(h.health)}, nil
}

// Diag implements Hardware.
func (h *FakeHardware) Diag(ctx context.Context, test string, _ int) (map[string]any, error) {
	if err := h.work(ctx); err != nil {
		return nil, err
	}
	return map[string]any{"test": test, "passed": true}, nil
}

// Events implements Hardware.
func (h *FakeHardware) Events() <-chan *agentv1.GPUEvent { return h.events }

// Pressure implements Hardware.
func (h *FakeHardware) Pressure() *agentv1.HostPressure {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.pressure
}

// InjectXID reports an XID on a GPU; a critical one also makes the GPU report unhealthy until
// it is reset.
func (h *FakeHardware) InjectXID(index int, xid int32) {
	h.mu.Lock()
	if xid == 48 || xid == 79 || xid == 94 || xid == 95 || xid == 63 || xid == 64 || xid == 74 || xid == 92 {
		h.health[index] = "unhealthy"
	}
	uuid := h.uuid(index)
	h.mu.Unlock()
	h.events <- &agentv1.GPUEvent{Index: int32(index), Uuid: uuid, Kind: "xid", Xid: xid,
		Detail: fmt.Sprintf("Xid %d injected", xid), At: timestamppb.Now()}
}

// SetPressure sets the host pressure reported with heartbeats.
func (h *FakeHardware) SetPressure(p *agentv1.HostPressure) {
	h.mu.Lock()
	h.pressure = p
	h.mu.Unlock()
}

// SlowCommands makes every command take d; FailCommands makes them fail with err (nil: succeed).
func (h *FakeHardware) SlowCommands(d time.Duration) {
	h.mu.Lock()
	h.delay = d
	h.mu.Unlock()
}

// FailCommands makes every command fail with err; nil lets them succeed again.
func (h *FakeHardware) FailCommands(err error) {
	h.mu.Lock()
	h.fail = err
	h.mu.Unlock()
}

func (h *FakeHardware) work(ctx context.Context) error {
	h.mu.Lock()
	d, fail := h.delay, h.fail
	h.mu.Unlock()
	if d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return errors.New("timed out")
		}
	}
	return fail
}

// Converger applies desired state on the node (the devices converger writes CDI specs).
type Converger interface {
	Apply(ctx context.Context, ds *agentv1.DesiredState) error
}

// RecordingConverger applies nothing and remembers the last state, for simulation.
type RecordingConverger struct {
	mu   sync.Mutex
	last *agentv1.DesiredState
}

// Apply implements Converger.
func (c *RecordingConverger) Apply(_ context.Context, ds *agentv1.DesiredState) error {
	c.mu.Lock()
	c.last = ds
	c.mu.Unlock()
	return nil
}

// Last is the last state applied.
func (c *RecordingConverger) Last() *agentv1.DesiredState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// MaxGPUIndex bounds a GPU index in a command: no machine has more GPUs.
const MaxGPUIndex = 1023

// MaxDiagSeconds bounds how long a diag.run may be asked to take.
const MaxDiagSeconds = 24 * 3600

// CommandArgs are a command's arguments as the node reads them, checked.
type CommandArgs struct {
	GPU     int    // gpu.reset
	Force   bool   // gpu.reset
	Test    string // diag.run: quick, medium or long
	Seconds int    // diag.run
}

// DecodeArgs reads the arguments of a command of kind. The control plane validates them too;
// the node does not rely on it: a wrong type, a fraction, a negative or huge index, or an unknown
// test is an error naming the argument. Keys it does not know are ignored (a newer server).
func DecodeArgs(kind string, args *structpb.Struct) (CommandArgs, error) {
	m := args.GetFields()
	var a CommandArgs
	switch kind {
	case "gpu.reset":
		v, ok := m["gpu"]
		if !ok {
			return a, errors.New("gpu.reset needs args.gpu")
		}
		n, err := intArg("gpu", v, 0, MaxGPUIndex)
		if err != nil {
			return a, err
		}
		a.GPU = n
		if f, ok := m["force"]; ok {
			b, isBool := f.GetKind().(*structpb.Value_BoolValue)
			if !isBool {
				return a, errors.New("args.force must be true or false")
			}
			a.Force = b.BoolValue
		}
	case "diag.run":
		a.Test = "quick"
		if t, ok := m["test"]; ok {
			sv, isStr := t.GetKind().(*structpb.Value_StringValue)
			if !isStr || (sv.StringValue != "quick" && sv.StringValue != "medium" && sv.StringValue != "long") {
				return a, errors.New("args.test must be quick, medium or long")
			}
			a.Test = sv.StringValue
		}
		if v, ok := m["seconds"]; ok {
			n, err := intArg("seconds", v, 0, MaxDiagSeconds)
			if err != nil {
				return a, err
			}
			a.Seconds = n
		}
	}
	return a, nil
}

func intArg(name string, v *structpb.Value, lo, hi int) (int, error) {
	nv, ok := v.GetKind().(*structpb.Value_NumberValue)
	if !ok {
		return 0, fmt.Errorf("args.%s must be a number", name)
	}
	f := nv.NumberValue
	if math.IsNaN(f) || f != math.Trunc(f) || f < float64(lo) || f > float64(hi) {
		return 0, fmt.Errorf("args.%s must be a whole number from %d to %d, got %v", name, lo, hi, f)
	}
	return int(f), nil
}
