//go:build cgo

// Package nvmltest is go-nvml's mock of a MIG-capable machine (pkg/nvml/mock/server, as
// dgxh100.New makes it) with what that mock leaves out filled in, as NVML behaves on a real GPU,
// for bcd's tests. It is not a GPU: what it does is what this package and go-nvml's mock say.
//
// What go-nvml v0.13.4-1's mock does not do, and this package adds:
//   - MIG devices: GetMaxMigDeviceCount and GetMigDeviceHandleByIndex are unset in the mock;
//     here each compute instance is a MIG device with a UUID (MIG-…) and its GPU and compute
//     instance ids;
//   - refusals: the mock makes a GPU instance outside MIG mode, at a start its profile may not
//     take, or over another instance, and destroys a GPU instance that still has compute
//     instances, and leaves MIG mode with instances in it; NVML refuses all of these;
//   - a mode change that waits for a GPU reset (ResetRequired): the mock's pending mode is
//     always its current one;
//   - ErrorString, which the mock leaves unset, and what an inventory reads that it leaves
//     unset or empty: temperature (41 C), power (95 W), the PCI bus id, NVLinks (none up).
//
// Still not covered, by the mock or here: profile names from the driver
// (nvmlDeviceGetGpuInstanceProfileInfoV, whose handler only the real library answers), a GPU
// reset, and the mock's placements are not a real H100's (its 3g and 7g profiles are 3 and 7
// memory slices wide, not 4 and 8).
package nvmltest

import (
	"fmt"
	"sort"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// Machine is a mock NVML machine whose GPUs do MIG as NVML does.
type Machine struct {
	*server.Server

	mu      sync.Mutex
	pending map[int]int // GPU index → the mode after a reset, while one is awaited
	uuids   map[*server.ComputeInstance]string
	calls   map[string]int
	// ResetRequired makes a MIG mode change wait for a GPU reset, as on an A100 in use, or in a
	// virtual machine that cannot reset the GPU alone. Reset applies it.
	ResetRequired bool
}

// New fills in srv (e.g. dgxh100.New()) and returns it as a Machine.
func New(srv *server.Server) *Machine {
	m := &Machine{Server: srv, pending: map[int]int{}, uuids: map[*server.ComputeInstance]string{}, calls: map[string]int{}}
	srv.ErrorStringFunc = func(r nvml.Return) string { return r.Error() }
	srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
	for i, d := range srv.Devices {
		m.fill(i, d.(*server.Device))
	}
	return m
}

// Calls counts what was asked of the machine: "create" (GPU instances), "destroy" (GPU
// instances) and "mode" (MIG mode changes).
func (m *Machine) Calls(what string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls[what]
}

func (m *Machine) count(what string) {
	m.mu.Lock()
	m.calls[what]++
	m.mu.Unlock()
}

// Device is GPU i of the mock.
func (m *Machine) Device(i int) *server.Device { return m.Devices[i].(*server.Device) }

// Reset applies a pending MIG mode change of GPU i, as a GPU reset does.
func (m *Machine) Reset(i int) {
	m.mu.Lock()
	mode, ok := m.pending[i]
	delete(m.pending, i)
	m.mu.Unlock()
	if ok {
		d := m.Device(i)
		d.Lock()
		d.MigMode = mode
		d.Unlock()
	}
}

func (m *Machine) fill(index int, d *server.Device) {
	d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 41, nvml.SUCCESS }
	d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 95_000, nvml.SUCCESS }
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		var p nvml.PciInfo
		for i, c := range d.PciBusID {
			p.BusId[i] = int8(c)
		}
		return p, nvml.SUCCESS
	}
	d.GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) { return nvml.FEATURE_DISABLED, nvml.SUCCESS }
	d.GetMigModeFunc = func() (int, int, nvml.Return) {
		d.RLock()
		cur := d.MigMode
		d.RUnlock()
		m.mu.Lock()
		defer m.mu.Unlock()
		if p, ok := m.pending[index]; ok {
			return cur, p, nvml.SUCCESS
		}
		return cur, cur, nvml.SUCCESS
	}
	d.SetMigModeFunc = func(mode int) (nvml.Return, nvml.Return) {
		m.count("mode")
		d.Lock()
		defer d.Unlock()
		if mode == nvml.DEVICE_MIG_DISABLE && len(d.GpuInstances) > 0 {
			return nvml.ERROR_IN_USE, nvml.ERROR_IN_USE
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.ResetRequired && d.MigMode != mode {
			m.pending[index] = mode
			return nvml.SUCCESS, nvml.ERROR_RESET_REQUIRED
		}
		delete(m.pending, index)
		d.MigMode = mode
		return nvml.SUCCESS, nvml.SUCCESS
	}
	create := d.CreateGpuInstanceWithPlacementFunc
	d.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, p *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		m.count("create")
		if ret := m.admit(d, info, p); ret != nvml.SUCCESS {
			return nil, ret
		}
		gi, ret := create(info, p)
		if ret != nvml.SUCCESS {
			return gi, ret
		}
		g := gi.(*server.GpuInstance)
		destroy := g.DestroyFunc
		g.DestroyFunc = func() nvml.Return {
			m.count("destroy")
			g.RLock()
			inUse := len(g.ComputeInstances) > 0
			g.RUnlock()
			if inUse {
				return nvml.ERROR_IN_USE
			}
			return destroy()
		}
		return gi, ret
	}
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	d.GetMigDeviceHandleByIndexFunc = func(k int) (nvml.Device, nvml.Return) {
		devs := m.migDevices(index, d)
		if k < 0 || k >= len(devs) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return devs[k], nvml.SUCCESS
	}
}

// admit refuses what NVML refuses: an instance outside MIG mode, at a start the profile may not
// take, or over another instance.
func (m *Machine) admit(d *server.Device, info *nvml.GpuInstanceProfileInfo, p *nvml.GpuInstancePlacement) nvml.Return {
	d.RLock()
	defer d.RUnlock()
	if d.MigMode != nvml.DEVICE_MIG_ENABLE {
		return nvml.ERROR_NOT_SUPPORTED
	}
	ok := false
	for _, q := range d.Config.MIGProfiles.GpuInstancePlacements[int(info.Id)] {
		ok = ok || q == *p
	}
	if !ok {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	for gi := range d.GpuInstances {
		q := gi.Info.Placement
		if p.Start < q.Start+q.Size && q.Start < p.Start+p.Size {
			return nvml.ERROR_INSUFFICIENT_RESOURCES
		}
	}
	return nvml.SUCCESS
}

// migDevices are GPU index's MIG devices, one per compute instance, in the order of their GPU
// and compute instance ids.
func (m *Machine) migDevices(index int, d *server.Device) []nvml.Device {
	d.RLock()
	gis := make([]*server.GpuInstance, 0, len(d.GpuInstances))
	for gi := range d.GpuInstances {
		gis = append(gis, gi)
	}
	d.RUnlock()
	sort.Slice(gis, func(a, b int) bool { return gis[a].Info.Id < gis[b].Info.Id })
	var out []nvml.Device
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, gi := range gis {
		gi.RLock()
		cis := make([]*server.ComputeInstance, 0, len(gi.ComputeInstances))
		for ci := range gi.ComputeInstances {
			cis = append(cis, ci)
		}
		gi.RUnlock()
		sort.Slice(cis, func(a, b int) bool { return cis[a].Info.Id < cis[b].Info.Id })
		for _, ci := range cis {
			uuid, ok := m.uuids[ci]
			if !ok {
				// NVML's MIG UUIDs are new for every instance made, and never reused.
				uuid = fmt.Sprintf("MIG-%08x-mock-gpu%d-gi%d-ci%d", len(m.uuids)+1, index, gi.Info.Id, ci.Info.Id)
				m.uuids[ci] = uuid
			}
			giID, ciID := int(gi.Info.Id), int(ci.Info.Id)
			out = append(out, &mock.Device{
				GetUUIDFunc:              func() (string, nvml.Return) { return uuid, nvml.SUCCESS },
				GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return giID, nvml.SUCCESS },
				GetComputeInstanceIdFunc: func() (int, nvml.Return) { return ciID, nvml.SUCCESS },
			})
		}
	}
	return out
}
