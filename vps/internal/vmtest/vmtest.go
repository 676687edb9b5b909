// Package vmtest runs what the vps tests need of a VM host, for real: a private libvirtd
// (session mode, on its own socket, as an unprivileged user when the test runs as root), Debian's
// kernel and an initramfs whose init is the project's guest (./guest). A test skips, saying
// why, where libvirtd, QEMU or the kernel are missing; .ci/run installs them.
package vmtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"

	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/lib/initramfs"
	"github.com/better-compute/compute/internal/lib/initramfs/initramfstest"
)

// Unprivileged is the user libvirtd runs as when the test runs as root: session mode refuses
// root, and a VM host's files must be readable by it.
const Unprivileged = 65534

// Host is a private libvirtd.
type Host struct {
	Socket string // its Unix socket
	Dir    string // a directory readable by it (0755), for kernels, disks and consoles
	UID    int    // the user it runs as
}

// Owner is "uid:gid" of the daemon's user, for vps/runtime/libvirt.Options.FileOwner.
func (h Host) Owner() string { return strconv.Itoa(h.UID) + ":" + strconv.Itoa(h.UID) }

// Libvirtd starts a libvirtd in session mode for the test and stops it when the test ends.
func Libvirtd(t testing.TB) Host {
	t.Helper()
	bin, err := exec.LookPath("libvirtd")
	if err != nil {
		bin = "/usr/sbin/libvirtd"
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skip("libvirtd is not installed (Debian libvirt-daemon and libvirt-daemon-driver-qemu; .ci/run installs them)")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 is not installed (Debian qemu-system-x86; .ci/run installs it)")
	}
	// Not t.TempDir(): its parent is 0700 and the daemon's user must reach this one.
	dir, err := os.MkdirTemp("", "vmtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	uid := os.Geteuid()
	if uid == 0 {
		uid = Unprivileged
	}
	home, run := filepath.Join(dir, "home"), filepath.Join(dir, "run")
	for _, d := range []string{dir, home, run} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{home, run} {
		if err := os.Chown(d, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, "--timeout", "0")
	cmd.Env = []string{"HOME=" + home, "XDG_RUNTIME_DIR=" + run, "XDG_CONFIG_HOME=" + filepath.Join(home, ".config"),
		"XDG_CACHE_HOME=" + filepath.Join(home, ".cache"), "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	var log computetest.Buffer // written by the command's output copier
	cmd.Stdout, cmd.Stderr = &log, &log
	if os.Geteuid() == 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("vmtest: start libvirtd: %v", err)
	}
	sock := filepath.Join(run, "libvirt", "libvirt-sock")
	t.Cleanup(func() {
		destroyAll(sock) // a session daemon leaves its VMs running when it goes
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("libvirtd:\n%s", log.String())
		}
	})
	// libvirtd says nothing when it is ready; it is once its socket is there (its log is shown
	// when the test fails).
	computetest.Eventually(t, 30*time.Second, "vmtest: libvirtd makes its socket "+sock, func() bool {
		_, err := os.Stat(sock)
		return err == nil
	})
	return Host{Socket: sock, Dir: dir, UID: uid}
}

// Kernel returns Debian's kernel, copied where the host's user reads it.
func Kernel(t testing.TB, h Host) string {
	t.Helper()
	files, _ := filepath.Glob("/boot/vmlinuz-*")
	if len(files) == 0 {
		t.Skip("no kernel in /boot (Debian linux-image-amd64; .ci/run installs it)")
	}
	b, err := os.ReadFile(files[len(files)-1])
	if err != nil {
		t.Skipf("the kernel cannot be read: %v", err)
	}
	p := filepath.Join(h.Dir, "vmlinuz")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// guestDevices are the device nodes of the guest's initramfs besides its init: its console and
// serial ports.
var guestDevices = []struct {
	name         string
	major, minor uint32
}{{"dev/console", 5, 1}, {"dev/ttyS0", 4, 64}, {"dev/ttyS1", 4, 65}}

// Initramfs returns an initramfs whose init is the guest (./guest), where the host's user reads
// it. The guest and the initramfs are built once per content for every test binary on the
// machine (initramfstest's cache), and copied for the host: the cache is the test user's.
func Initramfs(t testing.TB, h Host) string {
	t.Helper()
	init := initramfstest.Build(t, initramfstest.Go{Package: "github.com/better-compute/compute/vps/internal/vmtest/guest"})
	guest, err := os.ReadFile(init)
	if err != nil {
		t.Fatal(err)
	}
	key := initramfstest.Key("vmtest-initrd", fmt.Sprint(guestDevices), string(guest)) // what it is made of
	ramdisk := initramfstest.File(t, "vmtest-initrd.gz", key, func(path string) error {
		var a initramfs.Archive
		if err := a.AddFile("init", 0o755, guest); err != nil {
			return err
		}
		for _, d := range guestDevices {
			if err := a.AddCharDev(d.name, 0o600, d.major, d.minor); err != nil {
				return err
			}
		}
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		if _, err := a.WriteTo(f); err != nil { // gzip-compressed newc
			f.Close()
			return err
		}
		return f.Close()
	})
	b, err := os.ReadFile(ramdisk)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(h.Dir, "initrd.gz")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// destroyAll stops every domain of the daemon at sock.
func destroyAll(sock string) {
	lv := golibvirt.NewWithDialer(dialers.NewLocal(dialers.WithSocket(sock), dialers.WithLocalTimeout(2*time.Second)))
	if err := lv.ConnectToURI(golibvirt.QEMUSession); err != nil {
		return
	}
	defer lv.Disconnect()
	doms, _, _ := lv.ConnectListAllDomains(1, 0)
	for _, d := range doms {
		_ = lv.DomainDestroy(d)
	}
}
