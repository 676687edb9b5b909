//go:build cgo

package hardware

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/better-compute/compute/agent/v1"
)

// criticalXIDs make a GPU unhealthy until it is reset (as the gateway also judges them).
var criticalXIDs = map[uint64]bool{48: true, 63: true, 64: true, 74: true, 79: true, 92: true, 94: true, 95: true, 119: true, 120: true}

// NVML is the GPUs of a machine, read through NVML. After a failed Init it is never touched
// again: a call into a library that did not load ends the process.
type NVML struct {
	lib    nvml.Interface
	events chan *agentv1.GPUEvent
	stop   chan struct{}
	wg     sync.WaitGroup
	// driverNames takes MIG profiles' names from the driver (nvmlDeviceGetGpuInstanceProfileInfoV),
	// which only the real library answers; a mock's are derived from the profiles' sizes.
	driverNames bool

	devMu   sync.RWMutex
	devices []nvml.Device // by index; a MIG mode change may replace a handle

	mu     sync.Mutex
	faults map[int]string // health set by events, until a reset
}

// SystemNVML is the machine's NVML library (libnvidia-ml.so.1, loaded when Init runs).
func SystemNVML() nvml.Interface { return nvml.New() }

// OpenNVML initializes lib. Without NVML (no library, no driver, no GPU) it returns NoGPUs with
// the reason, and lib is left alone from then on.
func OpenNVML(lib nvml.Interface) (GPUs, error) { return openNVML(lib, false) }

func openNVML(lib nvml.Interface, driverNames bool) (GPUs, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		why := "NVML not found: no NVIDIA driver (libnvidia-ml.so.1) on this machine"
		if ret != nvml.ERROR_LIBRARY_NOT_FOUND {
			why = "NVML did not initialize: " + lib.ErrorString(ret)
		}
		return NoGPUs{Why: why}, nil
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml: device count: %s", lib.ErrorString(ret))
	}
	g := &NVML{lib: lib, faults: map[int]string{}, stop: make(chan struct{}), driverNames: driverNames}
	for i := range n {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml: GPU %d: %s", i, lib.ErrorString(ret))
		}
		g.devices = append(g.devices, d)
	}
	g.startEvents()
	return g, nil
}

// Close stops reading events and shuts NVML down.
func (g *NVML) Close() {
	close(g.stop)
	g.wg.Wait()
	g.lib.Shutdown()
}

// Inventory implements GPUs.
func (g *NVML) Inventory() ([]*agentv1.GPU, string) {
	var out []*agentv1.GPU
	devices := g.handles()
	for i, d := range devices {
		gpu := &agentv1.GPU{Index: int32(i), Health: "healthy"}
		if v, ret := d.GetName(); ret == nvml.SUCCESS {
			gpu.Name = v
		}
		if v, ret := d.GetUUID(); ret == nvml.SUCCESS {
			gpu.Uuid = v
		}
		if m, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			gpu.MemoryMib = int64(m.Total >> 20)
		}
		if p, ret := d.GetPciInfo(); ret == nvml.SUCCESS {
			gpu.PciAddress = busID(p)
		}
		if t, ret := d.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
			gpu.TemperatureC = int32(t)
		}
		if p, ret := d.GetPowerUsage(); ret == nvml.SUCCESS {
			gpu.PowerW = int32(p / 1000)
		}
		if cur, _, ret := d.GetMigMode(); ret == nvml.SUCCESS {
			gpu.MigEnabled = cur == nvml.DEVICE_MIG_ENABLE
		}
		g.mu.Lock()
		if h := g.faults[i]; h != "" {
			gpu.Health = h
		}
		g.mu.Unlock()
		out = append(out, gpu)
	}
	domains := g.nvlinkDomains(devices)
	for _, gpu := range out {
		gpu.NvlinkDomain = domains[int(gpu.Index)]
	}
	if len(out) == 0 {
		return nil, "NVML found no GPUs"
	}
	return out, ""
}

// busID is a PCI address as a lowercase string, 0000:17:00.0.
func busID(p nvml.PciInfo) string {
	b := make([]byte, 0, len(p.BusIdLegacy))
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	s := strings.ToLower(string(b))
	// NVML writes an 8-digit domain; the kernel and most tools use 4.
	if len(s) == 16 && strings.HasPrefix(s, "0000") {
		s = s[4:]
	}
	return s
}

// nvlinkDomains groups GPUs connected by NVLink, directly or through NVSwitches: each group is
// named after its lowest PCI address. A GPU without active links has no domain.
func (g *NVML) nvlinkDomains(devices []nvml.Device) map[int]string {
	bus := map[string]int{}
	addr := make([]string, len(devices))
	for i, d := range devices {
		if p, ret := d.GetPciInfo(); ret == nvml.SUCCESS {
			addr[i] = busID(p)
			bus[addr[i]] = i
		}
	}
	parent := make([]int, len(devices)+1) // the last is "an NVSwitch"
	for i := range parent {
		parent[i] = i
	}
	find := func(x int) int {
		for parent[x] != x {
			parent[x] = parent[parent[x]]
			x = parent[x]
		}
		return x
	}
	union := func(a, b int) { parent[find(a)] = find(b) }
	linked := map[int]bool{}
	switchNode := len(devices)
	for i, d := range devices {
		for link := range nvml.NVLINK_MAX_LINKS {
			state, ret := d.GetNvLinkState(link)
			if ret != nvml.SUCCESS || state != nvml.FEATURE_ENABLED {
				continue
			}
			remote, ret := d.GetNvLinkRemotePciInfo(link)
			if ret != nvml.SUCCESS {
				continue
			}
			linked[i] = true
			if j, ok := bus[busID(remote)]; ok {
				union(i, j)
			} else {
				union(i, switchNode) // not a GPU: an NVSwitch, shared by every switched GPU
			}
		}
	}
	names := map[int]string{}
	out := map[int]string{}
	ids := make([]int, 0, len(devices))
	for i := range devices {
		ids = append(ids, i)
	}
	sort.Slice(ids, func(a, b int) bool { return addr[ids[a]] < addr[ids[b]] })
	for _, i := range ids {
		if !linked[i] {
			continue
		}
		root := find(i)
		if names[root] == "" {
			names[root] = "nvl-" + addr[i]
		}
		out[i] = names[root]
	}
	return out
}

// Events implements GPUs.
func (g *NVML) Events() <-chan *agentv1.GPUEvent { return g.events }

// startEvents follows XID and ECC events, when NVML supports them on these GPUs.
func (g *NVML) startEvents() {
	set, ret := g.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return
	}
	registered := 0
	for _, d := range g.devices {
		if d.RegisterEvents(nvml.EventTypeXidCriticalError|nvml.EventTypeDoubleBitEccError, set) == nvml.SUCCESS {
			registered++
		}
	}
	if registered == 0 {
		set.Free()
		return
	}
	g.events = make(chan *agentv1.GPUEvent, 64)
	index := map[string]int{}
	for i, d := range g.devices {
		if u, ret := d.GetUUID(); ret == nvml.SUCCESS {
			index[u] = i
		}
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		defer set.Free()
		for {
			select {
			case <-g.stop:
				return
			default:
			}
			data, ret := set.Wait(500)
			if ret == nvml.ERROR_TIMEOUT {
				continue
			}
			if ret != nvml.SUCCESS {
				time.Sleep(time.Second)
				continue
			}
			uuid, _ := data.Device.GetUUID()
			i := index[uuid]
			e := &agentv1.GPUEvent{Index: int32(i), Uuid: uuid, At: timestamppb.Now()}
			switch data.EventType {
			case nvml.EventTypeXidCriticalError:
				e.Kind, e.Xid, e.Detail = "xid", int32(data.EventData), fmt.Sprintf("Xid %d", data.EventData)
				if criticalXIDs[data.EventData] {
					g.fault(i, "unhealthy")
				}
			default:
				e.Kind, e.Detail = "ecc", "double-bit ECC error"
				g.fault(i, "unhealthy")
			}
			select {
			case g.events <- e:
			default: // the session is behind; the next inventory carries the health anyway
			}
		}
	}()
}

func (g *NVML) fault(i int, health string) {
	g.mu.Lock()
	g.faults[i] = health
	g.mu.Unlock()
}

// Cleared implements GPUs.
func (g *NVML) Cleared(index int) {
	g.mu.Lock()
	delete(g.faults, index)
	g.mu.Unlock()
}

// Health implements GPUs.
func (g *NVML) Health() (map[string]any, error) {
	inv, why := g.Inventory()
	gpus := make([]any, 0, len(inv))
	for _, gpu := range inv {
		gpus = append(gpus, map[string]any{"index": gpu.GetIndex(), "uuid": gpu.GetUuid(), "health": gpu.GetHealth(),
			"temperatureC": gpu.GetTemperatureC(), "powerW": gpu.GetPowerW()})
	}
	return map[string]any{"gpus": gpus, "gpuStatus": why}, nil
}

// OpenSystemGPUs is the machine's GPUs, through its NVML.
func OpenSystemGPUs() (GPUs, error) { return openNVML(SystemNVML(), true) }

// handles is a snapshot of the GPUs' handles, by index.
func (g *NVML) handles() []nvml.Device {
	g.devMu.RLock()
	defer g.devMu.RUnlock()
	return append([]nvml.Device(nil), g.devices...)
}
