package chv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/vps/runtime"
)

// TestEnsureRunsPausesAndStops drives one instance through every power state against the fake
// cloud-hypervisor: each change is the one API call cloud-hypervisor needs, asking twice does
// nothing more, the VM is created as the instance says, its console greets while it runs, and
// its socket goes when it stops.
func TestEnsureRunsPausesAndStops(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	in := h.instance("a")
	h.ensure(in, runtime.StateRunning)
	h.expectOps("a", 0, "start", "PUT vm.create", "PUT vm.boot")

	var cfg vmConfig
	if err := json.Unmarshal(h.requests("a", "vm.create")[0].Body, &cfg); err != nil {
		t.Fatal(err)
	}
	tap := tapName("a", 0)
	want := vmConfig{
		CPUs:    cpusConfig{BootVCPUs: 2, MaxVCPUs: 2},
		Memory:  memoryConfig{Size: 256 << 20},
		Payload: payloadConfig{Kernel: h.kernel, Cmdline: "console=ttyS0"},
		Net:     []netConfig{{Tap: tap, MAC: "52:54:00:ab:cd:01", ID: "net0"}},
		Serial:  consoleConfig{Mode: "Socket", Socket: in.Console},
		Console: consoleConfig{Mode: "Off"},
	}
	if d := cmp.Diff(want, cfg); d != "" {
		t.Fatalf("vm.create's config (-want +got):\n%s", d)
	}
	if got, ok := h.taps.get(tap); !ok || got != (Tap{Name: tap, Bridge: "br0", VLAN: 7}) {
		t.Fatalf("tap = %+v, %v; want %s on br0, VLAN 7", got, ok, tap)
	}
	greets(t, in.Console, "a")

	steps := []struct {
		power, state string
		ops          []string
	}{
		{runtime.PowerRunning, runtime.StateRunning, nil},
		{runtime.PowerPaused, runtime.StatePaused, []string{"PUT vm.pause"}},
		{runtime.PowerPaused, runtime.StatePaused, nil},
		{runtime.PowerRunning, runtime.StateRunning, []string{"PUT vm.resume"}},
		{runtime.PowerStopped, runtime.StateStopped, []string{"PUT vm.shutdown"}},
		{runtime.PowerStopped, runtime.StateStopped, nil},
		{runtime.PowerPaused, runtime.StatePaused, []string{"PUT vm.boot", "PUT vm.pause"}},
		{runtime.PowerStopped, runtime.StateStopped, []string{"PUT vm.shutdown"}},
		{runtime.PowerRunning, runtime.StateRunning, []string{"PUT vm.boot"}},
	}
	for _, s := range steps {
		m := h.mark("a")
		in.Power = s.power
		h.ensure(in, s.state)
		h.expectOps("a", m, s.ops...)
		list, err := h.r.List(context.Background())
		if err != nil || len(list) != 1 || list[0] != (runtime.Status{ID: "a", State: s.state}) {
			t.Fatalf("List after Ensure %s = %+v, %v", s.power, list, err)
		}
		if s.state == runtime.StateStopped {
			// cloud-hypervisor removes the serial socket when the VM shuts down.
			if _, err := os.Lstat(in.Console); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the console socket of a stopped VM: %v", err)
			}
		}
	}
	greets(t, in.Console, "a")
	if n := strings.Count(strings.Join(h.ops("a", 0), ","), "start"); n != 1 {
		t.Fatalf("%d VMMs started for one instance", n)
	}
}

// TestEnsureNewInstanceInEachPowerState: an instance asked paused boots and pauses; one asked
// stopped is created and not booted, and a VMM holds it.
func TestEnsureNewInstanceInEachPowerState(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	p := h.instance("p")
	p.Power = runtime.PowerPaused
	h.ensure(p, runtime.StatePaused)
	h.expectOps("p", 0, "start", "PUT vm.create", "PUT vm.boot", "PUT vm.pause")
	s := h.instance("s")
	s.Power = runtime.PowerStopped
	h.ensure(s, runtime.StateStopped)
	h.expectOps("s", 0, "start", "PUT vm.create")
	h.ensure(s, runtime.StateStopped)
	h.expectOps("s", 0, "start", "PUT vm.create")
}

// TestEnsureAppliesANewShapeAtTheNextStart: a running VM keeps its shape until it stops; a
// stopped one is created again with the new shape. A VM created and never booted still holds
// its console socket in cloud-hypervisor after vm.delete, so the runtime must remove it before
// the VM is created again (this failed with "address already in use" before).
func TestEnsureAppliesANewShapeAtTheNextStart(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	in := h.instance("a")
	in.Power = runtime.PowerStopped
	h.ensure(in, runtime.StateStopped)

	in.VCPUs = 4
	m := h.mark("a")
	h.ensure(in, runtime.StateStopped)
	h.expectOps("a", m, "PUT vm.delete", "PUT vm.create")
	in.Power = runtime.PowerRunning
	h.ensure(in, runtime.StateRunning)
	greets(t, in.Console, "a")

	// Running: the new shape waits for the next start.
	in.MemoryMiB = 512
	m = h.mark("a")
	h.ensure(in, runtime.StateRunning)
	h.expectOps("a", m)
	in.Power = runtime.PowerStopped
	h.ensure(in, runtime.StateStopped)
	in.Power = runtime.PowerRunning
	h.ensure(in, runtime.StateRunning)
	h.expectOps("a", m, "PUT vm.shutdown", "PUT vm.delete", "PUT vm.create", "PUT vm.boot")
	creates := h.requests("a", "vm.create")
	var cfg vmConfig
	if err := json.Unmarshal(creates[len(creates)-1].Body, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.CPUs.BootVCPUs != 4 || cfg.Memory.Size != 512<<20 {
		t.Fatalf("the VM was created again with %+v, %+v; want 4 vCPUs and 512 MiB", cfg.CPUs, cfg.Memory)
	}
	greets(t, in.Console, "a")
}

// TestListReturnsOnlyItsOwnVMs: directories that are not the runtime's VMs are left out; one
// whose record names another instance is listed in error; a VMM that runs and does not answer
// is in error, with its pid.
func TestListReturnsOnlyItsOwnVMs(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.ensure(h.instance("a"), runtime.StateRunning)
	b := h.instance("b")
	b.Power = runtime.PowerStopped
	h.ensure(b, runtime.StateStopped)
	for _, d := range []string{"not-ours", "bc-norecord", "bc-bad id"} {
		if err := os.MkdirAll(filepath.Join(h.stateDir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(h.stateDir, "bc-file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(h.stateDir, "bc-x")
	if err := os.MkdirAll(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeRecord(filepath.Join(other, "record.json"), record{ID: "y"}); err != nil {
		t.Fatal(err)
	}
	list, err := h.r.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []runtime.Status{{ID: "a", State: runtime.StateRunning}, {ID: "b", State: runtime.StateStopped},
		{ID: "x", State: runtime.StateError, Detail: `chv: ` + other + ` holds the record of instance "y"`}}
	if d := cmp.Diff(want, list); d != "" {
		t.Fatalf("List (-want +got):\n%s", d)
	}
	if err := os.RemoveAll(other); err != nil {
		t.Fatal(err)
	}
}

// TestReboot: a running instance reboots with vm.reboot and serves its console again; a paused
// or stopped one is refused, saying why; a missing one is runtime.ErrNotFound.
func TestReboot(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	in := h.instance("a")
	h.ensure(in, runtime.StateRunning)
	m := h.mark("a")
	if err := h.r.Reboot(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	h.expectOps("a", m, "PUT vm.reboot")
	greets(t, in.Console, "a")
	for power, want := range map[string]string{runtime.PowerPaused: "is paused, not running", runtime.PowerStopped: "is stopped, not running"} {
		in.Power = power
		h.ensure(in, power)
		m := h.mark("a")
		if err := h.r.Reboot(ctx, "a"); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Reboot of a %s instance: %v; want an error saying %q", power, err, want)
		}
		h.expectOps("a", m)
	}
	if err := h.r.Reboot(ctx, "nope"); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Reboot of a missing instance: %v; want ErrNotFound", err)
	}
	if err := h.r.Reboot(ctx, "../etc"); err == nil || !strings.Contains(err.Error(), `instance id "../etc"`) {
		t.Fatalf("Reboot of a bad id: %v", err)
	}
}

// TestDeleteRemovesEverything: Delete ends the VMM (politely: vm.delete, vmm.shutdown), and
// removes the taps, the console socket and the VM's directory; deleting again, or deleting an
// instance that never was, is not an error. A VMM that does not answer is killed.
func TestDeleteRemovesEverything(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	in := h.instance("a")
	h.ensure(in, runtime.StateRunning)
	pid := h.vmmPID("a")
	m := h.mark("a")
	if err := h.r.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	h.expectOps("a", m, "PUT vm.delete", "PUT vmm.shutdown")
	h.gone("a", in.Console)
	if alive(pid) {
		t.Fatalf("VMM %d still runs", pid)
	}
	for _, id := range []string{"a", "never"} {
		if err := h.r.Delete(ctx, id); err != nil {
			t.Fatalf("Delete of %s, which does not exist: %v", id, err)
		}
	}
	if list, err := h.r.List(ctx); err != nil || len(list) != 0 {
		t.Fatalf("List after Delete = %+v, %v", list, err)
	}

	// A created, never booted VM leaves its console socket behind when its VMM exits.
	s := h.instance("s")
	s.Power = runtime.PowerStopped
	h.ensure(s, runtime.StateStopped)
	if err := h.r.Delete(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	h.gone("s", s.Console)

	// A VMM that stops answering: Delete kills it.
	h.ensure(h.instance("hung"), runtime.StateRunning)
	pid = h.vmmPID("hung")
	stopProcess(t, pid)
	list, err := h.r.List(ctx)
	if err != nil || len(list) != 1 || list[0].State != runtime.StateError || !strings.Contains(list[0].Detail, "does not answer") {
		t.Fatalf("List with a stopped VMM = %+v, %v; want it in error", list, err)
	}
	start := time.Now()
	if err := h.r.Delete(ctx, "hung"); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited > 15*time.Second {
		t.Fatalf("Delete of a hung VMM took %v", waited)
	}
	h.gone("hung", "")
}

// TestRestartedRuntimeFindsItsVMMs: the VMMs outlive the Runtime that started them; a new one
// over the same StateDir lists them, converges them without starting new ones, and deletes
// them.
func TestRestartedRuntimeFindsItsVMMs(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	a, b := h.instance("a"), h.instance("b")
	b.Power = runtime.PowerPaused
	h.ensure(a, runtime.StateRunning)
	h.ensure(b, runtime.StatePaused)
	pa := h.vmmPID("a")

	h.r = h.newRuntime()
	list, err := h.r.List(ctx)
	want := []runtime.Status{{ID: "a", State: runtime.StateRunning}, {ID: "b", State: runtime.StatePaused}}
	if err != nil || !cmp.Equal(list, want) {
		t.Fatalf("List of a new Runtime = %+v, %v; want %+v", list, err, want)
	}
	ma, mb := h.mark("a"), h.mark("b")
	h.ensure(a, runtime.StateRunning)
	h.ensure(b, runtime.StatePaused)
	h.expectOps("a", ma)
	h.expectOps("b", mb)
	b.Power = runtime.PowerRunning
	h.ensure(b, runtime.StateRunning)
	h.expectOps("b", mb, "PUT vm.resume")
	greets(t, a.Console, "a")
	if err := h.r.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if !waitGone(pa, 5*time.Second) {
		t.Fatalf("the first Runtime's VMM %d outlived the second's Delete", pa)
	}
}

// TestGuestPowerOff: a guest that powers off ends its VMM, and the instance is stopped until
// it is asked to run, when a new VMM boots it; with --no-shutdown the VMM stays with the VM
// created, and boots it again.
func TestGuestPowerOff(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	in := h.instance("a")
	h.ensure(in, runtime.StateRunning)
	first := h.vmmPID("a")
	if err := syscall.Kill(first, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	if !waitGone(first, 5*time.Second) {
		t.Fatal("the VMM stayed after its guest powered off")
	}
	list, err := h.r.List(context.Background())
	if err != nil || len(list) != 1 || list[0].State != runtime.StateStopped || !strings.Contains(list[0].Detail, "no cloud-hypervisor runs") {
		t.Fatalf("List after a power-off = %+v, %v", list, err)
	}
	m := h.mark("a")
	h.ensure(in, runtime.StateRunning)
	h.expectOps("a", m, "start", "PUT vm.create", "PUT vm.boot")
	greets(t, in.Console, "a")

	h2 := newHarness(t, func(o *Options) { o.Args = []string{"--no-shutdown"} })
	in2 := h2.instance("b")
	h2.ensure(in2, runtime.StateRunning)
	pid := h2.vmmPID("b")
	if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, 5*time.Second, "b stopped after a power-off with --no-shutdown", func() bool {
		return h2.r.status(context.Background(), h2.r.files("b"), "b").State == runtime.StateStopped
	})
	m = h2.mark("b")
	h2.ensure(in2, runtime.StateRunning)
	h2.expectOps("b", m, "PUT vm.boot")
	if h2.vmmPID("b") != pid || !alive(pid) {
		t.Fatal("a new VMM was started though the old one stayed")
	}
	greets(t, in2.Console, "b")
}

// TestInstanceLocksSerializeAndAreForgotten: calls for one instance run one at a time, calls
// for others do not wait for them, and once no call holds or waits for an instance's lock the
// runtime keeps nothing of it (it once kept a mutex for every instance it ever saw).
func TestInstanceLocksSerializeAndAreForgotten(t *testing.T) {
	t.Parallel()
	r := &Runtime{locks: map[string]*instanceLock{}}
	var inside, most atomic.Int32
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			defer r.lock(fmt.Sprintf("i-%d", i%4))()
			if i%4 != 0 {
				return
			}
			n := inside.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(time.Millisecond) // the behaviour under test: a call that holds its lock a while, so that another let in would be seen inside
			inside.Add(-1)
		})
	}
	unlock := r.lock("other") // held throughout: instance i-0's calls must not wait for it
	wg.Wait()
	if most.Load() != 1 {
		t.Errorf("%d calls for one instance ran at once", most.Load())
	}
	if len(r.locks) != 1 {
		t.Errorf("locks kept for %d instances, want only the held one's", len(r.locks))
	}
	unlock()
	if len(r.locks) != 0 {
		t.Errorf("locks kept after every call returned: %v", r.locks)
	}
}
