//go:build linux

package hostnet_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/better-compute/compute/internal/lib/initramfs"
	"github.com/better-compute/compute/internal/lib/initramfs/initramfstest"
)

// The VLAN tests need a kernel with 802.1Q. Where the test's own kernel lacks it (a microVM's,
// say), TestVLANTestsInAVM runs them in QEMU on Debian's kernel, with this very test binary,
// built statically, as the VM's init.

// vlanTests are the tests that need 802.1Q.
var vlanTests = []string{"TestEnsureMakesAVLANSegmentOnce", "TestRemoveLeavesASegmentInUse", "TestAGuestOnAVLANBridgeReachesTheVLAN"}

// vmModules are what the VLAN tests make links of, loaded by the VM's init (with their
// dependencies: llc, stp, garp, mrp).
var vmModules = []string{"8021q", "bridge", "veth"}

// TestMain runs the tests; as PID 1 it is the init of TestVLANTestsInAVM's VM.
func TestMain(m *testing.M) {
	if os.Getpid() == 1 {
		vmInit(m)
	}
	os.Exit(m.Run())
}

// vmInit mounts what the tests use, loads the modules the ramdisk carries, runs the tests the
// kernel command line names (after "--"), says how they ended, and powers the VM off.
func vmInit(m *testing.M) {
	for _, mnt := range []struct{ src, dir, fs string }{{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"}} {
		if err := unix.Mount(mnt.src, mnt.dir, mnt.fs, 0, ""); err != nil {
			fmt.Printf("hostnet-vm: mount %s: %v\n", mnt.dir, err)
		}
	}
	if b, err := os.ReadFile("/" + initramfs.ModuleListPath); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			path := strings.TrimSpace(sc.Text())
			if path == "" || strings.HasPrefix(path, "#") {
				continue
			}
			f, err := os.Open(path)
			if err == nil {
				err = unix.FinitModule(int(f.Fd()), "", 0)
				f.Close()
			}
			if err != nil && !errors.Is(err, unix.EEXIST) {
				fmt.Printf("hostnet-vm: load %s: %v\n", path, err)
			}
		}
	}
	code := m.Run()
	fmt.Printf("hostnet-vm: exit %d\n", code)
	os.Stdout.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	select {} // PID 1 must not exit: the kernel would panic
}

// TestVLANTestsInAVM runs the VLAN tests in a VM where this kernel cannot make VLAN links. It
// skips where they ran here, with -short, or without QEMU, Debian's kernel or its modules.
func TestVLANTestsInAVM(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("the VLAN tests run as root")
	}
	_, _, h := namespace(t)
	veth(t, h, "probe0", "probe1")
	if h.LinkAdd(&netlink.Vlan{LinkAttrs: netlink.LinkAttrs{Name: "probe0.9", ParentIndex: link(t, h, "probe0").Attrs().Index}, VlanId: 9}) == nil {
		t.Skip("this kernel makes VLAN links: the VLAN tests ran here")
	}
	if testing.Short() {
		t.Skip("-short: this kernel lacks 802.1Q, and running the VLAN tests in QEMU takes a minute")
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("this kernel lacks 802.1Q, and qemu-system-x86_64 is not installed to run the VLAN tests on another (Debian qemu-system-x86; .ci/run installs it)")
	}
	kernels, _ := filepath.Glob("/boot/vmlinuz-*")
	if len(kernels) == 0 {
		t.Skip("this kernel lacks 802.1Q, and /boot has no kernel to run the VLAN tests on (Debian linux-image-amd64; .ci/run installs it)")
	}
	vmlinuz := kernels[len(kernels)-1]
	version := strings.TrimPrefix(filepath.Base(vmlinuz), "vmlinuz-")

	if _, err := initramfs.Resolve(filepath.Join(initramfs.ModulesDirDefault, version), vmModules); err != nil {
		t.Skipf("this kernel lacks 802.1Q, and no ramdisk with %s's modules can be made to run the VLAN tests on it: %v", version, err)
	}
	// This test binary, static (the ramdisk has no C library), and the ramdisk: each made once
	// per content for every test binary on the machine.
	bin := initramfstest.Build(t, initramfstest.Go{Package: "github.com/better-compute/compute/vps/hostnet", Test: true})
	rd := initramfstest.Ramdisk(t, initramfs.Options{Init: bin, KernelVersion: version, Modules: vmModules})

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmdline := "console=ttyS0 panic=-1 quiet no_timer_check -- -test.v -test.run=^(" + strings.Join(vlanTests, "|") + ")$"
	cmd := exec.CommandContext(ctx, qemu, "-machine", "q35,accel=tcg", "-m", "512", "-nographic", "-vga", "none", "-no-reboot",
		"-nic", "none", "-kernel", vmlinuz, "-initrd", rd, "-append", cmdline)
	// One writer for both, read once Run returns: exec's one copier has finished writing then.
	var console bytes.Buffer
	cmd.Stdout, cmd.Stderr = &console, &console
	cmd.WaitDelay = 10 * time.Second
	err = cmd.Run()
	out := console.String()
	if ctx.Err() != nil || err != nil {
		t.Fatalf("QEMU: %v (%v)\n%s", err, ctx.Err(), out)
	}
	if !strings.Contains(out, "hostnet-vm: exit 0") {
		t.Fatalf("the VLAN tests failed in the VM:\n%s", out)
	}
	for _, name := range vlanTests {
		if !strings.Contains(out, "--- PASS: "+name) {
			t.Errorf("%s did not pass in the VM", name)
		}
	}
	if t.Failed() {
		t.Logf("the VM's console:\n%s", out)
	} else {
		t.Logf("the VLAN tests passed on %s in QEMU", version)
	}
}
