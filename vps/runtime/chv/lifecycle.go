package chv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/better-compute/compute/vps/runtime"
)

// List returns the instances that have a directory and a record in StateDir, with the state
// their VMM reports. An instance whose VMM is gone is stopped; one whose VMM does not answer, or
// answers nonsense, is StateError with the reason.
func (r *Runtime) List(ctx context.Context) ([]runtime.Status, error) {
	entries, err := os.ReadDir(r.opts.StateDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("chv: listing VMs: %w", err)
	}
	var out []runtime.Status
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), runtime.Name("")) {
			continue
		}
		id := strings.TrimPrefix(e.Name(), runtime.Name(""))
		if r.checkID(id) != nil {
			continue
		}
		v := r.files(id)
		rec, err := readRecord(v.record)
		if errors.Is(err, os.ErrNotExist) {
			continue // not a VM of this runtime
		}
		if err == nil && rec.ID != id {
			err = fmt.Errorf("chv: %s holds the record of instance %q", v.dir, rec.ID)
		}
		if err != nil {
			out = append(out, runtime.Status{ID: id, State: runtime.StateError, Detail: err.Error()})
			continue
		}
		unlock := r.lock(id)
		out = append(out, r.status(ctx, v, id))
		unlock()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Reboot restarts a running instance (vm.reboot: the VMM stops the VM and boots it again).
func (r *Runtime) Reboot(ctx context.Context, id string) error {
	if err := r.checkID(id); err != nil {
		return err
	}
	defer r.lock(id)()
	c, state, err := r.running(ctx, id)
	if err != nil {
		return err
	}
	if state != vmRunning {
		return fmt.Errorf("chv: instance %s is %s, not running (cloud-hypervisor: %s): only a running instance reboots", id, stateWord(state), state)
	}
	return c.put(ctx, "vm.reboot")
}

// stateWord says a VM state of the API in the runtime's words.
func stateWord(state string) string {
	switch state {
	case vmRunning:
		return runtime.StateRunning
	case vmPaused:
		return runtime.StatePaused
	case vmCreated, vmShutdown:
		return runtime.StateStopped
	case vmBreakPoint:
		return "at a debugger's breakpoint"
	}
	return "in the unknown state " + state
}

// running returns a client of the instance's VMM and its VM's state, for the calls that need a
// VM that runs. It starts nothing.
func (r *Runtime) running(ctx context.Context, id string) (*client, string, error) {
	v := r.files(id)
	if ok, err := exists(v); err != nil {
		return nil, "", fmt.Errorf("chv: %w", err)
	} else if !ok {
		return nil, "", notFound(id)
	}
	pid, st := r.probe(ctx, v)
	switch st {
	case vmmGone:
		return nil, "", fmt.Errorf("chv: instance %s is stopped (no cloud-hypervisor runs for it)", id)
	case vmmUnresponsive:
		return nil, "", fmt.Errorf("chv: instance %s: cloud-hypervisor (pid %d) does not answer on %s", id, pid, v.socket)
	}
	c := r.client(v)
	info, err := c.info(ctx)
	if notCreated(err) {
		return nil, "", fmt.Errorf("chv: instance %s is stopped (its VMM holds no VM)", id)
	}
	if err != nil {
		return nil, "", err
	}
	return c, info.State, nil
}

// Delete stops the instance's VM and VMM (vm.delete, vmm.shutdown, then SIGTERM and SIGKILL if
// it lingers or does not answer), removes its taps and its serial socket, and its directory.
func (r *Runtime) Delete(ctx context.Context, id string) error {
	if err := r.checkID(id); err != nil {
		return err
	}
	defer r.lock(id)()
	return r.remove(ctx, id)
}

// remove is Delete, with the instance locked.
func (r *Runtime) remove(ctx context.Context, id string) error {
	v := r.files(id)
	if ok, err := exists(v); err != nil {
		return fmt.Errorf("chv: %w", err)
	} else if !ok {
		return nil
	}
	rec, recErr := readRecord(v.record)
	if recErr != nil && !errors.Is(recErr, os.ErrNotExist) {
		return recErr
	}
	if err := r.stopVMM(ctx, v); err != nil {
		return err
	}
	for _, t := range rec.Taps {
		if err := r.opts.Taps.Delete(ctx, t.Name); err != nil {
			return err
		}
	}
	if err := removeSocket(rec.Config.Serial.Socket); err != nil {
		return err
	}
	if err := os.RemoveAll(v.dir); err != nil {
		return fmt.Errorf("chv: removing %s: %w", v.dir, err)
	}
	return nil
}

// stopVMM ends the VM's VMM, if one runs: politely through the API, then by signals.
func (r *Runtime) stopVMM(ctx context.Context, v vmFiles) error {
	pid, st := r.probe(ctx, v)
	if st == vmmAnswering {
		c := r.client(v)
		// vm.delete shuts the VM down; vmm.shutdown ends the process, which may close the
		// connection before it answers, so its error says nothing: the wait below decides.
		_ = c.put(ctx, "vm.delete")
		_ = c.put(ctx, "vmm.shutdown")
		if pid == 0 {
			return nil // a VMM that started elsewhere and tells no pid: its socket is all there is
		}
		if r.waitExit(ctx, pid, r.opts.StopTimeout) {
			return nil
		}
	}
	if pid == 0 {
		return nil
	}
	return r.kill(ctx, pid)
}
