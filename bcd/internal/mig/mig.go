// Package mig is bcd's MIG converger: it sets each GPU's MIG mode as the desired state says, and
// makes the MIG slices the node's holds name, each a GPU instance of its profile at its
// placement start with one compute instance spanning it. What the GPUs report is the truth: an
// instance that exists and that a hold names (by GPU, profile and start) is kept, as after a
// restart of bcd; one no hold names is destroyed; a missing one is made.
package mig

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/bcd/internal/hardware"
)

// Key names a MIG slice: a profile at a placement start on a GPU.
type Key struct {
	GPU     int
	Profile string
	Start   int
}

// KeyOf is the slice a held GPU names, and whether it names one.
func KeyOf(g *agentv1.HeldGPU) (Key, bool) {
	return Key{GPU: int(g.GetIndex()), Profile: g.GetMigProfile(), Start: int(g.GetMigStart())}, g.GetMigProfile() != ""
}

// Result is what Apply made of the holds.
type Result struct {
	// Devices are the MIG devices of the slices the holds name.
	Devices map[Key]hardware.MIGInstance
	// Refused are the holders whose slices could not all be made, with why. Their devices are
	// not in Devices, and they should get nothing.
	Refused map[string]error
}

// Converger sets GPUs up for MIG through a hardware.MIG.
type Converger struct {
	gpus hardware.MIG
	log  *slog.Logger
}

// New returns a converger over gpus; logger nil means slog.Default().
func New(gpus hardware.MIG, logger *slog.Logger) (*Converger, error) {
	if gpus == nil {
		return nil, errors.New("mig: New needs the machine's GPUs (a hardware.MIG)")
	}
	if logger == nil {
		logger = slog.Default()
	}
	return &Converger{gpus: gpus, log: logger}, nil
}

// want is a hold's claim on one slice.
type want struct {
	holder string
	key    Key
}

// Apply converges the GPUs on settings (each GPU's mode) and the slices of holds, and returns the
// MIG devices the holds get. A GPU without a setting is left alone unless a hold names a slice
// of it, which implies mode mig; mode whole or timeslice disables MIG (destroying every
// instance first). The error joins everything that failed, each naming its GPU and, where
// there is one, its holder; the GPUs and holds that did not fail converge regardless.
func (c *Converger) Apply(ctx context.Context, settings []*agentv1.GPUSetting, holds []*agentv1.DeviceHold) (Result, error) {
	res := Result{Devices: map[Key]hardware.MIGInstance{}, Refused: map[string]error{}}
	modes := map[int]string{}
	uuids := map[int]string{}
	for _, s := range settings {
		modes[int(s.GetIndex())], uuids[int(s.GetIndex())] = s.GetMode(), s.GetUuid()
	}
	wants := map[int][]want{}
	for _, h := range holds {
		for _, g := range h.GetGpus() {
			if k, ok := KeyOf(g); ok {
				wants[k.GPU] = append(wants[k.GPU], want{holder: h.GetHolder(), key: k})
				if uuids[k.GPU] == "" {
					uuids[k.GPU] = g.GetUuid()
				}
			}
		}
	}
	gpus := make([]int, 0, len(modes)+len(wants))
	for i := range modes {
		gpus = append(gpus, i)
	}
	for i := range wants {
		if _, ok := modes[i]; !ok {
			gpus = append(gpus, i)
		}
	}
	sort.Ints(gpus)
	var errs []error
	refuse := func(w want, err error) {
		err = fmt.Errorf("mig: GPU %d (%s): holder %s: %w", w.key.GPU, uuids[w.key.GPU], w.holder, err)
		if res.Refused[w.holder] == nil {
			res.Refused[w.holder] = err
		}
		errs = append(errs, err)
	}
	for _, gpu := range gpus {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		mode := modes[gpu]
		if mode == "" {
			mode = api.GPUModeMIG // not set, but a hold names a slice of it
		}
		var err error
		switch mode {
		case api.GPUModeMIG:
			err = c.reconcile(gpu, wants[gpu], res, refuse)
		case api.GPUModeWhole, api.GPUModeTimeSlice:
			for _, w := range wants[gpu] {
				refuse(w, fmt.Errorf("the GPU is in mode %s, not mig: a %s slice cannot be made on it", mode, w.key.Profile))
			}
			err = c.disable(gpu)
		default:
			err = fmt.Errorf("mode %q is not whole, mig or timeslice: the GPU is left as it is", mode)
			for _, w := range wants[gpu] {
				refuse(w, err)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("mig: GPU %d (%s): %w", gpu, uuids[gpu], err))
		}
	}
	return res, errors.Join(errs...)
}

// disable destroys every instance on a GPU and disables MIG mode, where the GPU can do MIG.
func (c *Converger) disable(gpu int) error {
	st, err := c.gpus.MIGState(gpu)
	if err != nil || !st.Capable || (!st.Enabled && !st.PendingEnabled) {
		return err
	}
	for _, in := range st.Instances {
		if err := c.gpus.DestroyMIGInstance(gpu, in.GI); err != nil {
			return fmt.Errorf("destroy %s to leave MIG mode: %w", in, err)
		}
		c.log.Info("mig: destroyed an instance to leave MIG mode", "gpu", gpu, "instance", in.String())
	}
	if err := c.gpus.SetMIGMode(gpu, false); err != nil {
		return err
	}
	c.log.Info("mig: MIG mode disabled", "gpu", gpu)
	return nil
}

// reconcile enables MIG mode on a GPU and makes its instances those of wants: existing ones
// that a hold names are kept, the others destroyed, the missing made.
func (c *Converger) reconcile(gpu int, wants []want, res Result, refuse func(want, error)) error {
	st, err := c.gpus.MIGState(gpu)
	if err == nil && !st.Capable {
		err = errors.New("the GPU cannot do MIG")
	}
	if err == nil && !st.Enabled {
		if err = c.gpus.SetMIGMode(gpu, true); err == nil {
			c.log.Info("mig: MIG mode enabled", "gpu", gpu)
			st, err = c.gpus.MIGState(gpu)
		}
	}
	if err != nil {
		for _, w := range wants {
			refuse(w, fmt.Errorf("no MIG slice can be made: %w", err))
		}
		if len(wants) > 0 {
			return nil // the refusals say it, naming the GPU
		}
		return err
	}
	// The slices the holds name, each checked against what the GPU offers.
	wanted := map[Key]string{} // slice → holder
	for _, w := range wants {
		p, ok := st.Profile(w.key.Profile)
		switch {
		case !ok:
			refuse(w, fmt.Errorf("%w: the GPU has no MIG profile %q (it has %s)", hardware.ErrNoMIGProfile, w.key.Profile, st.ProfileNames()))
		case !p.CanStart(w.key.Start):
			refuse(w, fmt.Errorf("%w: %s may start at %v, not %d", hardware.ErrMIGPlacement, p.Name, p.Starts, w.key.Start))
		case wanted[w.key] != "":
			refuse(w, fmt.Errorf("%s at %d is held by %s too", w.key.Profile, w.key.Start, wanted[w.key]))
		default:
			wanted[w.key] = w.holder
		}
	}
	// Orphans first: what they free may be what a new slice needs.
	var errs []error
	have := map[Key]hardware.MIGInstance{}
	for _, in := range st.Instances {
		k := Key{GPU: gpu, Profile: in.Profile, Start: in.Start}
		if _, ok := wanted[k]; ok && in.Usable() {
			if _, dup := have[k]; !dup {
				have[k] = in
				continue
			}
		}
		if err := c.gpus.DestroyMIGInstance(gpu, in.GI); err != nil {
			errs = append(errs, fmt.Errorf("destroy %s, which no hold names: %w", in, err))
			continue
		}
		c.log.Info("mig: destroyed an instance no hold names", "gpu", gpu, "instance", in.String(), "computeInstances", in.ComputeInstances)
	}
	keys := make([]Key, 0, len(wanted))
	for k := range wanted {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(a, b int) bool { return keys[a].Start < keys[b].Start })
	for _, k := range keys {
		if in, ok := have[k]; ok {
			res.Devices[k] = in
			continue
		}
		in, err := c.gpus.CreateMIGInstance(gpu, k.Profile, k.Start)
		if err != nil {
			refuse(want{holder: wanted[k], key: k}, fmt.Errorf("make %s at %d: %w", k.Profile, k.Start, err))
			continue
		}
		c.log.Info("mig: made a MIG slice", "gpu", gpu, "holder", wanted[k], "instance", in.String(), "uuid", in.UUID)
		res.Devices[k] = in
	}
	return errors.Join(errs...)
}
