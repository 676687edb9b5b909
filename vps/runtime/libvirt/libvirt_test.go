package libvirt_test

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/vps/internal/vmtest"
	"github.com/better-compute/compute/vps/runtime"
	"github.com/better-compute/compute/vps/runtime/libvirt"
)

// console reads a VM's serial console line by line.
type console struct {
	t     *testing.T
	path  string
	conn  net.Conn
	lines chan string
}

func attach(t *testing.T, path string) *console {
	t.Helper()
	c := &console{t: t, path: path}
	c.reattach()
	t.Cleanup(func() { c.conn.Close() })
	return c
}

// reattach connects again: a restored VM is a new QEMU process with a new socket.
func (c *console) reattach() {
	c.t.Helper()
	if c.conn != nil {
		c.conn.Close()
	}
	var err error
	computetest.Eventually(c.t, 10*time.Second, "the console's socket "+c.path+" answers", func() bool { // QEMU binds it as it starts
		c.conn, err = net.Dial("unix", c.path)
		return err == nil
	})
	lines := make(chan string, 4096)
	c.lines = lines
	go func(conn net.Conn) {
		defer close(lines)
		sc := bufio.NewScanner(conn)
		for sc.Scan() {
			lines <- strings.TrimSpace(sc.Text())
		}
	}(c.conn)
}

// expect waits for a line matching re and returns its submatches.
func (c *console) expect(re string, within time.Duration) []string {
	c.t.Helper()
	rx := regexp.MustCompile(re)
	timeout := time.After(within)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				c.t.Fatalf("the console closed waiting for %q", re)
			}
			if m := rx.FindStringSubmatch(l); m != nil {
				return m
			}
		case <-timeout:
			c.t.Fatalf("no console line matching %q within %s", re, within)
		}
	}
}

// quiet waits until the console has said nothing for d, as a paused VM's does. A line the guest
// wrote just before the pause may still come; a guest that runs on ticks every second, and fails
// the test at its third line.
func (c *console) quiet(d time.Duration) {
	c.t.Helper()
	var said []string
	for {
		silence := time.NewTimer(d) // the behaviour under test: d without a line
		select {
		case l, ok := <-c.lines:
			silence.Stop()
			if !ok {
				c.t.Fatal("the console closed")
			}
			if said = append(said, l); len(said) > 2 {
				c.t.Fatalf("the console talks on while the VM is paused: %q", said)
			}
		case <-silence.C:
			return
		}
	}
}

func (c *console) tick(within time.Duration) int {
	c.t.Helper()
	n, _ := strconv.Atoi(c.expect(`bc-guest: tick (\d+)`, within)[1])
	return n
}

// TestLibvirtRunsPausesSavesAndRestoresAVM drives a real libvirtd (session mode, private socket)
// and a real VM under TCG, booted from Debian's kernel and the project's initramfs: start,
// pause (its console falls silent), resume, save with memory and restore (it counts on from where
// it was saved), reset, stop, delete; every call twice does the work once.
func TestLibvirtRunsPausesSavesAndRestoresAVM(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("boots a VM")
	}
	h := vmtest.Libvirtd(t)
	kernel, initrd := vmtest.Kernel(t, h), vmtest.Initramfs(t, h)
	r, err := libvirt.New(libvirt.Options{Socket: h.Socket, URI: "qemu:///session", DomainType: "qemu",
		StateDir: filepath.Join(h.Dir, "state"), FileOwner: h.Owner()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	in := runtime.Instance{ID: "0190a0b0-0000-7000-8000-00000000000a", VCPUs: 1, MemoryMiB: 192, Kernel: kernel, Initrd: initrd,
		Cmdline: "console=ttyS0 quiet no_timer_check", Power: runtime.PowerRunning, Console: filepath.Join(h.Dir, "state", "consoles", "a.sock")}

	st, err := r.Ensure(ctx, in)
	if err != nil || st.State != runtime.StateRunning {
		t.Fatalf("Ensure running: %+v, %v", st, err)
	}
	if st, err := r.Ensure(ctx, in); err != nil || st.State != runtime.StateRunning {
		t.Fatalf("Ensure running again: %+v, %v", st, err)
	}
	con := attach(t, in.Console)
	con.expect(`bc-guest: up|bc-guest: tick`, 90*time.Second)
	con.tick(30 * time.Second)
	list, err := r.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != in.ID || list[0].State != runtime.StateRunning {
		t.Fatalf("List = %+v, %v", list, err)
	}

	// Paused: not a line; resumed: it counts on.
	in.Power = runtime.PowerPaused
	if st, err := r.Ensure(ctx, in); err != nil || st.State != runtime.StatePaused {
		t.Fatalf("Ensure paused: %+v, %v", st, err)
	}
	for len(con.lines) > 0 { // what it said before, not yet read
		<-con.lines
	}
	con.quiet(2 * time.Second)
	in.Power = runtime.PowerRunning
	if st, err := r.Ensure(ctx, in); err != nil || st.State != runtime.StateRunning {
		t.Fatalf("Ensure resumed: %+v, %v", st, err)
	}
	con.tick(30 * time.Second)

	// Saved with its memory: it goes on running; restored, it counts on from the save.
	saved := filepath.Join(h.Dir, "state", "snapshots", "s1")
	atSave := con.tick(30 * time.Second)
	if err := r.Save(ctx, in.ID, saved); err != nil {
		t.Fatalf("Save: %v", err)
	}
	con.reattach()
	later := con.tick(60 * time.Second)
	for later < atSave+3 {
		later = con.tick(30 * time.Second)
	}
	if st, err := r.Restore(ctx, saved, in); err != nil || st.State != runtime.StateRunning {
		t.Fatalf("Restore: %+v, %v", st, err)
	}
	con.reattach()
	if got := con.tick(60 * time.Second); got <= atSave || got >= later {
		t.Fatalf("after the restore the guest counted %d: want past %d (the save) and before %d (since)", got, atSave, later)
	}

	// A reset boots it again: it counts from one.
	if err := r.Reboot(ctx, in.ID); err != nil {
		t.Fatal(err)
	}
	con.expect(`bc-guest: up`, 90*time.Second)

	// Stopped, then deleted: gone, with its files; a second delete is no error.
	in.Power = runtime.PowerStopped
	if st, err := r.Ensure(ctx, in); err != nil || st.State != runtime.StateStopped {
		t.Fatalf("Ensure stopped: %+v, %v", st, err)
	}
	if err := r.Delete(ctx, in.ID); err != nil {
		t.Fatal(err)
	}
	if err := r.Delete(ctx, in.ID); err != nil {
		t.Fatalf("a second Delete: %v", err)
	}
	if list, err := r.List(ctx); err != nil || len(list) != 0 {
		t.Fatalf("List after Delete = %+v, %v", list, err)
	}
	if err := r.Reboot(ctx, in.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Reboot of a deleted instance: %v", err)
	}
}

// TestLibvirtDisksAndRefusals: an instance with a disk gets its own copy-on-write overlay of the
// image (the image stays as it was), its saved state carries the disk, and what cannot be a
// machine (an image that names a host file, a disk of no format among them) is refused before
// libvirt sees it.
func TestLibvirtDisksAndRefusals(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs libvirtd")
	}
	h := vmtest.Libvirtd(t)
	kernel, initrd := vmtest.Kernel(t, h), vmtest.Initramfs(t, h)
	state := filepath.Join(h.Dir, "state")
	r, err := libvirt.New(libvirt.Options{Socket: h.Socket, URI: "qemu:///session", DomainType: "qemu", StateDir: state, FileOwner: h.Owner()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	image := filepath.Join(h.Dir, "image.raw")
	if err := os.WriteFile(image, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	in := runtime.Instance{ID: "0190a0b0-0000-7000-8000-00000000000b", VCPUs: 1, MemoryMiB: 160, Kernel: kernel, Initrd: initrd,
		Cmdline: "console=ttyS0 quiet no_timer_check", Disk: image, DiskFormat: runtime.FormatRaw, DiskGiB: 2, Power: runtime.PowerPaused, Console: filepath.Join(state, "consoles", "b.sock")}
	if st, err := r.Ensure(ctx, in); err != nil || st.State != runtime.StatePaused {
		t.Fatalf("Ensure paused from nothing: %+v, %v", st, err)
	}
	overlay := filepath.Join(state, in.ID, "disk.qcow2")
	if fi, err := os.Stat(overlay); err != nil || fi.Size() == 0 {
		t.Fatalf("the instance's disk: %v", err)
	}
	// The flavor's 2 GiB, over an image of 1 MiB.
	if out, err := exec.Command("qemu-img", "info", "-U", "--output=json", overlay).Output(); err != nil || !strings.Contains(string(out), `"virtual-size": 2147483648`) {
		t.Fatalf("the instance's disk is not 2 GiB: %v\n%s", err, out)
	}
	saved := filepath.Join(state, "snapshots", "b1")
	if err := r.Save(ctx, in.ID, saved); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(saved + ".disk"); err != nil {
		t.Fatalf("the saved state has no disk: %v", err)
	}
	if list, _ := r.List(ctx); len(list) != 1 || list[0].State != runtime.StatePaused {
		t.Fatalf("after Save the instance is %+v, want paused as it was", list)
	}
	if err := r.Delete(ctx, in.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(overlay); !os.IsNotExist(err) {
		t.Fatalf("the disk outlived its instance: %v", err)
	}
	// A qcow2 image backed by a host file: refused before libvirt sees it.
	backed := filepath.Join(h.Dir, "backed.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-b", image, "-F", "raw", backed, "1M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v\n%s", err, out)
	}
	for _, bad := range []runtime.Instance{
		{ID: "x", VCPUs: 1, MemoryMiB: 128, Kernel: kernel, Disk: backed, DiskFormat: runtime.FormatQcow2, Power: runtime.PowerRunning},
		{ID: "x", VCPUs: 1, MemoryMiB: 128, Kernel: kernel, Disk: image, Power: runtime.PowerRunning},
		{ID: "x", VCPUs: 0, MemoryMiB: 128, Kernel: kernel, Power: runtime.PowerRunning},
		{ID: "x", VCPUs: 1, MemoryMiB: 128, Power: runtime.PowerRunning},
		{ID: "x", VCPUs: 1, MemoryMiB: 128, Kernel: kernel, Power: "on"},
		{ID: "../x", VCPUs: 1, MemoryMiB: 128, Kernel: kernel, Power: runtime.PowerRunning},
		{ID: "x", VCPUs: 1, MemoryMiB: 128, Kernel: kernel, Power: runtime.PowerRunning, GPUs: []string{"GPU-1234"}},
	} {
		if _, err := r.Ensure(ctx, bad); err == nil {
			t.Errorf("Ensure(%+v) was not refused", bad)
		}
	}
	if list, _ := r.List(ctx); len(list) != 0 {
		t.Fatalf("a refused instance was defined: %+v", list)
	}
	for _, o := range []libvirt.Options{{StateDir: "relative"}, {StateDir: state, DomainType: "xen"}, {StateDir: state, URI: "xen:///"}, {StateDir: state, FileOwner: "nobody"}} {
		if _, err := libvirt.New(o); err == nil {
			t.Errorf("New(%+v) was not refused", o)
		}
	}
}
