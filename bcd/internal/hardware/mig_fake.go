package hardware

import (
	"fmt"
	"sort"
	"sync"
)

// H100MIGProfiles are the MIG profiles of an H100 80GB as NVIDIA documents them (the MIG user
// guide's placements: eight memory slices, seven compute slices), FakeMIG's default.
var H100MIGProfiles = []MIGProfile{
	{Name: "1g.10gb", ID: 0, Size: 1, Starts: []int{0, 1, 2, 3, 4, 5, 6}},
	{Name: "1g.20gb", ID: 9, Size: 2, Starts: []int{0, 2, 4, 6}},
	{Name: "2g.20gb", ID: 1, Size: 2, Starts: []int{0, 2, 4}},
	{Name: "3g.40gb", ID: 2, Size: 4, Starts: []int{0, 4}},
	{Name: "4g.40gb", ID: 3, Size: 4, Starts: []int{0}},
	{Name: "7g.80gb", ID: 4, Size: 8, Starts: []int{0}},
}

// FakeMIG is MIG on simulated GPUs, for tests and `bcd node --fake-gpus`: modes change at once
// (unless ResetRequired), instances refuse to overlap, as NVML's do, and MIG devices get UUIDs.
// Its zero value has no GPUs; NewFakeMIG makes one with some.
type FakeMIG struct {
	mu    sync.Mutex
	gpus  []*fakeMIGGPU
	next  int // GPU instance ids and UUIDs are never reused, as NVML's UUIDs are not
	calls map[string]int
	// ResetRequired makes mode changes wait for a reset that never comes. Set it before use.
	ResetRequired bool
}

type fakeMIGGPU struct {
	capable   bool
	enabled   bool
	pending   bool
	profiles  []MIGProfile
	instances []MIGInstance
}

// NewFakeMIG is n MIG-capable GPUs with the H100's profiles, MIG mode disabled.
func NewFakeMIG(n int) *FakeMIG {
	f := &FakeMIG{calls: map[string]int{}}
	for range n {
		f.gpus = append(f.gpus, &fakeMIGGPU{capable: true, profiles: H100MIGProfiles})
	}
	return f
}

// SetCapable makes GPU gpu able to do MIG or not.
func (f *FakeMIG) SetCapable(gpu int, capable bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gpus[gpu].capable = capable
}

func (f *FakeMIG) gpu(i int) (*fakeMIGGPU, error) {
	if i < 0 || i >= len(f.gpus) {
		return nil, fmt.Errorf("fake MIG: no GPU %d", i)
	}
	return f.gpus[i], nil
}

// MIGState implements MIG.
func (f *FakeMIG) MIGState(gpu int) (MIGState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	g, err := f.gpu(gpu)
	if err != nil || !g.capable {
		return MIGState{}, err
	}
	st := MIGState{Capable: true, Enabled: g.enabled, PendingEnabled: g.pending, Profiles: g.profiles}
	st.Instances = append(st.Instances, g.instances...)
	sort.Slice(st.Instances, func(a, b int) bool { return st.Instances[a].Start < st.Instances[b].Start })
	return st, nil
}

// SetMIGMode implements MIG.
func (f *FakeMIG) SetMIGMode(gpu int, enabled bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.count("mode")
	g, err := f.gpu(gpu)
	if err != nil {
		return err
	}
	if !g.capable {
		return fmt.Errorf("fake MIG: GPU %d cannot do MIG", gpu)
	}
	if !enabled && len(g.instances) > 0 {
		return fmt.Errorf("fake MIG: GPU %d: MIG instances exist: in use", gpu)
	}
	g.pending = enabled
	if f.ResetRequired && g.enabled != enabled {
		return fmt.Errorf("%w: fake GPU %d", ErrMIGResetRequired, gpu)
	}
	g.enabled = enabled
	return nil
}

// CreateMIGInstance implements MIG.
func (f *FakeMIG) CreateMIGInstance(gpu int, profile string, start int) (MIGInstance, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.count("create")
	g, err := f.gpu(gpu)
	if err != nil {
		return MIGInstance{}, err
	}
	st := MIGState{Capable: g.capable, Profiles: g.profiles}
	p, ok := st.Profile(profile)
	switch {
	case !g.enabled:
		return MIGInstance{}, fmt.Errorf("fake MIG: GPU %d is not in MIG mode", gpu)
	case !ok:
		return MIGInstance{}, profileError(gpu, profile, st)
	case !p.CanStart(start):
		return MIGInstance{}, placementError(gpu, p, start)
	}
	for _, in := range g.instances {
		q, _ := st.Profile(in.Profile)
		if start < in.Start+q.Size && in.Start < start+p.Size {
			return MIGInstance{}, fmt.Errorf("fake MIG: GPU %d: %s at %d overlaps %s: insufficient resources", gpu, profile, start, in)
		}
	}
	f.next++
	in := MIGInstance{GPU: gpu, Profile: profile, Start: start, GI: f.next, CI: 0, ComputeInstances: 1,
		UUID: fmt.Sprintf("MIG-fake-%d-%d", gpu, f.next)}
	g.instances = append(g.instances, in)
	return in, nil
}

// DestroyMIGInstance implements MIG.
func (f *FakeMIG) DestroyMIGInstance(gpu, gi int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.count("destroy")
	g, err := f.gpu(gpu)
	if err != nil {
		return err
	}
	for i, in := range g.instances {
		if in.GI == gi {
			g.instances = append(g.instances[:i], g.instances[i+1:]...)
			return nil
		}
	}
	return nil
}

func (f *FakeMIG) count(what string) {
	if f.calls == nil {
		f.calls = map[string]int{}
	}
	f.calls[what]++
}

// Calls counts what was asked of the fake: "create", "destroy" or "mode".
func (f *FakeMIG) Calls(what string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[what]
}
