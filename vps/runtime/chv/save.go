package chv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/better-compute/compute/vps/runtime"
)

// Save writes the instance's state to the directory path (cloud-hypervisor's snapshot:
// config.json, state.json, memory-ranges; a copy of the instance's disk, disk.qcow2; and the
// runtime's record), replacing what was there. A running VM is paused for the snapshot and the
// disk's copy (the VMM snapshots only a paused VM) and resumed after, even when they failed. The snapshot is written to path+".partial" and renamed, so path
// holds either the previous state or the new one whole.
func (r *Runtime) Save(ctx context.Context, id, path string) (err error) {
	if err := r.checkID(id); err != nil {
		return err
	}
	if !filepath.IsAbs(path) {
		return fmt.Errorf("chv: save of %s: %q is not an absolute path", id, path)
	}
	path = filepath.Clean(path)
	defer r.lock(id)()
	c, state, err := r.running(ctx, id)
	if err != nil {
		return err
	}
	switch state {
	case vmRunning:
		if err := c.put(ctx, "vm.pause"); err != nil {
			return err
		}
		defer func() {
			rctx, cancel := detached(ctx, r.opts.StopTimeout)
			defer cancel()
			if rerr := c.put(rctx, "vm.resume"); rerr != nil {
				err = errors.Join(err, fmt.Errorf("chv: %s stays paused after its save: %w", id, rerr))
			}
		}()
	case vmPaused:
	default:
		return fmt.Errorf("chv: instance %s is %s (cloud-hypervisor: %s): only a running or paused instance can be saved", id, stateWord(state), state)
	}
	v := r.files(id)
	rec, err := readRecord(v.record)
	if err != nil {
		return err
	}
	tmp := path + ".partial"
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("chv: %w", err)
	}
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return fmt.Errorf("chv: %w", err)
	}
	if err := c.snapshot(ctx, tmp); err != nil {
		_ = os.RemoveAll(tmp)
		return err
	}
	// The disk as the memory knows it: copied while the VM is paused.
	if _, err := os.Stat(v.disk); err == nil {
		if err := r.copyDisk(ctx, v.disk, filepath.Join(tmp, savedDiskFile)); err != nil {
			_ = os.RemoveAll(tmp)
			return fmt.Errorf("chv: save of %s: copying its disk: %w", id, err)
		}
	}
	if err := writeRecord(filepath.Join(tmp, savedRecordFile), rec); err != nil {
		_ = os.RemoveAll(tmp)
		return err
	}
	return replaceDir(tmp, path)
}

// replaceDir moves the directory from to to, removing what was at to.
func replaceDir(from, to string) error {
	old := to + ".old"
	if err := os.RemoveAll(old); err != nil {
		return fmt.Errorf("chv: %w", err)
	}
	if err := os.Rename(to, old); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("chv: %w", err)
	}
	if err := os.Rename(from, to); err != nil {
		return fmt.Errorf("chv: %w", err)
	}
	if err := os.RemoveAll(old); err != nil {
		return fmt.Errorf("chv: %w", err)
	}
	return nil
}

// Restore makes in from the state Save wrote to path: it replaces the instance's VM, if it has
// one, by the saved one (vm.restore, which leaves it paused), its disk by the saved copy, then
// puts it in in's power state.
// The VM is the saved one, shape and devices included: the saved configuration names the
// instance's console socket and taps, so a state restores only as the instance that saved it.
func (r *Runtime) Restore(ctx context.Context, path string, in runtime.Instance) (runtime.Status, error) {
	if err := r.checkInstance(in); err != nil {
		return runtime.Status{}, err
	}
	if !filepath.IsAbs(path) {
		return runtime.Status{}, fmt.Errorf("chv: restore of %s: %q is not an absolute path", in.ID, path)
	}
	path = filepath.Clean(path)
	saved, err := readRecord(filepath.Join(path, savedRecordFile))
	if err != nil {
		return runtime.Status{}, fmt.Errorf("chv: restore of %s: %s is not a state saved by this runtime: %w", in.ID, path, err)
	}
	if saved.ID != in.ID {
		return runtime.Status{}, fmt.Errorf("chv: restore of %s: %s is the saved state of instance %s; "+
			"a state restores only as the instance that saved it", in.ID, path, saved.ID)
	}
	if saved.Config.Serial.Socket != in.Console {
		return runtime.Status{}, fmt.Errorf("chv: restore of %s: the saved state serves its console on %q, not on Console %q",
			in.ID, saved.Config.Serial.Socket, in.Console)
	}
	if len(saved.Taps) != len(in.NICs) {
		return runtime.Status{}, fmt.Errorf("chv: restore of %s: the saved state has %d NICs, the instance %d",
			in.ID, len(saved.Taps), len(in.NICs))
	}
	for i, n := range in.NICs { // the host side may have moved: the taps follow in
		saved.Taps[i].Bridge, saved.Taps[i].VLAN = n.Bridge, n.VLAN
	}

	defer r.lock(in.ID)()
	v := r.files(in.ID)
	fresh, err := isFresh(v)
	if err != nil {
		return runtime.Status{}, err
	}
	st, err := r.restore(ctx, path, in, v, saved)
	if err != nil && fresh {
		err = r.undo(ctx, in.ID, err)
	}
	return st, err
}

// restore is Restore, with the instance locked.
func (r *Runtime) restore(ctx context.Context, path string, in runtime.Instance, v vmFiles, saved record) (runtime.Status, error) {
	if err := makeDirs(v, in); err != nil {
		return runtime.Status{}, err
	}
	cur, err := readRecord(v.record)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return runtime.Status{}, err
	}
	if errors.Is(err, os.ErrNotExist) {
		cur = saved
	}
	if err := writeRecord(v.record, saved); err != nil {
		return runtime.Status{}, err
	}
	c, err := r.vmm(ctx, v, cur)
	if err != nil {
		return runtime.Status{}, err
	}
	if _, err := c.info(ctx); err == nil {
		if err := c.put(ctx, "vm.delete"); err != nil { // vm.restore needs a VMM without a VM
			return runtime.Status{}, err
		}
	} else if !notCreated(err) {
		return runtime.Status{}, err
	}
	if err := r.ensureTaps(ctx, saved.Taps); err != nil {
		return runtime.Status{}, err
	}
	for _, t := range cur.Taps[min(len(saved.Taps), len(cur.Taps)):] { // names are by position
		if err := r.opts.Taps.Delete(ctx, t.Name); err != nil {
			return runtime.Status{}, err
		}
	}
	if err := removeConsoles(cur, saved.Config); err != nil {
		return runtime.Status{}, err
	}
	if _, err := os.Stat(filepath.Join(path, savedDiskFile)); err == nil { // the VM is gone: its disk is free
		if err := r.copyDisk(ctx, filepath.Join(path, savedDiskFile), v.disk); err != nil {
			return runtime.Status{}, fmt.Errorf("chv: restore of %s: its disk: %w", in.ID, err)
		}
	}
	if err := c.restore(ctx, path); err != nil {
		return runtime.Status{}, err
	}
	if err := r.power(ctx, c, saved, vmPaused, in.Power); err != nil {
		return runtime.Status{}, err
	}
	return r.status(ctx, v, in.ID), nil
}
