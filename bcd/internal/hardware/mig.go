package hardware

import (
	"errors"
	"fmt"
	"strings"
)

// MIG makes and unmakes MIG instances on a machine's GPUs, addressed by their NVML index. It is
// the whole of what the MIG converger asks of NVML, so that a fake can stand in for it (FakeMIG,
// for tests and `bcd node --fake-gpus`). *NVML implements it; a machine without NVML has none.
type MIG interface {
	// MIGState reads a GPU's MIG mode, the profiles it offers and the instances that exist on
	// it. A GPU that cannot do MIG answers Capable false and no error.
	MIGState(gpu int) (MIGState, error)
	// SetMIGMode enables or disables MIG mode. When the change waits for a GPU reset (the
	// mode reads unchanged afterwards) it returns an error that wraps ErrMIGResetRequired.
	SetMIGMode(gpu int, enabled bool) error
	// CreateMIGInstance makes a GPU instance of profile (e.g. "3g.40gb") at placement start
	// and one compute instance spanning it, and returns the MIG device made. A profile the GPU
	// does not offer wraps ErrNoMIGProfile; a start it may not take wraps ErrMIGPlacement.
	CreateMIGInstance(gpu int, profile string, start int) (MIGInstance, error)
	// DestroyMIGInstance destroys GPU instance gi and its compute instances.
	DestroyMIGInstance(gpu, gi int) error
}

// MIGState is a GPU's MIG mode and what is made of it.
type MIGState struct {
	// Capable is whether the GPU can do MIG at all.
	Capable bool `json:"capable"`
	// Enabled is the current mode; PendingEnabled the mode after the next GPU reset. They
	// differ while a mode change waits for a reset.
	Enabled        bool `json:"enabled"`
	PendingEnabled bool `json:"pendingEnabled"`
	// Profiles are the GPU instance profiles the GPU offers.
	Profiles []MIGProfile `json:"profiles,omitempty"`
	// Instances are the GPU instances that exist, by placement start.
	Instances []MIGInstance `json:"instances,omitempty"`
}

// Profile returns the profile named name, if the GPU offers it.
func (s MIGState) Profile(name string) (MIGProfile, bool) {
	for _, p := range s.Profiles {
		if p.Name == name {
			return p, true
		}
	}
	return MIGProfile{}, false
}

// ProfileNames lists the names of the profiles the GPU offers, for messages.
func (s MIGState) ProfileNames() string {
	names := make([]string, 0, len(s.Profiles))
	for _, p := range s.Profiles {
		names = append(names, p.Name)
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// MIGProfile is a GPU instance profile a GPU offers and where an instance of it may start.
type MIGProfile struct {
	Name   string `json:"name"` // 3g.40gb, as NVIDIA names it (nvidia-smi mig -lgip without "MIG ")
	ID     int    `json:"id"`   // NVML's GPU instance profile id
	Size   int    `json:"size"` // memory slices wide, as NVML's placements count them
	Starts []int  `json:"starts"`
}

// CanStart reports whether an instance of p may start at start.
func (p MIGProfile) CanStart(start int) bool {
	for _, s := range p.Starts {
		if s == start {
			return true
		}
	}
	return false
}

// MIGInstance is a GPU instance and what runs in it: when it has exactly one compute instance,
// that is a MIG device a container can be given (by UUID).
type MIGInstance struct {
	GPU     int    `json:"gpu"`     // the parent GPU's index
	Profile string `json:"profile"` // 3g.40gb
	Start   int    `json:"start"`   // the placement start, in memory slices
	GI      int    `json:"gi"`      // the GPU instance id
	// CI is the id of the first compute instance, -1 when there is none; ComputeInstances
	// counts them (bcd makes exactly one, spanning the GPU instance).
	CI               int `json:"ci"`
	ComputeInstances int `json:"computeInstances"`
	// UUID is the MIG device's (MIG-…), what NVIDIA_VISIBLE_DEVICES names; "" without one.
	UUID string `json:"uuid,omitempty"`
}

// Usable reports whether the instance is a MIG device as bcd makes them: one compute instance,
// whose UUID NVML reports.
func (i MIGInstance) Usable() bool { return i.ComputeInstances == 1 && i.UUID != "" }

// String names the instance in messages: 3g.40gb at 4 (GPU instance 1).
func (i MIGInstance) String() string {
	return fmt.Sprintf("%s at %d (GPU instance %d)", i.Profile, i.Start, i.GI)
}

var (
	// ErrMIGResetRequired is a MIG mode change that waits for a GPU reset (or a reboot, where
	// the GPU cannot be reset alone, as in some virtual machines).
	ErrMIGResetRequired = errors.New("the MIG mode change waits for a GPU reset")
	// ErrNoMIGProfile is a MIG profile the GPU does not offer.
	ErrNoMIGProfile = errors.New("no such MIG profile on this GPU")
	// ErrMIGPlacement is a placement start a profile may not take on the GPU.
	ErrMIGPlacement = errors.New("the MIG profile cannot start there")
)

// profileError says which profile the GPU lacks and which it has.
func profileError(gpu int, profile string, st MIGState) error {
	return fmt.Errorf("%w: GPU %d has no MIG profile %q (it has %s)", ErrNoMIGProfile, gpu, profile, st.ProfileNames())
}

// placementError says where a profile may start instead.
func placementError(gpu int, p MIGProfile, start int) error {
	return fmt.Errorf("%w: on GPU %d, %s may start at %v, not %d", ErrMIGPlacement, gpu, p.Name, p.Starts, start)
}
