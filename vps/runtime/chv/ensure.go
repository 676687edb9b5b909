package chv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/better-compute/compute/vps/runtime"
)

// Ensure makes in exist in its power state: it starts the VM's VMM if none runs (a new one, or
// one after a crash or after the guest powered off without --no-shutdown), creates the VM if the
// VMM holds none, recreates it with in's shape when that changed and the VM is not running, then
// boots, pauses, resumes or shuts it down.
func (r *Runtime) Ensure(ctx context.Context, in runtime.Instance) (runtime.Status, error) {
	if err := r.checkInstance(in); err != nil {
		return runtime.Status{}, err
	}
	defer r.lock(in.ID)()
	v := r.files(in.ID)
	fresh, err := isFresh(v)
	if err != nil {
		return runtime.Status{}, err
	}
	st, err := r.ensure(ctx, in, v)
	if err != nil && fresh {
		err = r.undo(ctx, in.ID, err)
	}
	return st, err
}

// isFresh reports whether the runtime has no VM of v's yet (no record).
func isFresh(v vmFiles) (bool, error) {
	_, err := os.Stat(v.record)
	if errors.Is(err, os.ErrNotExist) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("chv: %w", err)
	}
	return false, nil
}

// undo removes what a call that failed made of a new instance, so that a failure leaves nothing
// half-made: it is err, with why the undoing failed if it did. It runs even when ctx has ended.
func (r *Runtime) undo(ctx context.Context, id string, err error) error {
	if derr := r.remove(context.WithoutCancel(ctx), id); derr != nil {
		return errors.Join(err, fmt.Errorf("chv: removing what was made of instance %s: %w", id, derr))
	}
	return err
}

// ensure is Ensure, with the instance locked.
func (r *Runtime) ensure(ctx context.Context, in runtime.Instance, v vmFiles) (runtime.Status, error) {
	want, taps, err := r.vmConfig(in, v)
	if err != nil {
		return runtime.Status{}, err
	}
	if err := makeDirs(v, in); err != nil {
		return runtime.Status{}, err
	}
	if err := r.ensureDisk(ctx, in, v); err != nil {
		return runtime.Status{}, err
	}
	rec, err := readRecord(v.record)
	if errors.Is(err, os.ErrNotExist) {
		// Written before anything is started, so that what follows is found again.
		rec = record{ID: in.ID, Config: want, Taps: taps}
		if err := writeRecord(v.record, rec); err != nil {
			return runtime.Status{}, err
		}
	} else if err != nil {
		return runtime.Status{}, err
	}
	c, err := r.vmm(ctx, v, rec)
	if err != nil {
		return runtime.Status{}, err
	}
	info, err := c.info(ctx)
	switch {
	case notCreated(err):
		if err := r.create(ctx, c, v, &rec, want, taps); err != nil {
			return runtime.Status{}, err
		}
		info.State = vmCreated
	case err != nil:
		return runtime.Status{}, err
	case !sameConfig(rec.Config, want) && stopped(info.State):
		// A change of shape, applied now that the VM does not run.
		if err := c.put(ctx, "vm.delete"); err != nil {
			return runtime.Status{}, err
		}
		if err := r.create(ctx, c, v, &rec, want, taps); err != nil {
			return runtime.Status{}, err
		}
		info.State = vmCreated
	}
	if err := r.power(ctx, c, rec, info.State, in.Power); err != nil {
		return runtime.Status{}, err
	}
	return r.status(ctx, v, in.ID), nil
}

// makeDirs makes the VM's directory and the one its console socket goes in (cloud-hypervisor
// binds the socket and makes no directory).
func makeDirs(v vmFiles, in runtime.Instance) error {
	if err := os.MkdirAll(v.dir, 0o750); err != nil {
		return fmt.Errorf("chv: %w", err)
	}
	if in.Console != "" {
		if err := os.MkdirAll(filepath.Dir(in.Console), 0o755); err != nil {
			return fmt.Errorf("chv: instance %s: Console: %w", in.ID, err)
		}
	}
	return nil
}

// vmm returns a client of the VM's VMM, starting one if none runs. A VMM that runs and does not
// answer is an error: it is left for an operator (or Delete) rather than killed under a guest.
func (r *Runtime) vmm(ctx context.Context, v vmFiles, rec record) (*client, error) {
	pid, st := r.probe(ctx, v)
	switch st {
	case vmmAnswering:
		return r.client(v), nil
	case vmmUnresponsive:
		return nil, fmt.Errorf("chv: %s: cloud-hypervisor (pid %d) runs and does not answer on %s (see %s); "+
			"Delete kills it", v.name, pid, v.socket, v.log)
	}
	// The serial socket of a VMM that crashed is still there; the new VM would fail to bind it.
	if err := removeSocket(rec.Config.Serial.Socket); err != nil {
		return nil, err
	}
	return r.spawn(ctx, v)
}

// create creates the VM with cfg, after its taps, and records it. Taps the previous
// configuration had and this one has not are removed. The VMM holds no VM when it is called.
func (r *Runtime) create(ctx context.Context, c *client, v vmFiles, rec *record, cfg vmConfig, taps []Tap) error {
	if err := r.ensureTaps(ctx, taps); err != nil {
		return err
	}
	if err := removeConsoles(*rec, cfg); err != nil {
		return err
	}
	next := record{ID: rec.ID, Config: cfg, Taps: taps}
	if err := writeRecord(v.record, next); err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, t := range taps {
		keep[t.Name] = true
	}
	for _, t := range rec.Taps {
		if !keep[t.Name] {
			if err := r.opts.Taps.Delete(ctx, t.Name); err != nil {
				return err
			}
		}
	}
	*rec = next
	return c.create(ctx, cfg)
}

func (r *Runtime) ensureTaps(ctx context.Context, taps []Tap) error {
	for _, t := range taps {
		if err := r.opts.Taps.Ensure(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

// removeConsoles removes the serial sockets of a VM's configurations before a VM is created or
// restored in their VMM. cloud-hypervisor binds the socket when it creates a VM and removes it
// when the VM shuts down, so a VM created and never booted leaves its socket bound through
// vm.delete (and its VMM's exit), and binding it again would fail. No VM serves it then: the
// VMM holds none.
func removeConsoles(rec record, cfg vmConfig) error {
	if err := removeSocket(rec.Config.Serial.Socket); err != nil {
		return err
	}
	return removeSocket(cfg.Serial.Socket)
}

// stopped reports whether a VM in state does not run: created and not booted, or shut down.
func stopped(state string) bool { return state == vmCreated || state == vmShutdown }

// power takes a VM from state to the power state want.
func (r *Runtime) power(ctx context.Context, c *client, rec record, state, want string) error {
	if state == vmBreakPoint {
		return fmt.Errorf("chv: %s is stopped at a debugger's breakpoint: left as it is", c.vm)
	}
	switch want {
	case runtime.PowerRunning:
		switch {
		case stopped(state):
			return r.boot(ctx, c, rec)
		case state == vmPaused:
			return c.put(ctx, "vm.resume")
		}
	case runtime.PowerPaused:
		switch {
		case stopped(state):
			if err := r.boot(ctx, c, rec); err != nil {
				return err
			}
			return c.put(ctx, "vm.pause")
		case state == vmRunning:
			return c.put(ctx, "vm.pause")
		}
	case runtime.PowerStopped:
		if state == vmRunning || state == vmPaused {
			return c.put(ctx, "vm.shutdown")
		}
	}
	return nil
}

// boot boots a created VM, after making sure of its taps (a host reboot removes them, and the
// VMM opens them at boot).
func (r *Runtime) boot(ctx context.Context, c *client, rec record) error {
	if err := r.ensureTaps(ctx, rec.Taps); err != nil {
		return err
	}
	return c.put(ctx, "vm.boot")
}

// status is what the runtime finds of the VM; a VM it cannot read is StateError, with why.
func (r *Runtime) status(ctx context.Context, v vmFiles, id string) runtime.Status {
	pid, st := r.probe(ctx, v)
	switch st {
	case vmmGone:
		return runtime.Status{ID: id, State: runtime.StateStopped,
			Detail: "no cloud-hypervisor runs for it (its guest powered off, or it exited: see " + v.log + ")"}
	case vmmUnresponsive:
		return runtime.Status{ID: id, State: runtime.StateError,
			Detail: fmt.Sprintf("cloud-hypervisor (pid %d) does not answer on %s", pid, v.socket)}
	}
	info, err := r.client(v).info(ctx)
	switch {
	case notCreated(err):
		return runtime.Status{ID: id, State: runtime.StateStopped, Detail: "cloud-hypervisor runs and holds no VM"}
	case err != nil:
		return runtime.Status{ID: id, State: runtime.StateError, Detail: err.Error()}
	}
	switch info.State {
	case vmRunning:
		return runtime.Status{ID: id, State: runtime.StateRunning}
	case vmPaused:
		return runtime.Status{ID: id, State: runtime.StatePaused}
	case vmCreated, vmShutdown:
		return runtime.Status{ID: id, State: runtime.StateStopped}
	case vmBreakPoint:
		return runtime.Status{ID: id, State: runtime.StateError, Detail: "stopped at a debugger's breakpoint"}
	}
	return runtime.Status{ID: id, State: runtime.StateError, Detail: fmt.Sprintf("cloud-hypervisor reports the unknown state %q", info.State)}
}
