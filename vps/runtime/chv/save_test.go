package chv

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/better-compute/compute/vps/runtime"
)

// savedFiles are the files of a saved state: cloud-hypervisor's snapshot, the runtime's record
// and the disk's copy.
var savedFiles = []string{"bc-record.json", "config.json", "disk.qcow2", "memory-ranges", "state.json"}

func lsDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// TestSaveAndRestore: Save snapshots a running VM by pausing it (cloud-hypervisor snapshots
// only a paused VM) and resumes it; a paused one stays paused. The state holds the snapshot and
// the disk as it was. Restore replaces the VM by the saved one, disk included, and leaves it in
// the asked power state, also on a host where the instance was deleted.
func TestSaveAndRestore(t *testing.T) {
	t.Parallel()
	needQemuUtils(t)
	h := newHarness(t)
	ctx := context.Background()
	in := h.instance("a")
	in.Disk = rawImage(t, h.base, 0xAA)
	h.ensure(in, runtime.StateRunning)
	disk := h.r.files("a").disk
	if err := qemuIO(t, disk, "write -P 0x11 0 64k"); err != nil {
		t.Fatal(err)
	}

	saved := filepath.Join(h.base, "saves", "one")
	if err := os.MkdirAll(filepath.Dir(saved), 0o755); err != nil {
		t.Fatal(err)
	}
	m := h.mark("a")
	if err := h.r.Save(ctx, "a", saved); err != nil {
		t.Fatal(err)
	}
	h.expectOps("a", m, "PUT vm.pause", "PUT vm.snapshot", "PUT vm.resume")
	if got := lsDir(t, saved); !slices.Equal(got, savedFiles) {
		t.Fatalf("the saved state holds %v; want %v", got, savedFiles)
	}
	if got := lsDir(t, filepath.Dir(saved)); !slices.Equal(got, []string{"one"}) {
		t.Fatalf("beside the saved state: %v", got)
	}
	if st := h.r.status(ctx, h.r.files("a"), "a"); st.State != runtime.StateRunning {
		t.Fatalf("after Save: %+v; want running", st)
	}
	greets(t, in.Console, "a")

	// The guest writes on; Restore takes the disk back to the saved one.
	if err := qemuIO(t, disk, "write -P 0x22 0 64k"); err != nil {
		t.Fatal(err)
	}
	for _, power := range []string{runtime.PowerRunning, runtime.PowerPaused, runtime.PowerStopped} {
		in.Power = power
		m := h.mark("a")
		st, err := h.r.Restore(ctx, saved, in)
		if err != nil || st.State != power {
			t.Fatalf("Restore %s: %+v, %v", power, st, err)
		}
		want := []string{"PUT vm.delete", "PUT vm.restore"}
		switch power {
		case runtime.PowerRunning:
			want = append(want, "PUT vm.resume")
		case runtime.PowerStopped:
			want = append(want, "PUT vm.shutdown")
		}
		if power == runtime.PowerRunning || power == runtime.PowerPaused {
			// A stopped VM's VMM holds a created VM: it is deleted all the same.
			greets(t, in.Console, "a")
		}
		h.expectOps("a", m, want...)
		if err := qemuIO(t, disk, "read -P 0x11 0 64k"); err != nil {
			t.Fatalf("the disk after Restore %s: %v", power, err)
		}
		if err := qemuIO(t, disk, "write -P 0x33 0 64k"); err != nil {
			t.Fatal(err)
		}
	}

	// Paused: Save leaves it paused; a second Save replaces the first whole.
	in.Power = runtime.PowerPaused
	h.ensure(in, runtime.StatePaused)
	m = h.mark("a")
	if err := h.r.Save(ctx, "a", saved); err != nil {
		t.Fatal(err)
	}
	h.expectOps("a", m, "PUT vm.snapshot")
	if st := h.r.status(ctx, h.r.files("a"), "a"); st.State != runtime.StatePaused {
		t.Fatalf("after Save of a paused VM: %+v", st)
	}
	if got := lsDir(t, filepath.Dir(saved)); !slices.Equal(got, []string{"one"}) {
		t.Fatalf("beside the saved state after a second Save: %v", got)
	}

	// On a host that no longer has the instance.
	if err := h.r.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	h.gone("a", in.Console)
	in.Power = runtime.PowerRunning
	if st, err := h.r.Restore(ctx, saved, in); err != nil || st.State != runtime.StateRunning {
		t.Fatalf("Restore of a deleted instance: %+v, %v", st, err)
	}
	if err := qemuIO(t, disk, "read -P 0x33 0 64k"); err != nil {
		t.Fatalf("the disk restored on a host without the instance: %v", err)
	}
	greets(t, in.Console, "a")
	if list, err := h.r.List(ctx); err != nil || len(list) != 1 || list[0].State != runtime.StateRunning {
		t.Fatalf("List after Restore = %+v, %v", list, err)
	}
}

// TestSaveAndRestoreRefusals: Save of a stopped or missing instance, Restore of a state that is
// not one, or is another instance's, are refused, saying why; a snapshot that fails resumes
// the VM and leaves no partial state; a Restore that fails for a new instance leaves nothing.
func TestSaveAndRestoreRefusals(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	in := h.instance("a")
	h.ensure(in, runtime.StateRunning)
	saves := filepath.Join(h.base, "saves")
	if err := os.MkdirAll(saves, 0o755); err != nil {
		t.Fatal(err)
	}
	saved := filepath.Join(saves, "a")
	if err := h.r.Save(ctx, "a", saved); err != nil {
		t.Fatal(err)
	}

	if err := h.r.Save(ctx, "a", "relative/path"); err == nil || !strings.Contains(err.Error(), "not an absolute path") {
		t.Fatalf("Save to a relative path: %v", err)
	}
	if err := h.r.Save(ctx, "nope", filepath.Join(saves, "x")); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Save of a missing instance: %v", err)
	}
	b := h.instance("b")
	b.Power = runtime.PowerStopped
	h.ensure(b, runtime.StateStopped)
	if err := h.r.Save(ctx, "b", filepath.Join(saves, "b")); err == nil || !strings.Contains(err.Error(), "is stopped") {
		t.Fatalf("Save of a stopped instance: %v", err)
	}
	if _, err := h.r.Restore(ctx, saved, b); err == nil || !strings.Contains(err.Error(), "is the saved state of instance a") {
		t.Fatalf("Restore of a's state as b: %v", err)
	}
	if _, err := h.r.Restore(ctx, saves, in); err == nil || !strings.Contains(err.Error(), "is not a state saved by this runtime") {
		t.Fatalf("Restore of a directory that is no saved state: %v", err)
	}
	moved := in
	moved.Console = filepath.Join(h.base, "elsewhere.sock")
	if _, err := h.r.Restore(ctx, saved, moved); err == nil || !strings.Contains(err.Error(), "serves its console on") {
		t.Fatalf("Restore with another console: %v", err)
	}

	// A snapshot that fails: the VM runs on, and the old state is kept.
	h.fakeFails("vm.snapshot=500")
	c := h.instance("c")
	h.ensure(c, runtime.StateRunning)
	m := h.mark("c")
	if err := h.r.Save(ctx, "c", filepath.Join(saves, "c")); err == nil || !strings.Contains(err.Error(), "PUT vm.snapshot: 500") {
		t.Fatalf("Save with a failing snapshot: %v", err)
	}
	h.expectOps("c", m, "PUT vm.pause", "PUT vm.snapshot", "PUT vm.resume")
	if st := h.r.status(ctx, h.r.files("c"), "c"); st.State != runtime.StateRunning {
		t.Fatalf("after a failed Save: %+v", st)
	}
	if got := lsDir(t, saves); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("the saves after a failed Save: %v", got)
	}

	// A restore that fails for an instance the host does not have leaves nothing of it.
	h.fakeFails("vm.restore=500")
	if err := h.r.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.r.Restore(ctx, saved, in); err == nil || !strings.Contains(err.Error(), "PUT vm.restore: 500") {
		t.Fatalf("Restore with a failing VMM: %v", err)
	}
	h.gone("a", in.Console)
}
