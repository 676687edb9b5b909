//go:build cgo

package hardware

import (
	"fmt"
	"sort"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

var _ MIG = (*NVML)(nil)

// nvmlProfile is a MIG profile with what NVML needs to make an instance of it.
type nvmlProfile struct {
	MIGProfile
	info       nvml.GpuInstanceProfileInfo
	placements []nvml.GpuInstancePlacement
}

// profileSuffix names the variants of a slice count (NVIDIA's names, nvidia-smi mig -lgip).
var profileSuffix = map[int]string{
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1:   "+me",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:   "+me",
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX:    "+gfx",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX:    "+gfx",
	nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX:    "+gfx",
	nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX:    "+gfx",
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME:  "-me",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:  "-me",
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME: "+me.all",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME: "+me.all",
}

// derivedName is a profile's name from its size: compute slices, then memory in GiB rounded up
// (an H100's 3-slice profile of 39.5 GiB is 3g.40gb). The driver's own name is preferred where
// it answers; this is what a mock, or a driver without nvmlDeviceGetGpuInstanceProfileInfoV, gets.
func derivedName(id int, info nvml.GpuInstanceProfileInfo) string {
	gib := (info.MemorySizeMB + 1023) / 1024
	return fmt.Sprintf("%dg.%dgb%s", info.SliceCount, gib, profileSuffix[id])
}

// driverName is the profile's name as the driver gives it ("MIG 3g.40gb"), without "MIG ".
func (g *NVML) driverName(d nvml.Device, id int) string {
	if !g.driverNames || g.lib.Extensions().LookupSymbol("nvmlDeviceGetGpuInstanceProfileInfoV") != nil {
		return ""
	}
	info, ret := d.GetGpuInstanceProfileInfoV(id).V2()
	if ret != nvml.SUCCESS {
		return ""
	}
	b := make([]byte, 0, len(info.Name))
	for _, c := range info.Name {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return strings.TrimPrefix(strings.TrimSpace(string(b)), "MIG ")
}

// dev is GPU i's handle.
func (g *NVML) dev(i int) (nvml.Device, error) {
	g.devMu.RLock()
	defer g.devMu.RUnlock()
	if i < 0 || i >= len(g.devices) {
		return nil, fmt.Errorf("nvml: this machine has no GPU %d", i)
	}
	return g.devices[i], nil
}

// profiles lists the GPU instance profiles d offers, with their placements.
func (g *NVML) profiles(d nvml.Device) []nvmlProfile {
	var out []nvmlProfile
	for id := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := d.GetGpuInstanceProfileInfo(id)
		if ret != nvml.SUCCESS || info.InstanceCount == 0 {
			continue // not offered by this GPU, or unknown to this driver
		}
		p := nvmlProfile{info: info}
		p.ID, p.Name = id, g.driverName(d, id)
		if p.Name == "" {
			p.Name = derivedName(id, info)
		}
		if pl, ret := d.GetGpuInstancePossiblePlacements(&info); ret == nvml.SUCCESS {
			p.placements = pl
			for _, x := range pl {
				p.Starts = append(p.Starts, int(x.Start))
				p.Size = int(x.Size)
			}
		}
		out = append(out, p)
	}
	return out
}

// MIGState implements MIG.
func (g *NVML) MIGState(gpu int) (MIGState, error) {
	d, err := g.dev(gpu)
	if err != nil {
		return MIGState{}, err
	}
	cur, pending, ret := d.GetMigMode()
	if ret == nvml.ERROR_NOT_SUPPORTED {
		return MIGState{}, nil
	}
	if ret != nvml.SUCCESS {
		return MIGState{}, fmt.Errorf("nvml: GPU %d: read the MIG mode: %s", gpu, g.lib.ErrorString(ret))
	}
	st := MIGState{Capable: true, Enabled: cur == nvml.DEVICE_MIG_ENABLE, PendingEnabled: pending == nvml.DEVICE_MIG_ENABLE}
	profiles := g.profiles(d)
	for _, p := range profiles {
		st.Profiles = append(st.Profiles, p.MIGProfile)
	}
	if !st.Enabled {
		return st, nil // no instances exist outside MIG mode
	}
	uuids := g.migDevices(d)
	for _, p := range profiles {
		gis, ret := d.GetGpuInstances(&p.info)
		if ret == nvml.ERROR_NOT_SUPPORTED {
			continue // a profile that cannot have instances now has none
		}
		if ret != nvml.SUCCESS {
			return st, fmt.Errorf("nvml: GPU %d: list the %s instances: %s", gpu, p.Name, g.lib.ErrorString(ret))
		}
		for _, gi := range gis {
			in, err := g.instance(gpu, p.Name, gi, uuids)
			if err != nil {
				return st, err
			}
			st.Instances = append(st.Instances, in)
		}
	}
	sort.Slice(st.Instances, func(a, b int) bool { return st.Instances[a].Start < st.Instances[b].Start })
	return st, nil
}

// instance describes a GPU instance and its compute instances.
func (g *NVML) instance(gpu int, profile string, gi nvml.GpuInstance, uuids map[[2]int]string) (MIGInstance, error) {
	info, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return MIGInstance{}, fmt.Errorf("nvml: GPU %d: read a %s instance: %s", gpu, profile, g.lib.ErrorString(ret))
	}
	in := MIGInstance{GPU: gpu, Profile: profile, Start: int(info.Placement.Start), GI: int(info.Id), CI: -1}
	cis, err := g.computeInstances(gi)
	if err != nil {
		return in, fmt.Errorf("nvml: GPU %d: %s: %w", gpu, in, err)
	}
	in.ComputeInstances = len(cis)
	if len(cis) > 0 {
		ci, ret := cis[0].GetInfo()
		if ret != nvml.SUCCESS {
			return in, fmt.Errorf("nvml: GPU %d: %s: read its compute instance: %s", gpu, in, g.lib.ErrorString(ret))
		}
		in.CI = int(ci.Id)
		in.UUID = uuids[[2]int{in.GI, in.CI}]
	}
	return in, nil
}

// computeInstances lists a GPU instance's compute instances, of every profile.
func (g *NVML) computeInstances(gi nvml.GpuInstance) ([]nvml.ComputeInstance, error) {
	var out []nvml.ComputeInstance
	for id := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		info, ret := gi.GetComputeInstanceProfileInfo(id, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			continue
		}
		cis, ret := gi.GetComputeInstances(&info)
		if ret == nvml.ERROR_NOT_SUPPORTED {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("list the compute instances: %s", g.lib.ErrorString(ret))
		}
		out = append(out, cis...)
	}
	return out, nil
}

// migDevices maps (GPU instance, compute instance) to the UUID of its MIG device.
func (g *NVML) migDevices(d nvml.Device) map[[2]int]string {
	out := map[[2]int]string{}
	n, ret := d.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return out
	}
	for k := range n {
		m, ret := d.GetMigDeviceHandleByIndex(k)
		if ret != nvml.SUCCESS {
			continue // an index with no MIG device behind it
		}
		gi, r1 := m.GetGpuInstanceId()
		ci, r2 := m.GetComputeInstanceId()
		uuid, r3 := m.GetUUID()
		if r1 == nvml.SUCCESS && r2 == nvml.SUCCESS && r3 == nvml.SUCCESS {
			out[[2]int{gi, ci}] = uuid
		}
	}
	return out
}

// SetMIGMode implements MIG.
func (g *NVML) SetMIGMode(gpu int, enabled bool) error {
	d, err := g.dev(gpu)
	if err != nil {
		return err
	}
	mode, word := nvml.DEVICE_MIG_DISABLE, "disable"
	if enabled {
		mode, word = nvml.DEVICE_MIG_ENABLE, "enable"
	}
	ret, activation := d.SetMigMode(mode)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("nvml: GPU %d: %s MIG mode: %s", gpu, word, g.lib.ErrorString(ret))
	}
	// NVML may reset or rebind the GPU to change its mode, after which a handle's attributes
	// must be read again: take a fresh handle.
	if fresh, ret := g.lib.DeviceGetHandleByIndex(gpu); ret == nvml.SUCCESS {
		g.devMu.Lock()
		g.devices[gpu] = fresh
		g.devMu.Unlock()
		d = fresh
	}
	cur, _, ret := d.GetMigMode()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("nvml: GPU %d: read the MIG mode after setting it: %s", gpu, g.lib.ErrorString(ret))
	}
	if cur != mode {
		return fmt.Errorf("%w: GPU %d: %s MIG mode is pending (%s): reset the GPU (the gpu.reset command) or reboot the machine",
			ErrMIGResetRequired, gpu, word, g.lib.ErrorString(activation))
	}
	return nil
}

// CreateMIGInstance implements MIG.
func (g *NVML) CreateMIGInstance(gpu int, profile string, start int) (MIGInstance, error) {
	d, err := g.dev(gpu)
	if err != nil {
		return MIGInstance{}, err
	}
	var p *nvmlProfile
	profiles := g.profiles(d)
	st := MIGState{Capable: true}
	for i := range profiles {
		st.Profiles = append(st.Profiles, profiles[i].MIGProfile)
		if profiles[i].Name == profile {
			p = &profiles[i]
		}
	}
	if p == nil {
		return MIGInstance{}, profileError(gpu, profile, st)
	}
	var placement *nvml.GpuInstancePlacement
	for i := range p.placements {
		if int(p.placements[i].Start) == start {
			placement = &p.placements[i]
		}
	}
	if placement == nil {
		return MIGInstance{}, placementError(gpu, p.MIGProfile, start)
	}
	gi, ret := d.CreateGpuInstanceWithPlacement(&p.info, placement)
	if ret != nvml.SUCCESS {
		return MIGInstance{}, fmt.Errorf("nvml: GPU %d: create a %s GPU instance at %d: %s", gpu, profile, start, g.lib.ErrorString(ret))
	}
	if err := g.createComputeInstance(gi); err != nil {
		// A GPU instance without its compute instance is no MIG device: undo it, so that the
		// next attempt starts from nothing.
		if ret := gi.Destroy(); ret != nvml.SUCCESS {
			err = fmt.Errorf("%w; and destroying the GPU instance again: %s", err, g.lib.ErrorString(ret))
		}
		return MIGInstance{}, fmt.Errorf("nvml: GPU %d: %s at %d: %w", gpu, profile, start, err)
	}
	in, err := g.instance(gpu, profile, gi, g.migDevices(d))
	if err != nil {
		return in, err
	}
	if in.UUID == "" {
		return in, fmt.Errorf("nvml: GPU %d: %s: NVML lists no MIG device for it", gpu, in)
	}
	return in, nil
}

// createComputeInstance makes the one compute instance that spans gi: the compute profile with
// the most slices the GPU instance offers.
func (g *NVML) createComputeInstance(gi nvml.GpuInstance) error {
	var best *nvml.ComputeInstanceProfileInfo
	for id := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		info, ret := gi.GetComputeInstanceProfileInfo(id, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			continue
		}
		if best == nil || info.SliceCount > best.SliceCount {
			best = &info
		}
	}
	if best == nil {
		return fmt.Errorf("the GPU instance offers no compute instance profile")
	}
	if _, ret := gi.CreateComputeInstance(best); ret != nvml.SUCCESS {
		return fmt.Errorf("create its compute instance: %s", g.lib.ErrorString(ret))
	}
	return nil
}

// DestroyMIGInstance implements MIG.
func (g *NVML) DestroyMIGInstance(gpu, id int) error {
	d, err := g.dev(gpu)
	if err != nil {
		return err
	}
	for _, p := range g.profiles(d) {
		gis, ret := d.GetGpuInstances(&p.info)
		if ret != nvml.SUCCESS {
			continue
		}
		for _, gi := range gis {
			info, ret := gi.GetInfo()
			if ret != nvml.SUCCESS || int(info.Id) != id {
				continue
			}
			cis, err := g.computeInstances(gi)
			if err != nil {
				return fmt.Errorf("nvml: GPU %d: GPU instance %d: %w", gpu, id, err)
			}
			for _, ci := range cis {
				if ret := ci.Destroy(); ret != nvml.SUCCESS {
					return fmt.Errorf("nvml: GPU %d: destroy a compute instance of GPU instance %d: %s", gpu, id, g.lib.ErrorString(ret))
				}
			}
			if ret := gi.Destroy(); ret != nvml.SUCCESS {
				return fmt.Errorf("nvml: GPU %d: destroy GPU instance %d: %s", gpu, id, g.lib.ErrorString(ret))
			}
			return nil
		}
	}
	return nil // already gone
}
